"""``python -m coworker_local``: run the whole system on this machine (see docs/local.md).

Every setting has a flag named after its field (``--tick-seconds``) and the environment variable
Lambda uses (``COWORKER_TICK_SECONDS``); a flag overrides the variable, which overrides the local
default, which overrides the library's default.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import types
import typing
import warnings
from pathlib import Path
from typing import Any

# Before the library is imported: Powertools reads these when its objects are created. EMF metric
# lines would drown the terminal; the logs go to the log file (see _route_logs).
os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_SERVICE_NAME", "coworker")
# The API handler's log_metrics warns on every request that publishes no metric.
warnings.filterwarnings("ignore", message="No application metrics to publish")

from coworker.config import EXAMPLE_HANDLER_MODULE, Settings  # noqa: E402
from coworker.errors import ConfigurationError  # noqa: E402

from coworker_local.api_environments import DEFAULT_MAX_ENVIRONMENTS, ApiStartError  # noqa: E402
from coworker_local.console import DEFAULT_PORT as CONSOLE_PORT  # noqa: E402
from coworker_local.console import ConsoleStartError  # noqa: E402
from coworker_local.dynamodb_local import DatabaseStartError  # noqa: E402

# Fields that make no sense to set on the command line of a local run (the runtime serves its
# own Lambda API and runs the coordinator for as long as it runs).
NOT_FLAGS = {"worker_function", "lambda_endpoint", "supervise_seconds",
             "api_auth",  # the local API checks no credentials, and declares none
             # ECS's: runners are local processes here, and the runtime loads the handlers itself
             "container_types", "runner_cluster", "runner_task_definition", "runner_container", "runner_subnets",
             "runner_security_groups", "runner_public_ip", "ecs_endpoint"}


def _yes_no(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")


def _count(least: int) -> Any:
    """An argparse type: a whole number of at least ``least``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, not {value}")
        return value
    return parse


def _field_type(annotation: Any) -> type:
    """The scalar type of a field (``int | None`` -> ``int``)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    return annotation


def settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`Settings` field, documented with its description and variable."""
    from coworker_local.runtime import LOCAL_DEFAULTS

    group = parser.add_argument_group("settings (flag > environment variable > local default)")
    for name, field in Settings.model_fields.items():
        if name in NOT_FLAGS:
            continue
        default = LOCAL_DEFAULTS.get(name, field.default)
        kind = _field_type(field.annotation)
        choices = typing.get_args(kind) if typing.get_origin(kind) is typing.Literal else None
        group.add_argument(
            "--" + name.replace("_", "-"), dest=name, default=None, choices=choices,
            type=_yes_no if kind is bool else str if choices else kind,
            metavar=field.alias, help=f"{field.description} [{field.alias}; default here: {default}]",
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m coworker_local",
        description="Coworker on one machine: embedded DynamoDB, the HTTP API, the coordinator on a "
                    "timer, worker processes, a web dashboard, and a demo workload.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
    parser.add_argument("--allow-host", dest="allowed_hosts", action="append", default=[], metavar="NAME",
                        help="a host name the API and dashboard answer to besides IP addresses and localhost "
                             "(repeatable; with --host 0.0.0.0, the name others reach this machine by). Any "
                             "other name is refused (421), against DNS rebinding")
    parser.add_argument("--api-port", type=int, default=8000,
                        help="port of the API and the dashboard (default 8000; 0 picks a free one)")
    parser.add_argument("--prewarm-workers", type=int, default=None, metavar="N",
                        help="worker processes started with the runtime, idle until invoked (like "
                             "provisioned concurrency; default one per worker slot, 0: all on demand)")
    parser.add_argument("--max-invocations", type=int, default=None,
                        help="most worker processes running at once, like a Lambda's reserved "
                             "concurrency (default 2 x ceil(max_concurrency / batch_size))")
    parser.add_argument("--api-environments", type=_count(1), default=DEFAULT_MAX_ENVIRONMENTS, metavar="N",
                        help="most API requests answered at once, each in a process of its own like a "
                             f"Lambda execution environment (default {DEFAULT_MAX_ENVIRONMENTS})")
    parser.add_argument("--prewarm-api", type=_count(0), default=1, metavar="N",
                        help="API processes started with the runtime (default 1; more start when requests "
                             "overlap)")
    parser.add_argument("--drain-seconds", type=float, default=5.0,
                        help="on Ctrl-C, how long running invocations may finish before SIGTERM")
    parser.add_argument("--db", choices=("auto", "dynamodb-local", "moto"), default=None,
                        help="embedded database: DynamoDB Local, or moto (fast, in memory, one request at "
                             "a time); auto (the default) falls back to moto when Java is missing "
                             "[COWORKER_LOCAL_DB]")
    parser.add_argument("--data-dir", type=Path, default=os.environ.get("COWORKER_LOCAL_DATA_DIR") or None,
                        help="keep DynamoDB Local's data in this folder, so a restart finds its tasks "
                             "(default: in memory) [COWORKER_LOCAL_DATA_DIR]")
    parser.add_argument("--console", action="store_true",
                        help="also start dynamodb-admin, a web console of the table (the DynamoDB console's "
                             "stand-in), on 127.0.0.1 only, linked from the dashboard; it stops with the runtime")
    parser.add_argument("--console-port", type=_count(0), default=CONSOLE_PORT, metavar="PORT",
                        help=f"port of the table console (default {CONSOLE_PORT}; 0 picks a free one)")
    parser.add_argument("--handlers", type=Path, default=None, metavar="DIR",
                        help="your handlers package (a folder with __init__.py), imported by the API and "
                             "every worker, as the stack bundles it [COWORKER_HANDLERS_DIR; default: "
                             "./handlers if it exists]")
    parser.add_argument("--no-handlers", dest="use_handlers", action="store_false",
                        help="do not import a handlers package (the example types stay, unless "
                             "--example-handlers false)")
    parser.add_argument("--env", dest="function_env", action="append", default=[], metavar="NAME[=VALUE]",
                        help="an environment variable for your handlers in the worker and API processes, "
                             "as a Lambda function's environment: NAME=VALUE, or NAME to pass this "
                             "shell's value (repeatable)")
    parser.add_argument("--log-file", type=Path, default=None,
                        help="where the runtime and worker logs go (default: a file in the temp dir)")
    demo = parser.add_argument_group("demo workload")
    demo.add_argument("--no-demo", dest="demo", action="store_false", help="start empty")
    demo.add_argument("--tasks", type=int, default=2000, help="demo tasks to submit (default 2000)")
    demo.add_argument("--seed", type=int, default=None, help="random seed of the demo mix")
    demo.add_argument("--exit-when-done", action="store_true",
                      help="stop after the demo's summary instead of serving until Ctrl-C")
    settings_flags(parser)
    return parser


def _route_logs(path: Path) -> Any:
    """Send this process's Powertools logs to ``path``; return a binary handle for the workers."""
    from coworker.observability import logger

    text = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    for handler in logger.handlers:
        if hasattr(handler, "setStream"):
            handler.setStream(text)
    return open(path, "ab", buffering=0)  # noqa: SIM115


def _stop_with_parent(stop: threading.Event, interval: float = 0.5) -> None:
    """Set ``stop`` when the process that started this one dies (it is re-parented), so a
    runtime started by a test, a script or an editor never outlives what started it."""
    parent = os.getppid()

    def watch() -> None:
        while not stop.wait(interval):
            if os.getppid() != parent:
                print("the process that started the runtime is gone: stopping", file=sys.stderr, flush=True)
                stop.set()  # as SIGTERM does: the demo and the serving loop end, then the orderly stop
                return

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _more_banner(runtime: Any) -> str:
    """The banner's lines for what this command line adds: where events go, the table console."""
    lines = []
    if runtime.events_path is not None:
        lines.append(f"  Events      {runtime.events_path}   (JSON lines, kept after stop)")
    if runtime.console is not None:
        lines.append(f"  Console     {runtime.console.url}   (dynamodb-admin: the table's items)")
    return "".join("\n" + line for line in lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Ctrl-C stops the runtime even when whatever started it ignores SIGINT (a background job of
    # a script does): Python leaves an inherited SIG_IGN in place otherwise.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from coworker_local import demo as demo_module
    from coworker_local.runtime import (
        LocalRuntime,
        default_handlers_dir,
        function_environment,
        local_settings,
        with_handlers_package,
    )

    overrides = {name: getattr(args, name) for name in Settings.model_fields if name not in NOT_FLAGS}
    handlers = (args.handlers or default_handlers_dir()) if args.use_handlers else None
    try:
        settings = local_settings(**overrides)
        with_handlers_package(settings, handlers)  # a bad package is refused before anything starts
        function_env = function_environment(args.function_env, os.environ)
    except ConfigurationError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.demo and args.tasks > 0 and EXAMPLE_HANDLER_MODULE not in settings.handler_module_list:
        print("the demo submits the example task types: drop --example-handlers false, or add --no-demo",
              file=sys.stderr)
        return 2
    log_path = args.log_file or Path(tempfile.gettempdir()) / f"coworker-local-{os.getpid()}.log"
    log = _route_logs(log_path)

    stop = threading.Event()
    starting = threading.Event()
    starting.set()

    def on_sigterm(*_: object) -> None:
        stop.set()
        if starting.is_set():  # a long start (a kept table's scan) is cut short, as Ctrl-C cuts it
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    _stop_with_parent(stop)
    runtime = LocalRuntime(settings, host=args.host, port=args.api_port, allowed_hosts=args.allowed_hosts,
                           max_invocations=args.max_invocations, log=log, drain_seconds=args.drain_seconds,
                           prewarm=args.prewarm_workers,
                           api_environments=args.api_environments,
                           prewarm_api=args.prewarm_api,
                           database=args.db, data_dir=args.data_dir, handlers=handlers,
                           function_env=function_env, console_port=args.console_port if args.console else None)
    try:
        runtime.start()
        starting.clear()  # (in the try: a SIGTERM just before it is an interrupted start)
    except DatabaseStartError as exc:
        print(f"cannot start the database: {exc}", file=sys.stderr)
        runtime.stop()
        return 1
    except ConsoleStartError as exc:
        print(f"cannot start the table console: {exc}", file=sys.stderr)
        runtime.stop()
        return 1
    except ApiStartError as exc:
        print(f"cannot start the API: {exc} (the error is in {log_path})", file=sys.stderr)
        runtime.stop()
        return 1
    except OSError as exc:
        print(f"cannot start: {exc} (is port {args.api_port} taken? try --api-port 0)", file=sys.stderr)
        runtime.stop()
        return 1
    except KeyboardInterrupt:  # Ctrl-C (or SIGTERM) while starting: stop what has started, in order
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("\nStopped while starting.", file=sys.stderr, flush=True)
        runtime.stop()
        return 130
    code = 0
    try:
        # Inside the try: a Ctrl-C sent as soon as the banner shows the API's address is an
        # orderly stop, not an uncaught KeyboardInterrupt.
        print(demo_module.banner(runtime, log_path) + _more_banner(runtime), flush=True)
        if args.demo and args.tasks > 0:
            summary = demo_module.run_demo(runtime, args.tasks, seed=args.seed, stop=stop)
            code = 0 if summary.complete else 1
        if not args.exit_when_done:
            print("Serving until Ctrl-C.", flush=True)
            while not stop.wait(0.5):
                pass
    except KeyboardInterrupt:
        pass
    finally:
        print("\nStopping: coordinator, then workers (draining), API and database...", flush=True)
        # A second Ctrl-C during the orderly stop is ignored rather than leaving locks behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        runtime.stop()
        stats = runtime.pool.stats() if runtime.pool else {}
        print(f"Stopped. Worker invocations: {stats.get('ok', 0)} ok, "
              f"{stats.get('timeout-killed', 0)} killed at the timeout, "
              f"{stats.get('interrupted', 0)} interrupted.", flush=True)
        if runtime.events_path is not None:
            print(f"Events kept in {runtime.events_path}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
