"""Example handlers shipped with Coworker, used by the demo workload and the tests.

Payload fields are optional; defaults keep the demo quick.
"""

from __future__ import annotations

import hashlib
import random
import time
from typing import Any

from coworker.engine.callbacks import read_results
from coworker.engine.handlers import TaskContext, task_handler
from coworker.errors import TaskFailed


@task_handler("quick")
def quick(payload: dict[str, Any] | None, context: TaskContext) -> dict[str, Any]:
    """Hash the payload: a task that takes a few milliseconds."""
    text = repr(sorted((payload or {}).items()))
    return {"sha256": hashlib.sha256(text.encode()).hexdigest()[:16]}


@task_handler("slow")
def slow(payload: dict[str, Any] | None, context: TaskContext) -> dict[str, Any]:
    """Sleep ``seconds`` (default 1), standing in for a long download or a data file."""
    seconds = float((payload or {}).get("seconds", 1.0))
    time.sleep(seconds)
    return {"slept": seconds}


@task_handler("flaky")
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


@task_handler("always-fail")
def always_fail(payload: dict[str, Any] | None, context: TaskContext) -> None:
    """A business failure on every attempt: ends ignored at the ceiling."""
    raise TaskFailed((payload or {}).get("reason", "the order references an unknown product"))


# The example crawl's bounds: at most 10,000 pages from one seed.
MAX_CRAWL_FANOUT = 10
MAX_CRAWL_DEPTH = 4


def crawl_key(url: str, prefix: str = "crawl") -> str:
    """The task key of a page of the example crawl: one key per URL (give the seed this key)."""
    return f"{prefix}:{hashlib.sha256(url.encode()).hexdigest()[:20]}"


@task_handler("crawl")
def crawl(payload: dict[str, Any] | None, context: TaskContext) -> dict[str, Any]:
    """Crawl one page of a made-up site and spawn a task per link found: a crawl in miniature.

    The page at ``url`` (default ``/``) links to ``fanout`` (default 10) pages one level deeper,
    until ``max_depth`` (default 3), and back to the home page and its own parent, as real pages
    do. Each link's task key is :func:`crawl_key` of its URL, so a page linked from many others
    (the home page, a parent) is crawled once; the follow-ups join the seed's batch. With the
    defaults, one seed (key ``crawl_key("/")``) grows to 1 + 10 + 100 + 1,000 = 1,111 tasks.

    Politeness: with ``rate_per_second`` (1-1,000), every page it spawns carries the rate key
    ``domain`` (default ``example.test``) with that limit, so the crawl fetches at most that
    many pages of the site per second across every worker (put the seed with the same rate, or
    set the key's limit: ``PUT /rate-limits/key:<domain>``). The result says when the page was
    fetched (``fetched_at``, epoch seconds).
    """
    payload = payload or {}
    url = str(payload.get("url", "/"))
    depth = int(payload.get("depth", 0))
    max_depth = int(payload.get("max_depth", 3))
    fanout = int(payload.get("fanout", 10))
    if not (0 <= max_depth <= MAX_CRAWL_DEPTH and 0 <= fanout <= MAX_CRAWL_FANOUT):
        # One request must not ask for fanout ** max_depth pages: refused, not retried.
        raise TaskFailed(f"crawl: fanout is 0-{MAX_CRAWL_FANOUT} and max_depth 0-{MAX_CRAWL_DEPTH} "
                         f"(a crawl of at most {MAX_CRAWL_FANOUT ** MAX_CRAWL_DEPTH:,} pages)", retryable=False)
    rate = payload.get("rate_per_second")
    if rate is not None and (not isinstance(rate, int) or isinstance(rate, bool) or not 1 <= rate <= 1000):
        raise TaskFailed("crawl: rate_per_second is a whole number of pages per second, 1-1000", retryable=False)
    fetched_at = time.time()
    polite: dict[str, Any] = {}
    if rate is not None:
        polite = {"rate_key": str(payload.get("domain", "example.test")), "rate_limit": rate}
    prefix = str(payload.get("key_prefix", "crawl"))
    parent = url.rsplit("/", 1)[0] or "/"
    links = [url.rstrip("/") + f"/{n}" for n in range(fanout)] if depth < max_depth else []
    seen_before = ["/", parent]  # already crawled (or being crawled): their keys exist
    for link, link_depth in [*((link, depth + 1) for link in links), *((old, 0) for old in seen_before)]:
        context.spawn("crawl", {**payload, "url": link, "depth": link_depth}, key=crawl_key(link, prefix),
                      inherit_batch=True, **polite)
    return {"url": url, "depth": depth, "links": len(links) + len(seen_before), "fetched_at": fetched_at}


def crawl_urls(fanout: int = 10, max_depth: int = 3) -> list[tuple[str, int]]:
    """Every page of the example crawl's made-up site, with its depth, home page first."""
    pages = [("/", 0)]
    level = ["/"]
    for depth in range(1, max_depth + 1):
        level = [url.rstrip("/") + f"/{n}" for url in level for n in range(fanout)]
        pages += [(url, depth) for url in level]
    return pages


@task_handler("crawl-summary")
def crawl_summary(payload: dict[str, Any], context: TaskContext) -> dict[str, Any]:
    """The example crawl's batch callback: what the crawl found, read from its pages' results.

    Name it as the crawl batch's ``complete`` callback with the crawl's ``fanout``, ``max_depth``
    and ``key_prefix`` as its payload; it reads every page's result by key (``read_results``,
    100 keys a request) and returns the summary, kept as its result.
    """
    crawl = payload.get("payload") or {}
    fanout, max_depth = int(crawl.get("fanout", 10)), int(crawl.get("max_depth", 3))
    if not (0 <= max_depth <= MAX_CRAWL_DEPTH and 0 <= fanout <= MAX_CRAWL_FANOUT):
        raise TaskFailed("crawl-summary: fanout is 0-10 and max_depth 0-4, as the crawl's", retryable=False)
    prefix = str(crawl.get("key_prefix", "crawl"))
    pages = crawl_urls(fanout, max_depth)
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
