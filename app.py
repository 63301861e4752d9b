#!/usr/bin/env python3
"""CDK app of Coworker: `npx cdk synth` / `npx cdk deploy` (see docs/deploy.md)."""

from __future__ import annotations

import sys
from pathlib import Path

# This checkout's construct (cdk/coworker_cdk) and the library it deploys (which it imports for the
# table layout and the settings). An app of your own installs both instead: docs/deploy.md.
_ROOT = Path(__file__).resolve().parent
sys.path[:0] = [str(_ROOT / "cdk"), str(_ROOT / "layers" / "coworker" / "python")]

from aws_cdk import App, Validations  # noqa: E402
from cdk_nag import AwsSolutionsChecks  # noqa: E402
from coworker_cdk.stack import CoworkerStack  # noqa: E402

app = App()
CoworkerStack(app)
# Best-practice checks run on every synth; an unacknowledged finding fails it.
Validations.of(app).add_plugins(AwsSolutionsChecks(app))
app.synth()
