#!/usr/bin/env python3
"""CDK app of Coworker: `npx cdk synth` / `npx cdk deploy` (see docs/deploy.md)."""

from __future__ import annotations

import sys
from pathlib import Path

# The infra code imports the library's table layout (coworker.data.layout) and settings.
sys.path.insert(0, str(Path(__file__).resolve().parent / "layers" / "coworker" / "python"))

from aws_cdk import App, Validations  # noqa: E402
from cdk_nag import AwsSolutionsChecks  # noqa: E402

from infra.stack import CoworkerStack  # noqa: E402

app = App()
CoworkerStack(app)
# Best-practice checks run on every synth; an unacknowledged finding fails it.
Validations.of(app).add_plugins(AwsSolutionsChecks(app))
app.synth()
