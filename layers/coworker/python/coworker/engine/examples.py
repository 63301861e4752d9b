"""Example handlers shipped with Coworker, used by the demo workload and the tests.

Payload fields are optional; defaults keep the demo quick. A payload is a JSON object (or none);
each type's ``validate_payload`` check refuses anything else at submit (422) and, for a task
that got in anyway, as a business failure that is not retried.
"""

from __future__ import annotations

import hashlib
import random
import time
from typing import Any

from coworker.engine.callbacks import read_results
from coworker.engine.handlers import TaskContext, task_handler
from coworker.engine.tasks import MAX_TIMEOUT_SECONDS
from coworker.errors import TaskFailed


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fields(payload: Any, checks: dict[str, tuple[Any, str]]) -> str | None:
    """The problem with an object payload: not an object, or a field (of ``checks``: name ->
    (test, what it must be)) that fails its test. Other fields are let through."""
    if payload is None:
        return None
    if not isinstance(payload, dict):
        return f"the payload must be a JSON object, not {type(payload).__name__}"
    for name, (test, what) in checks.items():
        if name in payload and not test(payload[name]):
            return f"payload.{name} must be {what}, not {payload[name]!r}"
    return None


@task_handler("quick")
def quick(payload: Any, context: TaskContext) -> dict[str, Any]:
    """Hash the payload (any JSON value): a task that takes a few milliseconds."""
    text = repr(sorted((payload or {}).items())) if isinstance(payload, dict | None) else repr(payload)
    return {"sha256": hashlib.sha256(text.encode()).hexdigest()[:16]}


def slow_problem(payload: Any) -> str | None:
    """``slow``'s payload check: ``seconds`` from 0 to the longest time limit."""
    return _fields(payload, {"seconds": (lambda v: _is_number(v) and 0 <= v <= MAX_TIMEOUT_SECONDS,
                                         f"a number of seconds from 0 to {MAX_TIMEOUT_SECONDS:g}")})


@task_handler("slow", validate_payload=slow_problem)
def slow(payload: dict[str, Any] | None, context: TaskContext) -> dict[str, Any]:
    """Sleep ``seconds`` (default 1), standing in for a long download or a data file."""
    seconds = float((payload or {}).get("seconds", 1.0))
    time.sleep(seconds)
    return {"slept": seconds}


def flaky_problem(payload: Any) -> str | None:
    """``flaky``'s payload check: ``failure_rate`` 0-1, ``fail_attempts`` a whole number."""
    return _fields(payload, {"failure_rate": (lambda v: _is_number(v) and 0 <= v <= 1, "a number from 0 to 1"),
                             "fail_attempts": (lambda v: _is_whole(v) and v >= 0, "a whole number, 0 or more")})


@task_handler("flaky", validate_payload=flaky_problem)
def flaky(payload: dict[str, Any] | None, context: TaskContext) -> dict[str, Any]:
    """Fail with probability ``failure_rate`` (default 0.3): system errors, then success on a retry.

    ``fail_attempts`` makes it deterministic: attempts up to that number fail.
    """
    payload = payload or {}
    if "fail_attempts" in payload:
        failing = context.attempt <= int(payload["fail_attempts"])
    else:
        failing = random.random() < float(payload.get("failure_rate", 0.3))
    if failing:
        raise ConnectionError(f"upstream reset the connection (attempt {context.attempt})")
    return {"attempt": context.attempt}


def always_fail_problem(payload: Any) -> str | None:
    """``always-fail``'s payload check: ``reason`` is text."""
    return _fields(payload, {"reason": (lambda v: isinstance(v, str), "text")})


@task_handler("always-fail", validate_payload=always_fail_problem)
def always_fail(payload: dict[str, Any] | None, context: TaskContext) -> None:
    """A business failure on every attempt: ends ignored at the ceiling."""
    raise TaskFailed((payload or {}).get("reason", "the order references an unknown product"))


# The example crawl's bounds: at most 11,111 pages from one seed. Its defaults: 13 pages.
MAX_CRAWL_FANOUT = 10
MAX_CRAWL_DEPTH = 4
CRAWL_FANOUT = 3
CRAWL_DEPTH = 2


def crawl_key(url: str, prefix: str = "crawl") -> str:
    """The task key of a page of the example crawl: one key per URL (give the seed this key)."""
    return f"{prefix}:{hashlib.sha256(url.encode()).hexdigest()[:20]}"


def crawl_problem(payload: Any) -> str | None:
    """``crawl``'s payload check: the site's shape within its bounds (one request must not ask
    for ``fanout ** max_depth`` pages), a rate of 1-1,000 pages a second, text where text goes."""
    text = (lambda v: isinstance(v, str) and v != "", "text")
    return _fields(payload, {
        "url": text, "seed": text, "domain": text, "key_prefix": text,
        "fanout": (lambda v: _is_whole(v) and 0 <= v <= MAX_CRAWL_FANOUT,
                   f"a whole number from 0 to {MAX_CRAWL_FANOUT} (a crawl has at most "
                   f"{sum(MAX_CRAWL_FANOUT ** n for n in range(MAX_CRAWL_DEPTH + 1)):,} pages)"),
        "max_depth": (lambda v: _is_whole(v) and 0 <= v <= MAX_CRAWL_DEPTH,
                      f"a whole number from 0 to {MAX_CRAWL_DEPTH}"),
        "depth": (lambda v: _is_whole(v) and 0 <= v <= MAX_CRAWL_DEPTH, f"a whole number from 0 to {MAX_CRAWL_DEPTH}"),
        "link_back": (lambda v: isinstance(v, bool), "true or false"),
        "rate_per_second": (lambda v: _is_whole(v) and 1 <= v <= 1000, "a whole number of pages per second, 1-1000"),
    })


@task_handler("crawl", validate_payload=crawl_problem)
def crawl(payload: dict[str, Any] | None, context: TaskContext) -> dict[str, Any]:
    """Crawl one page of a made-up site and spawn a task per link found: a crawl in miniature.

    The page at ``url`` (default ``/``) links to ``fanout`` (default 3) pages one level deeper,
    until ``max_depth`` (default 2): one seed grows to 1 + 3 + 9 = 13 pages unless it asks for
    more (at most fanout 10 and max_depth 4, checked at submit). Each link's task key is
    :func:`crawl_key` of its URL; the follow-ups join the seed's batch and keep the seed's
    concurrency and rate limits (``inherit_limits``), so a limit put on the seed holds for the
    whole crawl. With ``link_back: true`` every page also links back to the seed and its own
    parent, as real pages do: their keys exist (give the seed the key ``crawl_key(url)``), so
    each page is still crawled once.

    Politeness: with ``rate_per_second`` (1-1,000), every page it spawns carries the rate key
    ``domain`` (default ``example.test``) with that limit, so the crawl fetches at most that
    many pages of the site per second across every worker (put the seed with the same rate, or
    set the key's limit: ``PUT /rate-limits/key:<domain>``). The result says when the page was
    fetched (``fetched_at``, epoch seconds).
    """
    payload = payload or {}
    url = str(payload.get("url", "/"))
    seed = str(payload.get("seed", url))
    depth = int(payload.get("depth", 0))
    max_depth = int(payload.get("max_depth", CRAWL_DEPTH))
    fanout = int(payload.get("fanout", CRAWL_FANOUT))
    fetched_at = time.time()
    polite: dict[str, Any] = {}
    if payload.get("rate_per_second") is not None:
        polite = {"rate_key": str(payload.get("domain", "example.test")), "rate_limit": payload["rate_per_second"]}
    prefix = str(payload.get("key_prefix", "crawl"))
    links = [(url.rstrip("/") + f"/{n}", depth + 1) for n in range(fanout)] if depth < max_depth else []
    if payload.get("link_back") and depth > 0:
        # Already crawled (or being crawled): their keys exist, so these puts find them.
        parent = seed if depth == 1 else url.rsplit("/", 1)[0]
        links += [(seed, 0)] + ([(parent, depth - 1)] if parent != seed else [])
    for link, link_depth in links:
        context.spawn("crawl", {**payload, "url": link, "seed": seed, "depth": link_depth},
                      key=crawl_key(link, prefix), inherit_batch=True, inherit_limits=True, **polite)
    return {"url": url, "depth": depth, "links": len(links), "fetched_at": fetched_at}


def crawl_urls(fanout: int = CRAWL_FANOUT, max_depth: int = CRAWL_DEPTH, seed: str = "/") -> list[tuple[str, int]]:
    """Every page of the example crawl's made-up site, with its depth, the seed first."""
    pages = [(seed, 0)]
    level = [seed]
    for depth in range(1, max_depth + 1):
        level = [url.rstrip("/") + f"/{n}" for url in level for n in range(fanout)]
        pages += [(url, depth) for url in level]
    return pages


@task_handler("crawl-summary")
def crawl_summary(payload: Any, context: TaskContext) -> dict[str, Any]:
    """The example crawl's batch callback: what the crawl found, read from its pages' results.

    Name it as the crawl batch's ``complete`` callback with the crawl's payload (``url``,
    ``fanout``, ``max_depth``, ``key_prefix``) as its own; it reads every page's result by key
    (``read_results``, 100 keys a request) and returns the summary, kept as its result.
    """
    # A callback's payload is {"event", "batch", "payload": <its own>}: checked here, not at submit.
    crawl = payload.get("payload") if isinstance(payload, dict) else None
    problem = crawl_problem(crawl) if isinstance(payload, dict) else "the payload must be a batch callback's"
    if problem is not None:
        raise TaskFailed(f"crawl-summary: {problem}", retryable=False)
    crawl = crawl or {}
    fanout, max_depth = int(crawl.get("fanout", CRAWL_FANOUT)), int(crawl.get("max_depth", CRAWL_DEPTH))
    prefix = str(crawl.get("key_prefix", "crawl"))
    pages = crawl_urls(fanout, max_depth, str(crawl.get("url", "/")))
    keys = {crawl_key(url, prefix): (url, depth) for url, depth in pages}
    results = read_results(list(keys))
    by_depth: dict[str, int] = {}
    for key in results:
        depth = str(keys[key][1])
        by_depth[depth] = by_depth.get(depth, 0) + 1
    missing = [keys[key][0] for key in keys if key not in results]
    batch = payload.get("batch") or {}
    return {"event": payload.get("event"), "pages_crawled": len(results), "pages_on_site": len(pages),
            "by_depth": by_depth, "links_seen": sum(int(result.get("links", 0)) for result in results.values()),
            "not_crawled": missing[:10], "not_crawled_count": len(missing),
            "batch": {name: batch.get(name) for name in ("batch_id", "total", "finished", "ignored", "state")}}
