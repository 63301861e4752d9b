"""AWS CDK (v2) infrastructure of Coworker: the stack and its constructs."""
