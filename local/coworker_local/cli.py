"""``coworker``: the command line client of the task API.

    coworker submit --type quick --key order-1 --payload '{"n": 1}'
    coworker submit --file tasks.jsonl            # one JSON task per line ("-" reads stdin)
    coworker status order-1
    coworker list --status ignored [--type T] [--batch ID] [--all]
    coworker batch BATCH_ID [--once]              # live progress until the batch is done
    coworker retry order-1 | coworker retry --batch BATCH_ID [--status failed]
    coworker cancel order-1
    coworker bulk retry --status ignored [--type T] [--batch ID] [--created-after ISO] [--dry-run]
    coworker bulk cancel --status todo --type T   # a progress bar; prints how to resume if stopped
    coworker stats
    coworker types | coworker pause TYPE | coworker resume TYPE | coworker limit TYPE N|none
    coworker migrate-index --table NAME [--shards N] [--dry-run]   # talks to DynamoDB itself

The API is found at ``--url`` or ``COWORKER_API_URL`` (default http://127.0.0.1:8000); an API
key from ``--api-key`` or ``COWORKER_API_KEY`` is sent as ``x-api-key``. ``--iam`` signs requests
with SigV4 (service ``execute-api``) using the usual AWS credentials instead.

Exit codes: 0 success, 1 the API refused or failed the request (its message is printed as
worded), 2 bad command line, 3 the API could not be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO
from urllib.error import HTTPError, URLError
from urllib.parse import quote, urlencode
from urllib.request import Request, urlopen

DEFAULT_URL = "http://127.0.0.1:8000"
# What one POST /tasks may carry: the API's batch limit, and under Lambda's 6 MB request limit.
CHUNK_TASKS = 1000
CHUNK_BYTES = 5 * 1024 * 1024
TIMEOUT_SECONDS = 60

EXIT_OK, EXIT_API_ERROR, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


class ApiError(Exception):
    """The API answered with an error (4xx/5xx); ``message`` is the API's own wording."""

    def __init__(self, status: int, message: str, errors: list[dict] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors or []


class Unreachable(Exception):
    """No answer from the API (connection refused, DNS, timeout)."""


class ApiClient:
    """A small JSON client of the task API (standard library only; botocore for ``--iam``)."""

    def __init__(self, url: str, api_key: str | None = None, iam: bool = False,
                 region: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.iam = iam
        self.region = (region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
                       or "us-east-1")

    def request(self, method: str, path: str, query: dict[str, Any] | None = None, body: Any = None) -> Any:
        query = {k: v for k, v in (query or {}).items() if v is not None}
        url = self.url + path + ("?" + urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"Accept": "application/json", "User-Agent": "coworker-cli"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["x-api-key"] = self.api_key
        if self.iam:
            headers = self._signed(method, url, data, headers)
        try:
            request = Request(url, data=data, headers=headers, method=method)
            with urlopen(request, timeout=TIMEOUT_SECONDS) as reply:
                return _parse(reply.read())
        except HTTPError as exc:
            answer = _parse(exc.read())
            if isinstance(answer, dict) and "message" in answer:
                raise ApiError(exc.code, str(answer["message"]), answer.get("errors")) from None
            raise ApiError(exc.code, f"HTTP {exc.code} {exc.reason}") from None
        except URLError as exc:
            raise Unreachable(f"cannot reach the API at {self.url}: {exc.reason}") from None
        except TimeoutError:
            raise Unreachable(f"the API at {self.url} did not answer within {TIMEOUT_SECONDS} s") from None

    def _signed(self, method: str, url: str, data: bytes | None, headers: dict[str, str]) -> dict[str, str]:
        import botocore.session
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        credentials = botocore.session.Session().get_credentials()
        if credentials is None:
            raise Unreachable("--iam needs AWS credentials (environment, profile or instance role)")
        request = AWSRequest(method=method, url=url, data=data, headers=headers)
        SigV4Auth(credentials.get_frozen_credentials(), "execute-api", self.region).add_auth(request)
        return dict(request.headers.items())


def _parse(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def _key_path(key: str) -> str:
    return quote(key, safe="")


# -- output ------------------------------------------------------------------------------------

def _print_json(value: Any, out: TextIO) -> None:
    out.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


class Progress:
    """A one-line progress bar on a terminal; plain lines otherwise (logs, pipes)."""

    def __init__(self, total: int | None, out: TextIO, enabled: bool = True) -> None:
        self.total = total
        self.out = out
        self.enabled = enabled
        self.tty = out.isatty()
        self._last = ""

    def show(self, done: int, detail: str = "") -> None:
        if not self.enabled:
            return
        if self.total:
            width = 30
            filled = int(width * min(done, self.total) / self.total)
            line = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} {detail}".rstrip()
        else:
            line = f"{done} {detail}".rstrip()
        if line == self._last:
            return
        self._last = line
        self.out.write(("\r" + line + "\033[K") if self.tty else line + "\n")
        self.out.flush()

    def close(self) -> None:
        if self.enabled and self.tty and self._last:
            self.out.write("\n")
            self.out.flush()


# -- commands ----------------------------------------------------------------------------------

def _task_from_flags(args: argparse.Namespace) -> dict[str, Any]:
    task: dict[str, Any] = {"type": args.type}
    if args.key is not None:
        task["key"] = args.key
    if args.payload is not None:
        try:
            task["payload"] = json.loads(args.payload)
        except ValueError as exc:
            raise UsageError(f"--payload is not valid JSON: {exc}") from None
    for name in ("max_attempts", "run_at", "priority", "concurrency_key", "concurrency_limit"):
        if getattr(args, name) is not None:
            task[name] = getattr(args, name)
    return task


class UsageError(Exception):
    """The command line asks for something that cannot be done."""


def _read_tasks(lines: Iterable[str], source: str) -> Iterator[dict[str, Any]]:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"{source}, line {number}: not valid JSON ({exc})") from None
        if not isinstance(task, dict):
            raise UsageError(f"{source}, line {number}: expected a JSON object, got {type(task).__name__}")
        yield task


def _chunks(tasks: Iterable[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    chunk: list[dict[str, Any]] = []
    used = 0
    for task in tasks:
        task_bytes = len(json.dumps(task).encode("utf-8")) + 2
        if chunk and (len(chunk) >= size or used + task_bytes > CHUNK_BYTES):
            yield chunk
            chunk, used = [], 0
        chunk.append(task)
        used += task_bytes
    if chunk:
        yield chunk


def cmd_submit(client: ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.file is None:
        if not args.type:
            raise UsageError("give --type (one task from flags) or --file (JSON lines, '-' for stdin)")
        if args.batch_id:
            raise UsageError("--batch-id goes with --file; a single task has no batch")
        answer = client.request("POST", "/tasks", body=_task_from_flags(args))
        if args.json:
            _print_json(answer, out)
        else:
            out.write(f"{answer['key']}: {answer['outcome']}\n")
        return EXIT_OK
    if args.type or args.key or args.payload:
        raise UsageError("--file cannot be combined with --type/--key/--payload")
    if args.file == "-":
        lines: list[str] = sys.stdin.read().splitlines()
        source = "stdin"
    else:
        try:
            with open(args.file, encoding="utf-8") as handle:
                lines = handle.read().splitlines()
        except OSError as exc:
            raise UsageError(f"cannot read {args.file}: {exc.strerror}") from None
        source = args.file
    tasks = list(_read_tasks(lines, source))
    if not tasks:
        raise UsageError(f"{source} holds no tasks")
    # One batch id for every request: the batch counts all of them, and re-running the command
    # with --batch-id (and keyed tasks) re-submits idempotently.
    batch_id = args.batch_id or uuid.uuid4().hex
    progress = Progress(len(tasks), err, enabled=not args.quiet)
    created = existing = sent = 0
    try:
        for chunk in _chunks(tasks, args.chunk_size):
            try:
                answer = client.request("POST", "/tasks", body={"batch_id": batch_id, "tasks": chunk})
            except ApiError as exc:
                # Entries are numbered within the refused request; say where that is in the input.
                if exc.errors:
                    exc.message += f" (entries are counted from task {sent + 1} of {source})"
                raise
            created += answer["created"]
            existing += answer["existing"]
            sent += len(chunk)
            progress.show(sent, f"created {created}, existing {existing}")
    finally:
        progress.close()
    summary = {"batch_id": batch_id, "submitted": sent, "created": created, "existing": existing}
    if args.json:
        _print_json(summary, out)
    else:
        out.write(f"batch {batch_id}: {sent} submitted, {created} created, {existing} existing\n"
                  f"follow it with: coworker batch {batch_id}\n")
    return EXIT_OK


def cmd_status(client: ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    _print_json(client.request("GET", f"/tasks/{_key_path(args.key)}"), out)
    return EXIT_OK


def cmd_list(client: ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    query = {"status": args.status, "type": args.type, "batch": args.batch, "limit": args.limit,
             "order": args.order, "cursor": args.cursor}
    items: list[dict[str, Any]] = []
    while True:
        page = client.request("GET", "/tasks", query=query)
        items.extend(page["items"])
        query["cursor"] = page["cursor"]
        if not (args.all and page["cursor"]):
            break
    if args.json:
        _print_json({"items": items, "cursor": query["cursor"]}, out)
        return EXIT_OK
    rows = [(i["key"], i["status"], i["type"] or "", f"{i['attempts']}/{i['max_attempts']}",
             i["due_at"] or "", i["batch_id"] or "") for i in items]
    header = ("KEY", "STATUS", "TYPE", "ATTEMPTS", "DUE_AT", "BATCH")
    widths = [max(len(str(r[c])) for r in [header, *rows]) for c in range(len(header))]
    for row in [header, *rows]:
        out.write("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() + "\n")
    if query["cursor"]:
        out.write(f"more: coworker list --status {args.status} --cursor {query['cursor']}  (or --all)\n")
    return EXIT_OK


def _batch_line(batch: dict[str, Any]) -> str:
    line = f"finished {batch['finished']}, ignored {batch['ignored']}, open {batch['open']}"
    if batch.get("state") == "failed":
        return line + f" - FAILED: {batch.get('failure_reason')} (coworker retry --batch {batch['batch_id']})"
    return line + (" - done" if batch["done"] else "")


def cmd_batch(client: ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    path = f"/batches/{_key_path(args.batch_id)}"
    batch = client.request("GET", path)
    if args.once or args.json:
        if args.json:
            _print_json(batch, out)
        else:
            out.write(f"batch {batch['batch_id']}: {batch['total']} tasks, {_batch_line(batch)}\n")
        return EXIT_OK
    progress = Progress(batch["total"], out)
    try:
        while True:
            progress.total = batch["total"]
            progress.show(batch["finished"] + batch["ignored"], _batch_line(batch))
            if batch["done"]:
                return EXIT_OK
            time.sleep(args.interval)
            batch = client.request("GET", path)
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        progress.close()


def cmd_retry(client: ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if (args.key is None) == (args.batch is None):
        raise UsageError("give a task KEY or --batch ID (not both)")
    if args.key is not None:
        task = client.request("POST", f"/tasks/{_key_path(args.key)}/retry")
        if args.json:
            _print_json(task, out)
        else:
            out.write(f"{task['key']}: {task['status']} (attempts reset, history kept)\n")
        return EXIT_OK
    redriven = skipped = 0
    cursor = None
    while True:  # the API redrives a bounded slice per request and hands back a cursor
        answer = client.request("POST", f"/batches/{_key_path(args.batch)}/retry",
                                query={"status": args.status, "cursor": cursor})
        redriven += answer["redriven"]
        skipped += answer["skipped"]
        cursor = answer["cursor"]
        if not cursor:
            break
    if args.json:
        _print_json({"batch_id": args.batch, "status": args.status, "redriven": redriven,
                     "skipped": skipped}, out)
    else:
        out.write(f"batch {args.batch}: {redriven} {args.status} tasks redriven"
                  + (f", {skipped} skipped (changed meanwhile)" if skipped else "") + "\n")
    return EXIT_OK


def cmd_cancel(client: ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    task = client.request("POST", f"/tasks/{_key_path(args.key)}/cancel")
    if args.json:
        _print_json(task, out)
    else:
        out.write(f"{task['key']}: {task['status']} (cancelled)\n")
    return EXIT_OK


BULK_PAGE = 200  # tasks changed per request (the API's limit)
BULK_COUNT_PAGE = 1000  # tasks counted per dry-run request


def _bulk_body(args: argparse.Namespace) -> dict[str, Any]:
    body = {"action": args.action, "status": args.status, "type": args.type, "batch_id": args.batch,
            "created_after": args.created_after, "created_before": args.created_before}
    return {name: value for name, value in body.items() if value is not None}


def _bulk_pages(client: ApiClient, body: dict[str, Any], cursor: str | None):
    """Each answer of the bulk route, page after page, to the end."""
    while True:
        answer = client.request("POST", "/bulk", body=body | ({"cursor": cursor} if cursor else {}))
        yield answer
        cursor = answer["cursor"]
        if not cursor:
            return


def cmd_bulk(client: ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Count the matching tasks (a dry run), then act on them page by page with a progress bar.
    Interrupted, it prints how far it got and the command that resumes; running the same command
    again is safe too (changed tasks no longer match)."""
    body = _bulk_body(args)
    verb = "retried" if args.action == "retry" else "cancelled"
    total = None
    if args.dry_run or not args.no_count:
        counting = Progress(None, err, enabled=not args.json)
        total = scanned = 0
        for answer in _bulk_pages(client, body | {"dry_run": True, "limit": BULK_COUNT_PAGE}, args.cursor):
            total += answer["matched"]
            scanned += answer["scanned"]
            counting.show(total, f"matching {args.status} tasks found ({scanned} read)")
        counting.close()
        if args.dry_run:
            if args.json:
                _print_json({**body, "dry_run": True, "matched": total}, out)
            else:
                out.write(f"{total} {args.status} tasks would be {verb} (dry run: nothing changed)\n")
            return EXIT_OK
    progress = Progress(total, err, enabled=not args.json)
    changed = skipped = 0
    cursor = args.cursor
    try:
        for answer in _bulk_pages(client, body | {"limit": args.page}, args.cursor):
            changed += answer["changed"]
            skipped += answer["skipped"]
            cursor = answer["cursor"]
            progress.show(changed + skipped, f"{verb} {changed}" + (f", skipped {skipped}" if skipped else ""))
    except (KeyboardInterrupt, ApiError, Unreachable) as exc:
        progress.close()
        flags = [*_bulk_flags(args), *(["--cursor", cursor] if cursor else [])]
        resume = shlex.join(["coworker", "bulk", args.action, *flags])
        err.write(f"stopped after {changed} tasks {verb}" + (f" ({exc})" if str(exc) else "") + "\n"
                  f"resume with: {resume}\n(or run the same command again: {verb} tasks no longer match)\n")
        return EXIT_API_ERROR
    progress.close()
    if args.json:
        _print_json({**body, "changed": changed, "skipped": skipped}, out)
    else:
        out.write(f"{changed} {args.status} tasks {verb}"
                  + (f", {skipped} skipped (they changed state meanwhile)" if skipped else "") + "\n")
    return EXIT_OK


def _bulk_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--status", args.status]
    for flag, value in (("--type", args.type), ("--batch", args.batch), ("--created-after", args.created_after),
                        ("--created-before", args.created_before)):
        if value is not None:
            flags += [flag, value]
    return [*flags, "--no-count"]


def _type_line(entry: dict[str, Any]) -> str:
    state = "paused" if entry["paused"] else "running"
    held = f", {entry['held']} held" if entry["held"] else ""
    limit = ""
    if entry.get("limit") is not None:
        limit = f", limit {entry['limit']} ({entry['running']} running, {entry['blocked']} waiting)"
    unregistered = "" if entry["registered"] else " (no handler here)"
    return f"{entry['type']}: {state}{held}{limit}{unregistered}"


def cmd_types(client: ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    answer = client.request("GET", "/types")
    if args.json:
        _print_json(answer, out)
    else:
        out.writelines(_type_line(entry) + "\n" for entry in answer["types"])
    return EXIT_OK


def cmd_pause(client: ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    verb = "pause" if args.command == "pause" else "resume"
    answer = client.request("POST", f"/types/{_key_path(args.type)}/{verb}")
    if args.json:
        _print_json(answer, out)
    else:
        already = "" if answer["changed"] else f" (it was {verb}d already)"
        out.write(_type_line(answer) + already + "\n")
    return EXIT_OK


def cmd_limit(client: ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.limit.lower() in ("none", "off"):
        limit = None
    else:
        try:
            limit = int(args.limit)
        except ValueError:
            raise UsageError(f"LIMIT must be a whole number or 'none', not {args.limit!r}") from None
    answer = client.request("PUT", f"/types/{_key_path(args.type)}/limit", body={"limit": limit})
    if args.json:
        _print_json(answer, out)
    else:
        already = "" if answer["changed"] else " (unchanged)"
        out.write(_type_line(answer) + already + "\n")
    return EXIT_OK


def cmd_stats(client: ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    stats = client.request("GET", "/stats", query={"cap": args.cap})
    if args.json:
        _print_json(stats, out)
        return EXIT_OK
    for status, value in stats["counts"].items():
        if value["count"] is None:
            shown = "not counted"
        else:
            shown = ("at least " if value["capped"] else "") + str(value["count"])
        out.write(f"{status:<11} {shown}\n")
    out.write(stats["note"] + "\n")
    return EXIT_OK


# -- argument parsing --------------------------------------------------------------------------

def _chunk_size(text: str) -> int:
    value = int(text)
    if not 1 <= value <= CHUNK_TASKS:
        raise argparse.ArgumentTypeError(f"must be between 1 and {CHUNK_TASKS} (the API's batch limit)")
    return value


def build_parser() -> argparse.ArgumentParser:
    def connection_options(target: argparse.ArgumentParser, defaults: bool) -> None:
        # Accepted before and after the command; after it, only what is given overrides.
        def default(value: Any) -> Any:
            return value if defaults else argparse.SUPPRESS

        target.add_argument("--url", default=default(os.environ.get("COWORKER_API_URL", DEFAULT_URL)),
                            help=f"API base URL (env COWORKER_API_URL; default {DEFAULT_URL})")
        target.add_argument("--api-key", dest="api_key", default=default(os.environ.get("COWORKER_API_KEY")),
                            help="API key sent as x-api-key (env COWORKER_API_KEY)")
        target.add_argument("--iam", action="store_true", default=default(False),
                            help="sign requests with SigV4 (AWS credentials) for an IAM-authorized API")
        target.add_argument("--region", default=default(None), help="region for --iam (default AWS_REGION)")
        target.add_argument("--json", action="store_true", default=default(False),
                            help="print the API's JSON answers")

    parser = argparse.ArgumentParser(prog="coworker", description="Client of the Coworker task API.")
    connection_options(parser, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    connection_options(common, defaults=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_parser = commands.add_parser

    def add_parser(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return _add_parser(name, parents=[common], **kwargs)

    commands.add_parser = add_parser  # type: ignore[method-assign]

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
    submit.add_argument("--file", help="JSON lines, one task object per line; '-' reads stdin")
    submit.add_argument("--batch-id", dest="batch_id", help="batch id for --file (generated when absent)")
    submit.add_argument("--chunk-size", dest="chunk_size", type=_chunk_size, default=CHUNK_TASKS,
                        metavar=f"1..{CHUNK_TASKS}", help="tasks per request (default %(default)s)")
    submit.add_argument("--quiet", action="store_true", help="no progress bar")
    submit.set_defaults(run=cmd_submit)

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

    stats = commands.add_parser("stats", help="counts by status (bounded)")
    stats.add_argument("--cap", type=int, help="most entries counted per status")
    stats.set_defaults(run=cmd_stats)
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
    return parser


def cmd_migrate_index(client: ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Reshard the table's indexed items (see :mod:`coworker_local.migration`)."""
    from concurrent.futures import ThreadPoolExecutor

    from coworker.config import Settings
    from coworker.data import connection
    from coworker.errors import ConfigurationError

    from coworker_local import migration

    if not args.table:
        raise UsageError("--table (or COWORKER_TABLE_NAME) is required")
    if args.segments < 1:
        raise UsageError("--segments must be at least 1")
    overrides: dict[str, Any] = {"table_name": args.table, "dynamodb_endpoint": args.endpoint}
    if args.shards is not None:
        overrides["status_shards"] = args.shards
    if args.region:
        overrides["region"] = args.region
    try:
        settings = Settings.from_env(**overrides)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
    connection.bind(settings)

    def run(segment: int) -> migration.ReshardReport:
        return migration.reshard(dry_run=args.dry_run, segment=segment if args.segments > 1 else None,
                                 total_segments=args.segments if args.segments > 1 else None)

    with ThreadPoolExecutor(max_workers=args.segments) as pool:
        reports = list(pool.map(run, range(args.segments)))
    scanned = sum(r.scanned for r in reports)
    moved = sum(r.moved for r in reports)
    meanwhile = sum(r.changed_meanwhile for r in reports)
    verb = "would move" if args.dry_run else "moved"
    out.write(f"{settings.table_name}: {scanned} indexed items, {verb} {moved} to their shard "
              f"({settings.status_shards} per status); {meanwhile} were rewritten by a worker meanwhile\n")
    return EXIT_OK


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run one command; returns the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    args = parser.parse_args(argv)
    client = ApiClient(args.url, api_key=args.api_key, iam=args.iam, region=args.region)
    try:
        return args.run(client, args, out, err)
    except UsageError as exc:
        err.write(f"coworker: error: {exc}\n")
        return EXIT_USAGE
    except ApiError as exc:
        err.write(f"error ({exc.status}): {exc.message}\n")
        for detail in exc.errors[:20]:
            err.write(f"  {detail.get('location', '?')}: {detail.get('message', '')}\n")
        if len(exc.errors) > 20:
            err.write(f"  ... and {len(exc.errors) - 20} more\n")
        return EXIT_API_ERROR
    except Unreachable as exc:
        err.write(f"error: {exc}\n")
        return EXIT_UNREACHABLE


if __name__ == "__main__":
    sys.exit(main())
