"""One construct per concern of the Coworker stack."""
