"""What each ``coworker`` command does (see :mod:`coworker_local.cli`, which parses the command line).

Every ``cmd_*`` function takes the API client, the parsed arguments and the output and error
streams, and returns the exit code; a command line that cannot be carried out raises
:class:`UsageError`, the API's refusals :class:`~coworker_local.api_client.ApiError`.
"""

from __future__ import annotations

import argparse
import io
import json
import shlex
import sys
import time
import uuid
from collections.abc import Iterable
from typing import Any, TextIO
from urllib.parse import quote

from coworker_local.api_client import ApiClient, ApiError, Unreachable
from coworker_local.client import RATE_PAGE, SCHEDULE_PAGE, TYPE_PAGE, Coworker, SubmitStopped, Submitted

# What one POST /tasks may carry: the API's batch limit, and under Lambda's 6 MB request limit.

EXIT_OK, EXIT_API_ERROR, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
EXIT_BROKEN_PIPE = 141  # the shell's code for a command stopped by SIGPIPE
# Problems listed in one message at most (a file of 100,000 bad lines is summed up, not printed).
LISTED_PROBLEMS = 20


class UsageError(Exception):
    """The command line asks for something that cannot be done."""


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


def write_api_error(exc: ApiError, err: TextIO) -> None:
    """The API's refusal as worded, then each of its problems that the wording does not already
    show (the API's message names the first few), at most LISTED_PROBLEMS."""
    err.write(f"error ({exc.status}): {exc.message}\n")
    details = [f"{detail.get('location', '?')}: {detail.get('message', '')}" for detail in exc.errors]
    _write_listed([line for line in details if line not in exc.message], err, "problems")


def _write_listed(lines: list[str], err: TextIO, what: str) -> None:
    err.writelines(f"  {line}\n" for line in lines[:LISTED_PROBLEMS])
    if len(lines) > LISTED_PROBLEMS:
        err.write(f"  ... and {len(lines) - LISTED_PROBLEMS} more {what}\n")


# -- commands ----------------------------------------------------------------------------------

def _json_flag(text: str, flag: str) -> Any:
    """The JSON value of a flag, or a usage error naming it."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{flag} is not valid JSON: {exc}") from None


def _task_from_flags(args: argparse.Namespace) -> dict[str, Any]:
    # A key of its own, so that a put the API asks to re-send is stored once.
    task: dict[str, Any] = {"type": args.type, "key": args.key if args.key is not None else str(uuid.uuid4())}
    if args.payload is not None:
        task["payload"] = _json_flag(args.payload, "--payload")
    for name in ("max_attempts", "run_at", "priority", "concurrency_key", "concurrency_limit", "rate_key",
                 "rate_limit", "rate_interval_seconds", "timeout_seconds"):
        if getattr(args, name) is not None:
            task[name] = getattr(args, name)
    return task


Line = tuple[int, dict[str, Any]]  # a task of a file, with its line number (from 1)


def _read_tasks(lines: Iterable[str], source: str, batch_id: str) -> list[Line]:
    """Every task of a JSON-lines file with its line number, each checked against the task rules
    before anything is sent (a :class:`UsageError` lists the bad lines: the first LISTED_PROBLEMS
    and how many more). A task without a key gets ``<batch id>:<line>``: re-running the same file
    with the same batch id stores each task once, including those stored before a refusal."""
    tasks: list[Line] = []
    problems: list[tuple[int, str]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except ValueError as exc:
            problems.append((number, f"not valid JSON ({exc})"))
            continue
        if not isinstance(task, dict):
            problems.append((number, f"expected a JSON object, got {type(task).__name__}"))
            continue
        if task.get("key") is None:
            task["key"] = f"{batch_id}:{number}"
        tasks.append((number, task))
    problems += _task_problems(tasks)
    if problems:
        problems.sort()
        listed = [f"line {number}: {problem}" for number, problem in problems]
        bad = len({number for number, _ in problems})
        lines_listed = io.StringIO()
        _write_listed(listed, lines_listed, "problems")
        raise UsageError(f"{source}: {bad} bad line{'' if bad == 1 else 's'}; nothing was sent\n"
                         + lines_listed.getvalue().rstrip("\n"))
    return tasks


def _task_problems(tasks: list[Line]) -> list[tuple[int, str]]:
    """What the task rules (the API's own model, ``NewTask``) refuse in ``tasks``, and keys that
    repeat, by line. The API still checks what only it knows (task types, time limits)."""
    from coworker.engine.tasks import NewTask
    from pydantic import ValidationError

    problems: list[tuple[int, str]] = []
    first_line: dict[Any, int] = {}
    for number, task in tasks:
        try:
            NewTask.model_validate(task)
        except ValidationError as exc:
            problems += [(number, _problem(error)) for error in exc.errors()]
        key = task["key"]
        if isinstance(key, str) and first_line.setdefault(key, number) != number:
            problems.append((number, f"key: repeats the key {key!r} of line {first_line[key]}"))
    return problems


def _problem(error: Any) -> str:
    """A pydantic error as ``field: message`` (worded as the API words them)."""
    field = ".".join(str(part) for part in error.get("loc", ())) or "task"
    message = str(error.get("msg", "invalid value"))
    if error.get("type") == "extra_forbidden":
        message = "unknown field"
    elif error.get("type") == "missing":
        message = "required field is missing"
    return f"{field}: {message.removeprefix('Value error, ')}"


def _callbacks(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The batch callbacks the --on-* flags name (with --callback-payload, if given)."""
    payload = _json_flag(args.callback_payload, "--callback-payload") if args.callback_payload is not None else None
    named = {event: getattr(args, f"on_{event}") for event in ("complete", "success", "stopped")}
    return {event: {"type": task_type, **({"payload": payload} if payload is not None else {})}
            for event, task_type in named.items() if task_type}


def cmd_submit(client: ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.file is None:
        if not args.type:
            raise UsageError("give --type (one task from flags) or --file (JSON lines, '-' for stdin)")
        if args.batch_id or _callbacks(args):
            raise UsageError("--batch-id and --on-* go with --file; a single task has no batch")
        answer = client.request("POST", "/tasks", body=_task_from_flags(args))
        if args.json:
            _print_json(answer, out)
        else:
            out.write(f"{answer['key']}: {answer['outcome']}\n")
        return EXIT_OK
    if args.type or args.key or args.payload:
        raise UsageError("--file cannot be combined with --type/--key/--payload")
    if args.file == "-":
        # Bytes, so that text that is not UTF-8 is told apart (a replaced stdin may have no buffer).
        stdin = getattr(sys.stdin, "buffer", None)
        data, source = (stdin.read() if stdin is not None else sys.stdin.read().encode()), "stdin"
    else:
        try:
            with open(args.file, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            raise UsageError(f"cannot read {args.file}: {exc.strerror}") from None
        source = args.file
    try:
        text = data.decode("utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise UsageError(f"{source}, line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x})") from None
    # One batch id for every request: the batch counts all of them, and re-running the command
    # with it stores only what is missing (keyless lines get keys derived from it).
    batch_id = args.batch_id or uuid.uuid4().hex
    lines = _read_tasks(text, source, batch_id)
    if not lines:
        raise UsageError(f"{source} holds no tasks")
    progress = Progress(len(lines), err, enabled=not args.quiet)

    def show(so_far: Submitted) -> None:
        progress.show(so_far.submitted, f"created {so_far.created}, existing {so_far.existing}")

    try:
        submitted = Coworker(api=client).submit([task for _, task in lines], batch_id=batch_id,
                                                chunk_size=args.chunk_size, on_progress=show,
                                                callbacks=_callbacks(args), parallel=args.parallel)
    except SubmitStopped as exc:
        progress.close()
        _write_stopped(exc, args, source, [number for number, _ in lines], out, err)
        return EXIT_API_ERROR
    progress.close()
    summary = {"batch_id": batch_id, "submitted": submitted.submitted, "created": submitted.created,
               "existing": submitted.existing}
    if args.json:
        _print_json(summary, out)
    else:
        out.write(f"batch {batch_id}: {submitted.submitted} submitted, {submitted.created} created, "
                  f"{submitted.existing} existing\n"
                  f"follow it with: coworker batch {batch_id}\n")
    return EXIT_OK


def _write_stopped(exc: SubmitStopped, args: argparse.Namespace, source: str, numbers: list[int],
                   out: TextIO, err: TextIO) -> None:
    """A file submit the API stopped: the refusal, its problems by line of the file, what is
    stored in which batch, and the command that stores the rest."""
    done = exc.submitted
    refused = numbers[exc.first:exc.first + exc.count]
    if exc.errors:  # a 4xx naming its problems: that request wrote nothing; say where they are
        wrote = "wrote nothing" if exc.status < 500 else "may have stored some of its tasks"
        err.write(f"error ({exc.status}): {source}: the API refused the request of lines "
                  f"{refused[0]}-{refused[-1]} ({len(exc.errors)} problem{'' if len(exc.errors) == 1 else 's'}; "
                  f"that request {wrote}):\n")
        _write_listed([_by_line(detail, numbers, exc.first) for detail in exc.errors], err, "problems")
    else:
        write_api_error(exc, err)
        err.write(f"(the refused request held lines {refused[0]}-{refused[-1]} of {source})\n")
    total = len(numbers)
    maybe = " at least" if exc.status >= 500 else ""
    err.write(f"stored in batch {done.batch_id}:{maybe} {done.created + done.existing} of {total} tasks "
              f"({done.created} created, {done.existing} existing)\n")
    rerun = ["coworker", "submit", "--file", args.file, "--batch-id", done.batch_id]
    for event in ("complete", "success", "stopped"):
        if getattr(args, f"on_{event}"):
            rerun += [f"--on-{event}", getattr(args, f"on_{event}")]
    if args.callback_payload is not None:
        rerun += ["--callback-payload", args.callback_payload]
    err.write(f"once it is fixed, store the rest with: {shlex.join(rerun)}\n"
              "(a task stored already is not stored again: each line keeps its key)\n")
    if args.json:
        _print_json({"batch_id": done.batch_id, "submitted": total, "stored": done.created + done.existing,
                     "created": done.created, "existing": done.existing, "stopped": True,
                     "refused_lines": [refused[0], refused[-1]]}, out)


def _by_line(detail: dict[str, Any], numbers: list[int], first: int) -> str:
    """A problem of a refused request, placed by the line of the file (its ``entry`` counts the
    request's tasks from 0)."""
    location, message = str(detail.get("location", "?")), str(detail.get("message", ""))
    entry = detail.get("entry")
    if not isinstance(entry, int) or not 0 <= first + entry < len(numbers):
        return f"{location}: {message}"
    field = location.split(f"tasks[{entry}]", 1)[-1].lstrip(".") or "task"
    return f"line {numbers[first + entry]}: {field}: {message}"


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
    if args.status in ("todo", "failed"):
        for note in _out_of_queue_notes(client, args.type):
            err.write(f"note: {note}\n")
    return EXIT_OK


def _out_of_queue_notes(client: ApiClient, task_type: str | None) -> list[str]:
    """What waits outside the status index, and so is not listed: tasks of paused types (held)
    and tasks waiting for a concurrency place (blocked)."""
    notes = []
    for entry in client.pages("/types", "types", {"limit": TYPE_PAGE}):
        name = entry["type"]
        if task_type is not None and name != task_type:
            continue
        if entry.get("held"):
            notes.append(f"{entry['held']} task(s) of type {name!r} are held out of the queue while it is paused, "
                         f"and not listed here (coworker resume {shlex.quote(name)})")
        if entry.get("blocked"):
            notes.append(f"{entry['blocked']} task(s) of type {name!r} wait for a place under its concurrency limit "
                         f"of {entry.get('limit')}, and are not listed here (coworker limit {shlex.quote(name)} N)")
    return notes


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
    timeout = f", time limit {entry['timeout_seconds']:g} s" if entry.get("timeout_seconds") is not None else ""
    runner = ", on the container runner" if entry.get("runner") == "container" else ""
    return f"{entry['type']}: {state}{held}{limit}{timeout}{runner}{unregistered}"


def cmd_types(client: ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    types = list(client.pages("/types", "types", {"limit": TYPE_PAGE}))  # every page
    if args.json:
        _print_json({"types": types}, out)
    else:
        out.writelines(_type_line(entry) + "\n" for entry in types)
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


def _limit_arg(text: str) -> int | None:
    """LIMIT as given on the command line: a whole number, or 'none' (or 'off') to lift it."""
    if text.lower() in ("none", "off"):
        return None
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"LIMIT must be a whole number or 'none', not {text!r}") from None


def cmd_limit(client: ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    answer = client.request("PUT", f"/types/{_key_path(args.type)}/limit", body={"limit": _limit_arg(args.limit)})
    if args.json:
        _print_json(answer, out)
    else:
        already = "" if answer["changed"] else " (unchanged)"
        out.write(_type_line(answer) + already + "\n")
    return EXIT_OK


# Where a group's limit comes from, as the API's ``source`` names it, in a line's words.
_RATE_SOURCES = {"last start": "carried by the task that started last; none is set",
                 "lifted": "the limit set was lifted"}


def _rate_line(entry: dict[str, Any]) -> str:
    source = _RATE_SOURCES.get(entry["source"], entry["source"])
    if entry["limit"] is None:
        line = f"{entry['group']}: not limited" + (f" ({source})" if entry["source"] == "lifted" else "")
        if entry.get("booked_until"):
            line += f", waiters booked until {entry['booked_until']}"
        return line
    line = (f"{entry['group']}: {entry['limit']} per {entry['interval_seconds']:g} s ({source}), "
            f"{entry['started_in_interval']} started in the last interval")
    if entry.get("next_free_at"):
        line += f", next start {entry['next_free_at']}"
    if entry.get("booked_until"):
        line += f", waiters booked until {entry['booked_until']}"
    return line


def cmd_rates(client: ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    limits = list(client.pages("/rate-limits", "limits", {"limit": RATE_PAGE}))  # every page, by group
    if args.json:
        _print_json({"limits": limits}, out)
    else:
        out.writelines(_rate_line(entry) + "\n" for entry in limits)
        if not limits:
            out.write("no rate limit is set (tasks may carry their own: coworker rate key:KEY shows one)\n")
    return EXIT_OK


def cmd_rate(client: ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    path = f"/rate-limits/{_key_path(args.group)}"
    if args.limit is None:
        answer = client.request("GET", path)
    else:
        answer = client.request("PUT", path, body={"limit": _limit_arg(args.limit), "interval_seconds": args.per})
    if args.json:
        _print_json(answer, out)
    else:
        already = " (unchanged)" if answer.get("changed") is False else ""
        out.write(_rate_line(answer) + already + "\n")
    return EXIT_OK


def _schedule_line(entry: dict[str, Any]) -> str:
    when = "paused" if entry["paused"] else f"next {entry['next_run_at']}"
    last = f", last put {entry['last_task_key']}" if entry.get("last_task_key") else ""
    return (f"{entry['name']}: {entry['expression']} ({entry['timezone']}, missed: {entry['missed']}) -> "
            f"{entry['task']['type']}; {when}{last}")


def cmd_schedules(client: ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # Every page, by name; a schedule that fired while the pages were read (and so moved on in
    # the listing's order) is shown once, as last read.
    found = {entry["name"]: entry for entry in client.pages("/schedules", "schedules", {"limit": SCHEDULE_PAGE})}
    schedules = [found[name] for name in sorted(found)]
    if args.json:
        _print_json({"schedules": schedules}, out)
    else:
        out.writelines(_schedule_line(entry) + "\n" for entry in schedules)
    return EXIT_OK


def cmd_schedule(client: ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    path = f"/schedules/{_key_path(args.name)}"
    if args.action == "put":
        if not args.expression or not args.type:
            raise UsageError("schedule put needs NAME, EXPRESSION and --type, e.g. "
                             "coworker schedule put nightly 'cron(0 3 * * *)' --type crawl")
        task: dict[str, Any] = {"type": args.type}
        if args.payload is not None:
            task["payload"] = _json_flag(args.payload, "--payload")
        if args.max_attempts is not None:
            task["max_attempts"] = args.max_attempts
        if args.timeout_seconds is not None:
            task["timeout_seconds"] = args.timeout_seconds
        body = {"expression": args.expression, "timezone": args.timezone, "missed": args.missed,
                "paused": args.paused, "task": task}
        answer = client.request("PUT", path, body=body)
    elif args.expression is not None:
        raise UsageError(f"schedule {args.action} takes only a NAME")
    elif args.action == "show":
        answer = client.request("GET", path)
    elif args.action == "delete":
        answer = client.request("DELETE", path)
    else:
        answer = client.request("POST", f"{path}/{args.action}")
    if args.json:
        _print_json(answer, out)
        return EXIT_OK
    notes = {"put": " (created)" if answer.get("created") else " (replaced)", "delete": " (deleted)"}
    note = notes.get(args.action, "")
    if args.action in ("pause", "resume") and not answer.get("changed"):
        note = f" (it was {args.action}d already)"
    out.write(_schedule_line(answer) + note + "\n")
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


def cmd_preflight(client: ApiClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Compare the account's real limits with what the stack as configured needs
    (see :mod:`coworker_local.preflight`): 0 all pass, 1 a deploy would fail."""
    from pathlib import Path

    from coworker_local import preflight

    try:
        needs = preflight.needs_of(preflight.context_of(Path(args.cdk_json), args.context or []))
        found = preflight.read_account(*preflight.aws_clients(args.region),
                                       stack_name=args.stack_name or preflight.DEFAULT_STACK_NAME)
    except preflight.PreflightError as exc:
        raise UsageError(str(exc)) from None
    results = preflight.checks(needs, found)
    out.write(preflight.report(needs, found, results, as_json=args.json))
    passed = all(check.verdict == preflight.OK for check in results)
    return preflight.EXIT_PASSED if passed else preflight.EXIT_WILL_FAIL
