"""``coworker``: the command line client of the task API.

    coworker submit --type quick --key order-1 --payload '{"n": 1}'
    coworker submit --file tasks.jsonl            # one JSON task per line ("-" reads stdin); every
                                                  # line is checked before anything is sent
    coworker status order-1
    coworker list --status ignored [--type T] [--batch ID] [--all]
    coworker batch BATCH_ID [--once]              # live progress until the batch is done
    coworker retry order-1 | coworker retry --batch BATCH_ID [--status failed]
    coworker cancel order-1
    coworker bulk retry --status ignored [--type T] [--batch ID] [--created-after ISO] [--dry-run]
    coworker bulk cancel --status todo --type T   # a progress bar; prints how to resume if stopped
    coworker stats
    coworker types | coworker pause TYPE | coworker resume TYPE | coworker limit TYPE N|none
    coworker rates | coworker rate key:example.com [5 --per 1 | none] | coworker rate type:crawl 100 --per 60
    coworker schedule put nightly 'cron(0 3 * * *)' --type crawl [--timezone Europe/Berlin] [--missed skip]
    coworker schedules | coworker schedule show|pause|resume|delete NAME
    coworker migrate-index --table NAME [--shards N] [--dry-run]   # talks to DynamoDB itself
    coworker preflight [--region R] [-c key=value ...]            # before a deploy: the account's real
                                                  # Lambda quota and API Gateway role, against the stack's needs

The API is found at ``--url`` or ``COWORKER_API_URL`` (default http://127.0.0.1:8000); an API
key from ``--api-key`` or ``COWORKER_API_KEY`` is sent as ``x-api-key``. ``--iam`` signs requests
with SigV4 (service ``execute-api``) using the usual AWS credentials instead.

Exit codes: 0 success, 1 the API refused or failed the request (its message is printed as
worded; for preflight, a deploy would fail), 2 bad command line (for preflight, also no AWS
credentials or a refused read), 3 the API could not be reached, 141 the output's reader went away
(`coworker list | head`; nothing is printed about it).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from coworker_local.api_client import ApiClient, ApiError, Unreachable
from coworker_local.client import CHUNK_TASKS, MAX_SUBMIT_PARALLEL, SUBMIT_PARALLEL
from coworker_local.commands import (
    BULK_PAGE,
    EXIT_API_ERROR,
    EXIT_BROKEN_PIPE,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    UsageError,
    cmd_batch,
    cmd_bulk,
    cmd_cancel,
    cmd_limit,
    cmd_list,
    cmd_migrate_index,
    cmd_pause,
    cmd_preflight,
    cmd_rate,
    cmd_rates,
    cmd_retry,
    cmd_schedule,
    cmd_schedules,
    cmd_stats,
    cmd_status,
    cmd_submit,
    cmd_types,
    write_api_error,
)

DEFAULT_URL = "http://127.0.0.1:8000"

# What add_subparsers returns; build_parser makes its add_parser give every command the connection options.
Commands = argparse._SubParsersAction


# -- argument parsing --------------------------------------------------------------------------

def _chunk_size(text: str) -> int:
    value = int(text)
    if not 1 <= value <= CHUNK_TASKS:
        raise argparse.ArgumentTypeError(f"must be between 1 and {CHUNK_TASKS} (the API's batch limit)")
    return value


def _parallel(text: str) -> int:
    value = int(text)
    if not 1 <= value <= MAX_SUBMIT_PARALLEL:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_SUBMIT_PARALLEL}")
    return value


def _connection_options(target: argparse.ArgumentParser, defaults: bool) -> None:
    # Accepted before and after the command; after it, only what is given overrides.
    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    target.add_argument("--url", default=default(os.environ.get("COWORKER_API_URL", DEFAULT_URL)),
                        help=f"API base URL (env COWORKER_API_URL; default {DEFAULT_URL})")
    target.add_argument("--api-key", dest="api_key", default=default(os.environ.get("COWORKER_API_KEY")),
                        help="API key sent as x-api-key (env COWORKER_API_KEY)")
    target.add_argument("--iam", action="store_true", default=default(False),
                        help="sign requests with SigV4 (AWS credentials) for an IAM-authorized API")
    target.add_argument("--region", default=default(None),
                        help="region for --iam, and the one preflight reads (default AWS_REGION)")
    target.add_argument("--json", action="store_true", default=default(False),
                        help="print the API's JSON answers")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coworker", description="Client of the Coworker task API.")
    _connection_options(parser, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    _connection_options(common, defaults=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_parser = commands.add_parser

    def add_parser(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return _add_parser(name, parents=[common], **kwargs)

    commands.add_parser = add_parser  # type: ignore[method-assign]
    _add_submit(commands)
    _add_task_commands(commands)
    _add_bulk(commands)
    _add_type_commands(commands)
    _add_schedule_commands(commands)
    _add_stats(commands)
    _add_migrate_index(commands)
    _add_preflight(commands)
    return parser


def _add_submit(commands: Commands) -> None:
    submit = commands.add_parser("submit", help="submit one task from flags, or many from JSON lines")
    submit.add_argument("--type", help="task type (one task)")
    submit.add_argument("--key", help="task key (one task; generated when absent)")
    submit.add_argument("--payload", help="JSON payload (one task)")
    submit.add_argument("--max-attempts", type=int, dest="max_attempts")
    submit.add_argument("--run-at", dest="run_at", help="ISO-8601 time before which the task is not run")
    submit.add_argument("--priority", type=int)
    submit.add_argument("--concurrency-key", dest="concurrency_key",
                        help="at most --concurrency-limit tasks with this key run at once (a domain, a tenant)")
    submit.add_argument("--concurrency-limit", dest="concurrency_limit", type=int, help="default 1")
    submit.add_argument("--rate-key", dest="rate_key",
                        help="at most --rate-limit tasks with this key start per --rate-interval (a domain, a key)")
    submit.add_argument("--rate-limit", dest="rate_limit", type=int, help="starts per interval, 1-1000")
    submit.add_argument("--rate-interval", dest="rate_interval_seconds", type=float, metavar="SECONDS",
                        help="the interval of --rate-limit (default 1)")
    submit.add_argument("--timeout-seconds", dest="timeout_seconds", type=float, metavar="SECONDS",
                        help="the task's time limit (default: its type's); refused if the worker cannot give it")
    submit.add_argument("--file", help="JSON lines, one task object per line; '-' reads stdin")
    submit.add_argument("--batch-id", dest="batch_id",
                        help="batch id for --file (generated when absent, and printed); a line without a key "
                             "gets the key <batch id>:<line number>, so re-running a file with its batch id "
                             "stores each task once")
    for event, when in (("complete", "every task is finished or ignored"),
                        ("success", "every task is finished, none ignored"),
                        ("stopped", "the batch stops at its failure threshold")):
        submit.add_argument(f"--on-{event}", dest=f"on_{event}", metavar="TYPE",
                            help=f"with --file: a task of this type runs once {when} (its payload: the "
                                 "batch's counts, and --callback-payload)")
    submit.add_argument("--callback-payload", dest="callback_payload", help="JSON payload of the --on-* tasks")
    submit.add_argument("--chunk-size", dest="chunk_size", type=_chunk_size, default=CHUNK_TASKS,
                        metavar=f"1..{CHUNK_TASKS}", help="tasks per request (default %(default)s)")
    submit.add_argument("--parallel", type=_parallel, default=SUBMIT_PARALLEL, metavar="N",
                        help="requests sent at once (default %(default)s); every line is checked before the "
                             "first is sent; if the API refuses a request all the same, nothing more is sent, "
                             "and the message counts what is stored (requests sent alongside included) and "
                             "prints the command that stores the rest")
    submit.add_argument("--quiet", action="store_true", help="no progress bar")
    submit.set_defaults(run=cmd_submit)


def _add_task_commands(commands: Commands) -> None:
    """status, list, batch, retry, cancel: one task or batch at a time."""
    status = commands.add_parser("status", help="show a task's whole record")
    status.add_argument("key")
    status.set_defaults(run=cmd_status)

    listing = commands.add_parser("list", help="list tasks of one status")
    listing.add_argument("--status", required=True, choices=["todo", "processing", "failed", "ignored"])
    listing.add_argument("--type")
    listing.add_argument("--batch")
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--order", choices=["oldest", "newest"], default="oldest")
    listing.add_argument("--cursor")
    listing.add_argument("--all", action="store_true", help="follow cursors to the end")
    listing.set_defaults(run=cmd_list)

    batch = commands.add_parser("batch", help="a batch's progress, live until it is done")
    batch.add_argument("batch_id")
    mode = batch.add_mutually_exclusive_group()
    mode.add_argument("--watch", action="store_true", help="refresh until done (the default)")
    mode.add_argument("--once", action="store_true", help="print the counts once")
    batch.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    batch.set_defaults(run=cmd_batch)

    retry = commands.add_parser("retry", help="redrive a task, or a batch's ignored/failed tasks")
    retry.add_argument("key", nargs="?")
    retry.add_argument("--batch")
    retry.add_argument("--status", choices=["ignored", "failed"], default="ignored",
                       help="which tasks of the batch (default ignored)")
    retry.set_defaults(run=cmd_retry)

    cancel = commands.add_parser("cancel", help="cancel a task that is not finished")
    cancel.add_argument("key")
    cancel.set_defaults(run=cmd_cancel)


def _add_bulk(commands: Commands) -> None:
    bulk = commands.add_parser("bulk", help="retry or cancel every task matching a filter, with a progress bar")
    bulk.add_argument("action", choices=["retry", "cancel"])
    bulk.add_argument("--status", required=True, choices=["todo", "processing", "failed", "ignored"],
                      help="retry: failed or ignored; cancel: todo, failed or processing")
    bulk.add_argument("--type", help="only tasks of this type")
    bulk.add_argument("--batch", help="only tasks of this batch")
    bulk.add_argument("--created-after", help="only tasks created at or after this ISO-8601 time")
    bulk.add_argument("--created-before", help="only tasks created before this ISO-8601 time")
    bulk.add_argument("--dry-run", action="store_true", help="count what would change; change nothing")
    bulk.add_argument("--no-count", action="store_true", help="skip the counting pass (no total in the bar)")
    bulk.add_argument("--page", type=int, default=BULK_PAGE, help=f"tasks per request (at most {BULK_PAGE})")
    bulk.add_argument("--cursor", help="resume where an interrupted run stopped (it prints the command)")
    bulk.set_defaults(run=cmd_bulk)


def _add_type_commands(commands: Commands) -> None:
    """types, pause, resume, limit, rates, rate."""
    types = commands.add_parser("types", help="task types: registered, paused, held")
    types.set_defaults(run=cmd_types)
    pause = commands.add_parser("pause", help="pause a task type: its tasks wait, running ones finish")
    pause.add_argument("type")
    pause.set_defaults(run=cmd_pause)
    resume = commands.add_parser("resume", help="resume a paused task type")
    resume.add_argument("type")
    resume.set_defaults(run=cmd_pause)

    limit = commands.add_parser("limit", help="set how many tasks of a type run at once ('none' lifts it)")
    limit.add_argument("type")
    limit.add_argument("limit", metavar="LIMIT", help="1-1000, or 'none'")
    limit.set_defaults(run=cmd_limit)

    rates = commands.add_parser("rates", help="the rate limits set, with their recent starts")
    rates.set_defaults(run=cmd_rates)
    rate = commands.add_parser("rate", help="show a rate group, or set how many of its tasks start per interval "
                                            "('none' lifts it)")
    rate.add_argument("group", help="key:<rate key> or type:<task type>")
    rate.add_argument("limit", metavar="LIMIT", nargs="?", help="1-1000, or 'none'; absent: show the group")
    rate.add_argument("--per", type=float, default=1.0, metavar="SECONDS", help="the interval (default 1)")
    rate.set_defaults(run=cmd_rate)


def _add_schedule_commands(commands: Commands) -> None:
    """schedules, schedule put|show|pause|resume|delete."""
    listing = commands.add_parser("schedules", help="recurring schedules: expression, next and last occurrence")
    listing.set_defaults(run=cmd_schedules)
    schedule = commands.add_parser("schedule", help="create, replace, show, pause, resume or delete a schedule")
    schedule.add_argument("action", choices=["put", "show", "pause", "resume", "delete"])
    schedule.add_argument("name")
    schedule.add_argument("expression", nargs="?", help="put: 'rate(15 minutes)' or 'cron(0 3 * * *)'")
    schedule.add_argument("--type", help="put: the type of the task each occurrence puts")
    schedule.add_argument("--payload", help="put: the task's JSON payload")
    schedule.add_argument("--max-attempts", type=int, dest="max_attempts")
    schedule.add_argument("--timeout-seconds", dest="timeout_seconds", type=float, metavar="SECONDS",
                          help="put: the task's time limit (default: its type's)")
    schedule.add_argument("--timezone", default="UTC", help="put: IANA time zone of a cron expression")
    schedule.add_argument("--missed", choices=["once", "skip"], default="once",
                          help="put: occurrences missed while nothing ran: run the latest once, or skip")
    schedule.add_argument("--paused", action="store_true", help="put: create it paused")
    schedule.set_defaults(run=cmd_schedule)


def _add_stats(commands: Commands) -> None:
    stats = commands.add_parser("stats", help="counts by status (bounded)")
    stats.add_argument("--cap", type=int, help="most entries counted per status")
    stats.set_defaults(run=cmd_stats)


def _add_migrate_index(commands: Commands) -> None:
    migrate = commands.add_parser(
        "migrate-index", help="give every indexed task the index shard the current layout wants "
                              "(after upgrading from the unsharded index, or lowering --shards); "
                              "talks to DynamoDB directly with your AWS credentials")
    migrate.add_argument("--table", default=os.environ.get("COWORKER_TABLE_NAME"),
                         help="the task table (env COWORKER_TABLE_NAME; the stack's TableName output)")
    migrate.add_argument("--shards", type=int, default=os.environ.get("COWORKER_STATUS_SHARDS"),
                         help="index shards per status, as deployed (statusShards; default 4)")
    migrate.add_argument("--endpoint", default=os.environ.get("COWORKER_DYNAMODB_ENDPOINT"),
                         help="DynamoDB endpoint (local runs); default AWS")
    migrate.add_argument("--segments", type=int, default=1, help="parallel scan segments (default 1)")
    migrate.add_argument("--dry-run", action="store_true", help="count what would move, write nothing")
    migrate.set_defaults(run=cmd_migrate_index)


def _add_preflight(commands: Commands) -> None:
    preflight = commands.add_parser(
        "preflight", help="before a deploy: read the account's Lambda concurrency quota and API Gateway "
                          "CloudWatch role (your AWS credentials) and check them against what the stack needs")
    preflight.add_argument("-c", "--context", action="append", metavar="KEY=VALUE",
                           help="a context option, as given to cdk deploy (repeatable)")
    preflight.add_argument("--cdk-json", default="cdk.json",
                           help="the app's cdk.json, whose context block is read first (default ./cdk.json)")
    preflight.add_argument("--stack-name", default=None,
                           help="the stack's name, if it is deployed already: an update keeps its own "
                                "reservations, so they count as available (default: the app's, Coworker)")
    preflight.set_defaults(run=cmd_preflight)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run one command; returns the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    args = parser.parse_args(argv)
    client = ApiClient(args.url, api_key=args.api_key, iam=args.iam, region=args.region)
    try:
        code: int = args.run(client, args, out, err)
        out.flush()  # a reader that went away is found here, not in Python's flush at exit
        return code
    except UsageError as exc:
        err.write(f"coworker: error: {exc}\n")
        return EXIT_USAGE
    except ApiError as exc:
        write_api_error(exc, err)
        return EXIT_API_ERROR
    except Unreachable as exc:
        err.write(f"error: {exc}\n")
        return EXIT_UNREACHABLE
    except BrokenPipeError:
        # The reader went away (`coworker list | head`): stop quietly, as other command-line tools
        # do. Python would otherwise fail again flushing stdout at exit.
        if out is sys.stdout:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
