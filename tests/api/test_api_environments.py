"""The local API's execution environments: the handler runs in processes of its own, several
requests side by side, with Lambda's and API Gateway's answers to timeouts and crashes."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from coworker_local.api_environments import ApiEnvironmentPool, ApiStartError
from coworker_local.gateway import LocalGateway

from tests.support.waits import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
PROBE = "tests.support.api_probe.handler"


@pytest.fixture
def serve():
    """Serve the probe handler through a pool of environments: ``serve(max_environments=N, ...)``."""
    started: list[tuple[LocalGateway, ApiEnvironmentPool]] = []

    def start(**options) -> tuple[str, ApiEnvironmentPool]:
        environ = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO_ROOT)}
        pool = ApiEnvironmentPool(environ, handler=PROBE, **options)
        pool.wait_prewarmed()
        gateway = LocalGateway(pool, concurrent=True).start()
        started.append((gateway, pool))
        return gateway.url, pool

    yield start
    for gateway, pool in started:
        gateway.stop()
        pool.shutdown(grace_seconds=0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_requests_run_side_by_side_each_in_a_process_of_its_own(serve, tmp_path):
    """Three requests that each wait until all three have arrived: a gateway that ran one at a
    time would never get them together (each gives up after 25 s and says so). All three
    processes are started first, so no cold start has to fit in that wait on a busy machine."""
    url, pool = serve(max_environments=3, prewarm=3)
    with ThreadPoolExecutor(3) as client:
        answers = list(client.map(
            lambda _: requests.get(f"{url}/rendezvous", params={"folder": str(tmp_path), "count": 3}, timeout=60),
            range(3)))
    assert [a.status_code for a in answers] == [200, 200, 200]
    bodies = [a.json() for a in answers]
    assert all(body["met"] for body in bodies)
    assert len({body["pid"] for body in bodies}) == 3
    assert os.getpid() not in {body["pid"] for body in bodies}
    assert pool.stats()["requests"] == 3


def test_more_requests_than_environments_wait_for_a_free_one(serve):
    url, pool = serve(max_environments=2)
    with ThreadPoolExecutor(6) as client:
        answers = list(client.map(lambda _: requests.get(f"{url}/sleep", params={"seconds": 0.2}, timeout=60),
                                  range(6)))
    assert [a.status_code for a in answers] == [200] * 6
    assert len({a.json()["pid"] for a in answers}) <= 2
    stats = pool.stats()
    assert stats["requests"] == 6 and stats["busy"] == 0 and len(stats["pids"]) <= 2


def test_requests_and_answers_of_megabytes_pass_whole(serve):
    url, _ = serve(max_environments=1)
    answer = requests.post(f"{url}/big", params={"bytes": 5_000_000}, data="y" * 5_000_000, timeout=60)
    assert answer.status_code == 200 and len(answer.json()["filler"]) == 5_000_000


def test_a_handler_that_raises_answers_502_and_its_environment_serves_the_next_request(serve):
    url, pool = serve(max_environments=1)
    first = requests.get(f"{url}/pid", timeout=30).json()["pid"]
    failed = requests.get(f"{url}/raise", timeout=30)
    assert failed.status_code == 502
    assert failed.json() == {"message": "Internal server error"}
    assert requests.get(f"{url}/pid", timeout=30).json()["pid"] == first
    assert pool.stats()["errors"] == 1


def test_a_crashed_environment_answers_502_and_the_next_request_gets_a_new_one(serve):
    url, pool = serve(max_environments=1)
    first = requests.get(f"{url}/pid", timeout=30).json()["pid"]
    assert requests.get(f"{url}/crash", timeout=30).status_code == 502
    second = requests.get(f"{url}/pid", timeout=30)
    assert second.status_code == 200 and second.json()["pid"] != first
    assert not _alive(first)
    assert pool.stats()["crashed"] == 1


def test_a_request_past_the_timeout_answers_504_and_its_environment_is_ended(serve):
    # A timeout that a quick request meets even on a busy machine, and a request far past it
    url, pool = serve(max_environments=1, timeout_seconds=10.0)
    first = requests.get(f"{url}/pid", timeout=30).json()["pid"]
    late = requests.get(f"{url}/sleep", params={"seconds": 60}, timeout=30)
    assert late.status_code == 504
    assert late.json() == {"message": "Endpoint request timed out"}
    wait_until(lambda: not _alive(first), "the timed-out environment to be ended")
    assert requests.get(f"{url}/pid", timeout=30).json()["pid"] != first
    assert pool.stats()["timed-out"] == 1


def test_a_stopped_pool_ends_its_environments(serve):
    url, pool = serve(max_environments=2)
    pid = requests.get(f"{url}/pid", timeout=30).json()["pid"]
    pool.shutdown(grace_seconds=0)
    assert not _alive(pid)
    assert requests.get(f"{url}/pid", timeout=30).status_code == 502


def test_a_handler_that_cannot_be_imported_fails_the_start_and_answers_502():
    environ = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO_ROOT)}
    pool = ApiEnvironmentPool(environ, handler="tests.support.no_such_module.handler")
    try:
        with pytest.raises(ApiStartError, match="could not import its handler"):
            pool.wait_prewarmed()
        with LocalGateway(pool, concurrent=True) as gateway:
            answer = requests.get(f"{gateway.url}/pid", timeout=60)
        assert answer.status_code == 502
        assert pool.stats()["init-failed"] == 2  # the prewarmed one and the request's
    finally:
        pool.shutdown(grace_seconds=0)
