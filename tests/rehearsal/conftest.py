"""The deploy rehearsal tier: the synthesized stack's grants and environments held against what
each function's code does. It synthesizes the stack with the infrastructure tier's fixtures."""

from tests.infra.conftest import functions_dir, synthesize  # noqa: F401  (shared fixtures)
