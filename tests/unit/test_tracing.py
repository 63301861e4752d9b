"""The tracer: X-Ray on Lambda, and outside it (the local runtime's processes) off without the
X-Ray SDK loaded, which cost each worker and API process about 0.4 s of CPU to start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[2] / "layers" / "coworker" / "python"
PROBE = """
import json, sys
from coworker.observability import tracer

@tracer.capture_method
def add(x):
    return x + 1

print(json.dumps({"provider": type(tracer.provider).__module__, "disabled": bool(tracer.disabled),
                  "xray_loaded": "aws_xray_sdk.core" in sys.modules, "ran": add(1)}))
"""


def _probe(**env: str) -> dict:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("LAMBDA_TASK_ROOT", "AWS_SAM_LOCAL", "POWERTOOLS_TRACE_DISABLED")}
    environ.update(env, PYTHONPATH=str(LIBRARY), AWS_XRAY_CONTEXT_MISSING="IGNORE_ERROR")
    out = subprocess.run([sys.executable, "-c", PROBE], env=environ, capture_output=True, text=True, timeout=120,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_outside_lambda_the_tracer_is_off_and_the_xray_sdk_is_not_loaded():
    seen = _probe()
    assert seen == {"provider": "coworker.observability", "disabled": True, "xray_loaded": False, "ran": 2}


def test_on_lambda_the_tracer_records_with_xray():
    seen = _probe(LAMBDA_TASK_ROOT="/var/task")
    assert seen["provider"].startswith("aws_xray_sdk") and seen["disabled"] is False and seen["ran"] == 2


def test_trace_disabled_on_lambda_is_honoured_without_the_sdk():
    seen = _probe(LAMBDA_TASK_ROOT="/var/task", POWERTOOLS_TRACE_DISABLED="true")
    assert seen["disabled"] is True and seen["xray_loaded"] is False
