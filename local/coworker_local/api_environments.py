"""The API's execution environments: the API Lambda's handler in processes of its own, so the
local API answers requests side by side, as Lambda runs each concurrent request in an execution
environment of its own.

======================  ===================================================================
Lambda                  here
======================  ===================================================================
execution environment   a ``python -m coworker_local.api_environments`` process, reused by
                        later requests (warm) and started when none is free (cold start)
concurrency             at most ``max_environments`` requests run at once; more wait for a
                        free environment, as API Gateway's calls would wait on a throttle
init phase              the handler module is imported before the child says it is ready
timeout                 API Gateway's 29 s: the environment is killed and the client gets 504
a crash                 502, as API Gateway answers a failed integration; the next request
                        gets a new environment
======================  ===================================================================

Protocol (JSON lines, see :mod:`coworker_local.environments`)::

    child  -> parent  {"ready": <pid>}                     once, after importing the handler
    parent -> child   {"event": {...}, "request_id": "..."}
    child  -> parent  {"result": {...}}  or  {"error": "..."}   (the handler raised)

:class:`ApiEnvironmentPool` has the handler's signature, so :class:`~coworker_local.gateway.LocalGateway`
calls it as it would call the handler in its own process.
"""

from __future__ import annotations

import collections
import importlib
import importlib.util
import json
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from coworker_local.environments import (
    INIT_TIMEOUT_SECONDS,
    Environment,
    child_environment,
    reply_channel,
    terminate_with_parent,
)

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
# The API Lambda's handler, named as the stack names it (module path, then function).
API_HANDLER = "coworker_cdk.functions.api.handler.handler"
# API Gateway's integration limit (the stack's API_TIMEOUT_SECONDS).
API_TIMEOUT_SECONDS = 29.0
# Requests handled at once by default: two cores gain nothing from more.
DEFAULT_MAX_ENVIRONMENTS = 4
# What API Gateway answers when the integration does not answer in time.
TIMED_OUT = {"statusCode": 504, "headers": {"Content-Type": "application/json"},
             "body": json.dumps({"message": "Endpoint request timed out"})}


class IntegrationFailed(RuntimeError):
    """The handler raised or its environment died: API Gateway answers 502."""


class ApiStartError(RuntimeError):
    """No environment started with the pool finished its init phase (the log says why)."""


def load_handler(name: str = API_HANDLER) -> Any:
    """The function ``name`` (``package.module.function``), imported as Lambda would.

    The API's handler reads its settings from the environment at import, like on Lambda, so call
    this once the settings are in ``os.environ``.
    """
    module_name, _, function = name.rpartition(".")
    top = module_name.partition(".")[0]
    if importlib.util.find_spec(top) is None and (REPO_ROOT / "cdk" / top).is_dir():
        sys.path.append(str(REPO_ROOT / "cdk"))  # a checkout run without installing the CDK app
    return getattr(importlib.import_module(module_name), function)


class ApiEnvironmentPool:
    """Calls a Lambda handler in up to ``max_environments`` processes at once."""

    def __init__(
        self,
        environ: Mapping[str, str],
        handler: str = API_HANDLER,
        max_environments: int = DEFAULT_MAX_ENVIRONMENTS,
        timeout_seconds: float = API_TIMEOUT_SECONDS,
        log: IO[Any] | int | None = None,
        python: str = sys.executable,
        prewarm: int = 1,
    ) -> None:
        if max_environments < 1:
            raise ValueError("an API needs at least one execution environment")
        self._environ = child_environment(environ)
        self._command = [python, "-m", "coworker_local.api_environments", handler]
        self.max_environments = max_environments
        self.timeout_seconds = timeout_seconds
        self._log = sys.stderr if log is None else log
        self._cond = threading.Condition()
        self._idle: list[Environment] = []
        self._starting = 0  # environments in their init phase
        self._busy: dict[int, Environment] = {}
        self._stopping = False
        self.counts: collections.Counter[str] = collections.Counter()
        self._prewarmed = threading.Event()
        prewarm = min(prewarm, max_environments)
        if prewarm:
            with self._cond:
                self._starting += prewarm
            threading.Thread(target=self._prewarm, args=(prewarm,), name="api-prewarm", daemon=True).start()
        else:
            self._prewarmed.set()

    def _prewarm(self, count: int) -> None:
        starting = [Environment(self._command, self._environ, self._log) for _ in range(count)]
        deadline = time.monotonic() + INIT_TIMEOUT_SECONDS
        for environment in starting:
            ready = environment.wait_ready(deadline)
            self._started(environment if ready else None, "prewarmed")
        self._prewarmed.set()

    def wait_prewarmed(self, timeout: float = INIT_TIMEOUT_SECONDS) -> None:
        """Wait until the environments started with the pool are ready; :class:`ApiStartError` if
        none is (its import failed, or it did not start within ``timeout``)."""
        if not self._prewarmed.wait(timeout):
            raise ApiStartError(f"the API's process did not start within {timeout:.0f} s")
        with self._cond:
            failed = self.counts["init-failed"] and not self.counts["prewarmed"]
        if failed:
            raise ApiStartError("the API's process failed to start: it could not import its handler")

    def _started(self, environment: Environment | None, how: str) -> None:
        """A prewarmed environment's init phase ended: keep it idle (``None``: it failed)."""
        with self._cond:
            self._starting -= 1
            self.counts[how if environment is not None else "init-failed"] += 1
            if environment is not None and not self._stopping:
                self._idle.append(environment)
                environment = None
            self._cond.notify_all()
        if environment is not None:  # started while the pool stopped
            environment.close(wait=1.0)

    def _take(self) -> Environment:
        """An idle environment; else a new one (a cold start) if fewer than the most exist; else
        wait for one to be free."""
        with self._cond:
            while True:
                if self._stopping:
                    raise IntegrationFailed("the local API is stopping")
                while self._idle:
                    environment = self._idle.pop()
                    if environment.alive():
                        self._busy[environment.pid] = environment
                        return environment
                    self.counts["crashed"] += 1  # died while idle
                if len(self._busy) + self._starting < self.max_environments:
                    self._starting += 1
                    break
                self._cond.wait()
        environment = Environment(self._command, self._environ, self._log)
        ready = environment.wait_ready(time.monotonic() + INIT_TIMEOUT_SECONDS)
        with self._cond:
            self._starting -= 1
            self.counts["cold_starts" if ready else "init-failed"] += 1
            if ready:
                self._busy[environment.pid] = environment
            self._cond.notify_all()
        if not ready:
            raise IntegrationFailed("the API's environment did not start (its log says why)")
        return environment

    def _give_back(self, environment: Environment, keep: bool) -> None:
        """Make ``environment`` free again, or end it (it timed out, died, or the pool stops)."""
        with self._cond:
            self._busy.pop(environment.pid, None)
            keep = keep and not self._stopping
            if keep:
                self._idle.append(environment)
            self._cond.notify_all()
        if not keep:
            environment.signal(signal.SIGKILL)
            environment.close(wait=0.5)

    def __call__(self, event: dict[str, Any], context: Any) -> Mapping[str, Any]:
        """Run ``event`` in a free environment: the handler's result, :data:`TIMED_OUT` after
        ``timeout_seconds``, :class:`IntegrationFailed` if the handler raised or its process died."""
        environment = self._take()
        self._count("requests")
        reply: dict[str, Any] | None = None
        try:
            environment.send({"event": event, "request_id": getattr(context, "aws_request_id", None)})
            reply = environment.read_reply(time.monotonic() + self.timeout_seconds)
        except TimeoutError:
            self._count("timed-out")
            return TIMED_OUT
        except OSError:
            pass  # its pipe broke: it died
        finally:
            self._give_back(environment, keep=reply is not None)
        if reply is None:
            self._count("crashed")
            raise IntegrationFailed(f"the API's environment (pid {environment.pid}) died")
        if "error" in reply:
            self._count("errors")
            raise IntegrationFailed(reply["error"])
        result: Mapping[str, Any] = reply["result"]
        return result

    def _count(self, name: str) -> None:
        with self._cond:  # requests end in threads of their own
            self.counts[name] += 1

    def stats(self) -> dict[str, Any]:
        """Environments idle, busy and starting, and counts of requests and their ends."""
        with self._cond:
            return {"max_environments": self.max_environments, "idle": len(self._idle),
                    "busy": len(self._busy), "starting": self._starting,
                    "pids": sorted([e.pid for e in self._idle] + list(self._busy)), **self.counts}

    def shutdown(self, grace_seconds: float = 5.0) -> None:
        """Refuse new requests, let those running end for ``grace_seconds``, then end every environment."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            end = time.monotonic() + grace_seconds
            while self._busy and (remaining := end - time.monotonic()) > 0:
                self._cond.wait(remaining)
            idle, self._idle = self._idle, []
            busy = list(self._busy.values())
        for environment in busy:
            environment.signal(signal.SIGKILL)
        for environment in idle:
            environment.end_input()  # EOF to all first, so they exit together
        for environment in [*idle, *busy]:
            environment.close()


def child_main(handler_name: str) -> None:
    """Entry point of an API environment: answer events read from stdin until EOF."""
    replies = reply_channel()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runtime stops its environments itself
    warnings.filterwarnings("ignore", message="No application metrics to publish")
    terminate_with_parent()

    from coworker.observability import invocation_scope

    from coworker_local.gateway import LocalLambdaContext

    handler = load_handler(handler_name)
    replies.write(json.dumps({"ready": os.getpid()}) + "\n")
    for line in sys.stdin:
        message = json.loads(line)
        context = LocalLambdaContext(timeout_seconds=API_TIMEOUT_SECONDS)
        if message.get("request_id"):
            context.aws_request_id = message["request_id"]
        try:
            with invocation_scope():
                reply: dict[str, Any] = {"result": handler(message["event"], context)}
        except Exception as error:  # noqa: BLE001 - as on Lambda: the request fails, the process lives
            traceback.print_exc()
            reply = {"error": f"{type(error).__name__}: {error}"}
        replies.write(json.dumps(reply, default=str) + "\n")


if __name__ == "__main__":
    child_main(sys.argv[1] if len(sys.argv) > 1 else API_HANDLER)
