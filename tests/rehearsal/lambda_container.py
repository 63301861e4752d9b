"""One warm Lambda execution environment, run as its own process (the rehearsal's stand-in for
Lambda's Python runtime).

Started with the function's code folder as the working directory and ``PYTHONPATH`` set as
Lambda sets it (the code, then the layer's ``python/``), it imports the handler module once
(the module's start-up runs then, as on a cold start) and then runs one event per line of
standard input. Each answer is one JSON line on the file descriptor named by
``REHEARSAL_RESULT_FD``; the function's own output (logs, metrics) goes to stdout and stderr.
Only the standard library is used here, so nothing of the test suite is on the function's path.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
import uuid


class Context:
    """The attributes of Lambda's context object that handlers and Powertools read."""

    def __init__(self, function_name: str, timeout_ms: int, memory_mb: int) -> None:
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:000000000000:function:{function_name}"
        self.memory_limit_in_mb = memory_mb
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "rehearsal"
        self._deadline = time.monotonic() + timeout_ms / 1000

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def main() -> None:
    answers = os.fdopen(int(os.environ["REHEARSAL_RESULT_FD"]), "w", buffering=1)
    module_name, _, function_name = os.environ["REHEARSAL_HANDLER"].rpartition(".")
    sys.path[0] = os.getcwd()  # the code folder first, as /var/task is on Lambda (not this file's folder)
    try:
        handler = getattr(importlib.import_module(module_name), function_name)
    except BaseException as error:  # noqa: BLE001 - an init error is the answer
        answers.write(json.dumps({"init_error": f"{type(error).__name__}: {error}",
                                  "trace": traceback.format_exc()}) + "\n")
        return
    imported = {name: getattr(sys.modules.get(name), "__file__", None) for name in ("coworker", module_name)}
    code = os.getcwd() + os.sep
    from_code = sorted(name for name, module in list(sys.modules.items())
                       if "." not in name and (getattr(module, "__file__", None) or "").startswith(code))
    answers.write(json.dumps({"ready": True, "files": imported, "from_code": from_code}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        context = Context(os.environ["AWS_LAMBDA_FUNCTION_NAME"], request["timeout_ms"],
                          int(os.environ["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"]))
        try:
            answer = {"result": handler(request["event"], context)}
        except Exception as error:  # noqa: BLE001 - a function error is the answer
            answer = {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()}
        answers.write(json.dumps(answer, default=str) + "\n")


if __name__ == "__main__":
    main()
