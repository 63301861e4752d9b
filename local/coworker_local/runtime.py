"""The local runtime: every part of the deployed system, on one machine.

==================  ==========================================================================
on AWS              here
==================  ==========================================================================
DynamoDB table      DynamoDB Local (or moto, ``--db moto``), see :mod:`coworker_local.database`;
                    the table created from :mod:`coworker.data.layout` (or any endpoint you name)
API Gateway + API   :class:`~coworker_local.gateway.LocalGateway` calling the API Lambda handler in
                    :class:`~coworker_local.api_environments.ApiEnvironmentPool`'s processes,
                    several requests side by side
EventBridge rule +  :class:`CoordinatorTimer`: the coordinator's ``dispatch.Supervisor``, ticking
coordinator         every ``tick_seconds`` on a fixed cadence, run again whenever a run ends
Lambda Invoke API   :class:`~coworker_local.lambda_service.LocalLambdaService`: what the API
                    (dispatch on submit) and the coordinator call, through boto3, to start workers
worker Lambda       :class:`~coworker_local.workers.ProcessWorkerPool`: one process per
                    invocation, killed at the timeout, at most one per worker slot
ECS Fargate runner  :class:`~coworker_local.runners.ProcessRunnerLauncher`: one process per
                    container runner the coordinator starts, at most one per runner slot
CloudWatch          the web dashboard at ``/dashboard`` and the log file
==================  ==========================================================================
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import re
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from coworker.bootstrap import configure
from coworker.config import Settings
from coworker.engine import dispatch, handlers, runners, timing
from coworker.engine.handlers import handler_package
from coworker.errors import ConfigurationError
from coworker.observability import invocation_scope, logger, metrics

from coworker_local import migration
from coworker_local.api_environments import DEFAULT_MAX_ENVIRONMENTS, ApiEnvironmentPool
from coworker_local.console import TableConsole
from coworker_local.database import FAKE_CREDENTIALS, EmbeddedDatabase, create_table, start_database
from coworker_local.gateway import LocalGateway
from coworker_local.lambda_service import LocalLambdaService
from coworker_local.runners import ProcessRunnerLauncher
from coworker_local.workers import ProcessWorkerPool

# Local defaults differ from Lambda's where a laptop run wants quicker feedback: a tick every
# second, the backlog counted every 2 s, a shorter worker timeout, lock and backoff (a killed
# worker's task runs again within about 10 s), and fewer tasks in flight (two cores).
# Environment variables and flags override them.
LOCAL_DEFAULTS: dict[str, Any] = {
    "tick_seconds": 1.0,
    "max_concurrency": 60,
    "batch_size": 10,
    "worker_timeout_seconds": 30,
    "lock_seconds": 10,
    "reservation_seconds": 10,
    "backoff_base_seconds": 2.0,
    "backoff_max_seconds": 30.0,
    "backlog_seconds": 2.0,  # the dashboard's backlog figures refresh with it
    "control_cache_seconds": 1.0,  # a pause from the dashboard takes effect within a second
    "max_runners": 2,  # container runners: a process each
    "runner_start_seconds": 30,  # a runner process starts in seconds, not a Fargate minute
    "runner_stop_seconds": 10,  # Ctrl-C gives running handlers this long
}

# Environment variables a worker process inherits besides the settings (credentials and region
# for boto3, Powertools switches, and what Python itself needs).
PASSED_THROUGH = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")


def local_settings(environ: dict[str, str] | None = None, **overrides: Any) -> Settings:
    """Settings for a local run: flags (``overrides``) > environment > local defaults > defaults."""
    environ = dict(os.environ if environ is None else environ)
    for name, value in LOCAL_DEFAULTS.items():
        environ.setdefault(Settings.model_fields[name].alias or name, str(value))
    return Settings.from_env(environ, **{k: v for k, v in overrides.items() if v is not None})


# The dashboard's count of finished tasks (a table scan, on a thread of its own): a request waits
# this long for a count under way, and a new scan waits this many times the last one's duration.
FINISHED_COUNT_WAIT_SECONDS = 1.0
FINISHED_SCAN_PAUSE_FACTOR = 4.0
# Where a local run looks for your handlers package when ``--handlers`` is not given: this
# variable, else a ``handlers/`` folder in the current directory (the stack's default too).
HANDLERS_DIR_VARIABLE = "COWORKER_HANDLERS_DIR"
DEFAULT_HANDLERS_DIR = "handlers"


# ``--env`` names: what a shell takes; the runtime's own (settings, credentials, Powertools) are not.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Variables of this shell that every worker and API process gets (credentials, Powertools switches).
PASSED_PREFIXES = ("AWS_", "POWERTOOLS_")
RESERVED_ENV_PREFIXES = ("COWORKER_", *PASSED_PREFIXES)


def function_environment(entries: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """``--env`` entries as variables: ``NAME=VALUE``, or ``NAME`` for ``environ``'s value.
    :class:`ConfigurationError` for a name that is not one, is not set, or is a setting's."""
    variables: dict[str, str] = {}
    for entry in entries:
        name, given, value = entry.partition("=")
        if not ENV_NAME.fullmatch(name):
            raise ConfigurationError(f"--env {entry}: {name!r} is not an environment variable name "
                                     "(letters, digits and _, not starting with a digit)")
        if name.startswith(RESERVED_ENV_PREFIXES):
            raise ConfigurationError(f"--env {entry}: {name} is set by the runtime; give a setting with "
                                     "its flag or its environment variable")
        if not given:
            if name not in environ:
                raise ConfigurationError(f"--env {name}: {name} is not set in this shell; give NAME=VALUE")
            value = environ[name]
        variables[name] = value
    return variables


def default_handlers_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """``COWORKER_HANDLERS_DIR``, else ``./handlers`` if it is a folder, else None."""
    named = (os.environ if environ is None else environ).get(HANDLERS_DIR_VARIABLE)
    if named:
        return Path(named)
    folder = Path.cwd() / DEFAULT_HANDLERS_DIR
    return folder if folder.is_dir() else None


def with_handlers_package(settings: Settings, handlers: Path | None) -> tuple[Settings, Path | None]:
    """Settings that also import the handlers package at ``handlers``, and the folder to put on
    the path (raises ConfigurationError when ``handlers`` is not an importable package)."""
    if handlers is None:
        return settings, None
    parent, name = handler_package(handlers)
    modules = ",".join(dict.fromkeys(filter(None, [*settings.handler_modules.split(","), name])))
    return settings.model_copy(update={"handler_modules": modules}), parent


def default_max_invocations(settings: Settings) -> int:
    """Worker concurrency: one invocation per worker slot, as the deployed reserved concurrency."""
    return settings.worker_slots


@dataclasses.dataclass
class TickRecord:
    at: float
    report: dispatch.TickReport | None
    error: str | None = None


class CoordinatorTimer:
    """Stands in for the EventBridge rule and the coordinator Lambda: a supervisor run that ticks
    every ``tick_seconds`` on a fixed cadence, started again if it ends (it lost its lease)."""

    def __init__(self, settings: Settings, invoker: dispatch.Invoker,
                 launcher: runners.Launcher | None = None) -> None:
        self._settings = settings
        self._invoker = invoker
        self._launcher = launcher
        self.interval = settings.tick_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.history: collections.deque[TickRecord] = collections.deque(maxlen=120)  # the latest ticks
        self.tick_count = 0  # every tick since the start (the history keeps only the latest)
        # "supervising" (a run holds the lease and ticks), "idle" (the last run found nothing to do
        # and ended; the next starts a tick later) or "waiting for the lease" (another holds it)
        self.state = "starting"

    @property
    def holds_lease(self) -> bool:
        """A supervisor run of this timer holds the coordinator lease now."""
        return self.state == "supervising"

    def start(self) -> CoordinatorTimer:
        self._thread = threading.Thread(target=self._loop, name="coordinator", daemon=True)
        self._thread.start()
        return self

    def _record(self, report: dispatch.TickReport | None, error: str | None) -> None:
        self.history.append(TickRecord(time.time(), report, error))
        self.tick_count += 1
        self.state = "supervising"  # a supervisor ticks only while it holds the lease
        # Lambda flushes metrics at the end of each invocation; locally they are dropped.
        metrics.clear_metrics()

    def _loop(self) -> None:
        with invocation_scope():  # the API's request ids, set in the same process, are not ours
            self._run_until_stopped()

    def _run_until_stopped(self) -> None:
        while not self._stop.is_set():
            supervisor = dispatch.Supervisor(self._settings, self._invoker, launcher=self._launcher)
            supervisor.on_tick = self._record
            reports: list[dispatch.TickReport] = []
            try:
                reports = supervisor.run(lambda: math.inf, self._stop)
            except Exception as exc:  # noqa: BLE001 - logged; the schedule starts another run
                logger.exception("coordinator run failed")
                self._record(None, f"{type(exc).__name__}: {exc}")
            # the run ended: it released the lease (or lost it)
            self.state = "idle" if reports and reports[-1].idle else "waiting for the lease"
            self._stop.wait(self.interval)

    def stop(self) -> None:
        """Stop after the tick in progress, if any."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


# A kept table's layout check says how far it got every this many items (a million take minutes).
RESHARD_PROGRESS_EVERY = 100_000


def _say_reshard_progress(report: migration.ReshardReport) -> None:
    if report.scanned and report.scanned % RESHARD_PROGRESS_EVERY == 0:
        print(f"checking the kept table's index layout: {report.scanned:,} items read, {report.moved:,} moved "
              "(Ctrl-C stops)", file=sys.stderr, flush=True)


class LocalRuntime:
    """Embedded DynamoDB, API, coordinator timer, worker pool and dashboard, started together."""

    def __init__(
        self,
        settings: Settings,
        host: str = "127.0.0.1",
        port: int = 0,
        max_invocations: int | None = None,
        log: IO[bytes] | int | None = None,
        drain_seconds: float = 5.0,
        database: str | None = None,
        data_dir: Path | None = None,
        prewarm: int | None = None,
        handlers: Path | None = None,
        allowed_hosts: Sequence[str] = (),
        api_environments: int = DEFAULT_MAX_ENVIRONMENTS,
        prewarm_api: int = 1,
        function_env: Mapping[str, str] | None = None,
        console_port: int | None = None,
    ) -> None:
        self.requested_settings = settings
        self.allowed_hosts = tuple(allowed_hosts)  # host names the API answers to besides addresses
        # Your handlers package: imported by the API process and every worker, as on Lambda.
        self.settings, self.handlers_path = with_handlers_package(settings, handlers)
        self.handlers_dir = Path(handlers).resolve() if handlers is not None else None
        # Your handlers' own variables (``--env``), as a Lambda function's environment.
        self.function_env = dict(function_env or {})
        self.host = host
        self.port = port
        self.max_invocations = max_invocations or default_max_invocations(settings)
        # Worker environments started up front (one per slot by default), as provisioned
        # concurrency would keep them on Lambda; 0 starts every one on demand (cold).
        self.prewarm = self.max_invocations if prewarm is None else prewarm
        self.log = log
        self.drain_seconds = drain_seconds
        self.database_backend = database  # auto | dynamodb-local | moto (see coworker_local.database)
        self.data_dir = data_dir
        self.database: EmbeddedDatabase | None = None
        # dynamodb-admin on this port (0: a free one) when asked for (``--console``); None: none.
        self.console_port = console_port
        self.console: TableConsole | None = None
        self.table_created = False
        self.pool: ProcessWorkerPool | None = None
        self.runners: ProcessRunnerLauncher | None = None
        self.lambda_service: LocalLambdaService | None = None
        self.gateway: LocalGateway | None = None
        # Requests the API answers at once, each in a process of its own (Lambda's environments).
        self.api_environments = api_environments
        self.prewarm_api = prewarm_api  # of them started with the runtime, as provisioned concurrency
        self.api: ApiEnvironmentPool | None = None
        self.coordinator: CoordinatorTimer | None = None
        self.started_at = time.time()
        self.batches: list[str] = []  # batch ids submitted by the demo, shown on the dashboard
        self._finished_lock = threading.Lock()
        self._finished: tuple[float, int] | None = None  # (when counted, monotonic; the count)
        self._finished_counting: threading.Thread | None = None
        self._finished_next_at = 0.0  # (monotonic) no new count starts before this
        self._temporary_result_dir: Path | None = None

    @property
    def url(self) -> str:
        assert self.gateway is not None
        return self.gateway.url

    @property
    def events_path(self) -> Path | None:
        """Where ``--events log`` writes its JSON lines (``None`` with other ``events`` settings)."""
        if self.settings.events != "log" or self.settings.events_file is None:
            return None
        return Path(self.settings.events_file)

    def worker_environment(self) -> dict[str, str]:
        """What a worker process gets: the settings as environment variables, credentials,
        Powertools switches, the basics of a process environment and your ``function_env``."""
        environ = {name: os.environ[name] for name in PASSED_THROUGH if name in os.environ}
        environ.update(self.function_env)
        environ.update(FAKE_CREDENTIALS)
        environ.update({k: v for k, v in os.environ.items() if k.startswith(PASSED_PREFIXES)})
        environ.update(self.settings.as_environment())
        if self.handlers_path is not None:
            environ["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(self.handlers_path), os.environ.get("PYTHONPATH", "")]))
        return environ

    def _fit_worker_timeout(self) -> None:
        """As the stack does: a worker timeout long enough for the longest limit a type declares."""
        handlers.load_handler_modules(self.settings.handler_module_list)
        on_lambda = {task_type: limit for task_type, limit in handlers.declared_timeouts().items()
                     if runners.runner_of(task_type, self.settings) == "lambda"}
        fitted = timing.fitted_worker_timeout(self.settings, on_lambda)
        if fitted > self.settings.worker_timeout_seconds:
            logger.warning("worker timeout raised to fit the time limits task types declare",
                           extra={"worker_timeout_seconds": fitted,
                                  "was": self.settings.worker_timeout_seconds})
            self.settings = self.settings.model_copy(update={"worker_timeout_seconds": fitted})

    def start(self) -> LocalRuntime:
        from coworker_local.dashboard import dashboard_routes, static_folder

        for name, value in FAKE_CREDENTIALS.items():
            os.environ.setdefault(name, value)
        if self.handlers_path is not None and str(self.handlers_path) not in sys.path:
            sys.path.insert(0, str(self.handlers_path))
        if self.settings.cursor_secret is None:  # listing cursors are valid for this run only
            self.settings = self.settings.model_copy(update={"cursor_secret": secrets.token_hex(16)})
        if self.settings.result_bucket is None and self.settings.result_dir is None:
            # The results bucket's stand-in: kept with the data folder, else for this run only.
            if self.data_dir is not None:
                folder = Path(self.data_dir) / "results"
            else:
                folder = Path(tempfile.mkdtemp(prefix="coworker-results-"))
                self._temporary_result_dir = folder
            self.settings = self.settings.model_copy(update={"result_dir": str(folder)})
        if self.settings.events == "log" and self.settings.events_file is None:
            # Events as JSON lines, for the dashboard and to read after the run: kept with the data
            # folder, else in a file of this run's own in the temp dir, kept at stop too (the banner
            # and the stop message say where); the temporary results folder is removed at stop.
            if self.data_dir is not None:
                Path(self.data_dir).mkdir(parents=True, exist_ok=True)
                events_file = Path(self.data_dir) / "events.jsonl"
            else:
                handle, name = tempfile.mkstemp(prefix="coworker-events-", suffix=".jsonl")
                os.close(handle)
                events_file = Path(name)
            self.settings = self.settings.model_copy(update={"events_file": str(events_file)})
        if self.settings.dynamodb_endpoint is None:
            self.database = start_database(self.database_backend, host=self.host, data_dir=self.data_dir,
                                           log=self.log if not isinstance(self.log, int) else None)
            self.settings = self.settings.model_copy(update={"dynamodb_endpoint": self.database.endpoint})
        self.table_created = create_table(self.settings)
        if self.console_port is not None:
            assert self.settings.dynamodb_endpoint is not None
            self.console = TableConsole(self.settings.dynamodb_endpoint, port=self.console_port,
                                        log=self.log if not isinstance(self.log, int) else None).start()
        self._fit_worker_timeout()
        self.pool = ProcessWorkerPool(
            self.worker_environment(),
            timeout_seconds=self.settings.worker_timeout_seconds,
            max_invocations=self.max_invocations,
            log=self.log if self.log is not None else sys.stderr,
            prewarm=self.prewarm,
        )
        # Workers are started through Lambda's Invoke API, served here in front of the pool.
        self.lambda_service = LocalLambdaService(self.pool, host=self.host).start()
        self.settings = self.settings.model_copy(update={
            "worker_function": self.lambda_service.function_name,
            "lambda_endpoint": self.lambda_service.endpoint,
        })
        configure(self.settings)
        if not self.table_created:
            # A kept data folder: its tasks may predate the index layout (or the shard count).
            moved = migration.reshard(progress=_say_reshard_progress).moved
            if moved:
                logger.info("kept table resharded", extra={"moved": moved})
        # This run's settings for anything in this process that reads them as a function would.
        os.environ.update(self.settings.as_environment())
        # The API's handler runs in processes of its own that read their settings from the
        # environment, like the workers; ``prewarm_api`` start now, more as requests overlap.
        self.api = ApiEnvironmentPool(self.worker_environment(), max_environments=self.api_environments,
                                      log=self.log if self.log is not None else sys.stderr,
                                      prewarm=self.prewarm_api)
        self.gateway = LocalGateway(
            self.api, host=self.host, port=self.port, concurrent=True,
            extra_routes=dashboard_routes(self), static={"/dashboard/static": static_folder()},
            allowed_hosts=self.allowed_hosts,
        ).start()
        invoker = dispatch.invoker_from_settings(self.settings)
        assert invoker is not None
        if self.settings.max_runners > 0:
            self.runners = ProcessRunnerLauncher(self.worker_environment(), self.settings.runner_stop_seconds,
                                                 log=self.log if self.log is not None else sys.stderr)
        self.coordinator = CoordinatorTimer(self.settings, invoker, self.runners).start()
        self.api.wait_prewarmed()  # the first request finds an environment ready
        return self

    def stop(self) -> None:
        """Stop in order: no more ticks, drain or interrupt the workers, then API and database."""
        if self.coordinator is not None:
            self.coordinator.stop()
        if self.gateway is not None:
            self.gateway.stop()  # no more submits
        if self.api is not None:
            self.api.shutdown()
        if self.runners is not None:
            self.runners.shutdown()
        if self.pool is not None:
            self.pool.shutdown(self.drain_seconds)
        if self.lambda_service is not None:
            self.lambda_service.stop()
        if self.console is not None:
            self.console.stop()
        if self.database is not None:
            self.database.stop()
        if self._temporary_result_dir is not None:
            shutil.rmtree(self._temporary_result_dir, ignore_errors=True)

    def finished_count(self, max_age: float = 1.0) -> tuple[int | None, float | None]:
        """Finished tasks in the table and the count's age in seconds (``None, None`` before the
        first count ends).

        Finished tasks leave the status index, so the API does not count them; this scans the
        table (on AWS a scan per dashboard refresh would be a cost to avoid). The scan runs on a
        thread of its own, started when the last count is older than ``max_age`` and no sooner
        after the last scan ended than FINISHED_SCAN_PAUSE_FACTOR times that scan took; a caller
        waits for it at most FINISHED_COUNT_WAIT_SECONDS, else gets the last count. A table of a
        few thousand items is counted in milliseconds, so the answer is fresh; one of a million
        takes minutes to scan, and the dashboard still answers at once, with an older count.
        """
        with self._finished_lock:
            counting = self._finished_counting
            stale = self._finished is None or time.monotonic() - self._finished[0] >= max_age
            if (counting is None or not counting.is_alive()) and stale and time.monotonic() >= self._finished_next_at:
                counting = threading.Thread(target=self._count_finished, name="finished-count", daemon=True)
                self._finished_counting = counting
                counting.start()
        if counting is not None:
            counting.join(FINISHED_COUNT_WAIT_SECONDS)
        with self._finished_lock:
            if self._finished is None:
                return None, None
            at, count = self._finished
            return count, round(time.monotonic() - at, 1)

    def _count_finished(self) -> None:
        from coworker.data.layout import BATCH_KEY_PREFIX
        from coworker.data.models import TaskModel, TaskStatus

        began = time.monotonic()
        try:
            count = sum(1 for task in TaskModel.scan(
                filter_condition=(TaskModel.status == TaskStatus.FINISHED.value)
                & ~TaskModel.key.startswith(BATCH_KEY_PREFIX),
                attributes_to_get=["key"]))
        except Exception:  # noqa: BLE001 - the dashboard keeps the last count; the next refresh tries again
            logger.exception("could not count the finished tasks")
            count = None
        ended = time.monotonic()
        with self._finished_lock:
            if count is not None:
                self._finished = (began, count)
            self._finished_next_at = ended + FINISHED_SCAN_PAUSE_FACTOR * (ended - began)

    @staticmethod
    def _last_backlog(ticks: list[TickRecord]) -> dict[str, Any] | None:
        """The coordinator's latest backlog measure (as it publishes it to CloudWatch)."""
        for record in reversed(ticks):
            if record.report is not None and record.report.backlog is not None:
                backlog = record.report.backlog
                return dataclasses.asdict(backlog) | {"due": backlog.due, "at": record.at}
        return None

    def info(self) -> dict[str, Any]:
        """Settings, worker pool counters and recent ticks, for the dashboard and the tests."""
        ticks = list(self.coordinator.history) if self.coordinator else []
        coordinator_state = self.coordinator.state if self.coordinator else "off"
        last = next((t for t in reversed(ticks) if t.report is not None), None)
        finished, finished_age = self.finished_count()
        return {
            "uptime_seconds": round(time.time() - self.started_at, 1),
            "database": {
                "backend": self.database.name if self.database else "external",
                "description": self.database.describe() if self.database else self.settings.dynamodb_endpoint,
                "pid": getattr(self.database, "pid", None),
                "table_created": self.table_created,
            },
            "console": self.console.url if self.console else None,  # dynamodb-admin (--console)
            "finished_tasks": finished,  # (a scan's count, ``finished_tasks_age_seconds`` old)
            "finished_tasks_age_seconds": finished_age,
            # without secrets: the dashboard's page shows these (the cursor secret signs cursors)
            "settings": {k: "(set)" if "secret" in k and v else v for k, v in self.settings.model_dump().items()},
            "effective_lock_seconds": self.settings.effective_lock_seconds,
            "workers": self.pool.stats() if self.pool else {},
            "runners": self.runners.stats() if self.runners else {},
            "api": self.api.stats() if self.api else {},
            "ticks": self.coordinator.tick_count if self.coordinator else 0,
            "last_tick": dataclasses.asdict(last.report) | {"at": last.at} if last and last.report else None,
            "last_tick_age_seconds": round(time.time() - last.at, 1) if last else None,
            "coordinator_holds_lease": coordinator_state == "supervising",
            "coordinator_state": coordinator_state,
            "backlog": self._last_backlog(ticks),
            "tick_errors": [t.error for t in ticks if t.error][-5:],
            "batches": self.batches[-20:],
            "series": self.pool.series() if self.pool else [],
        }

    def __enter__(self) -> LocalRuntime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
