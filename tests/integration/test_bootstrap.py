"""Process start-up: the DynamoDB clients are built once, before any worker thread needs one."""

from __future__ import annotations

import threading
import time

import botocore.session
from coworker.data import connection, models
from coworker.engine import submit
from coworker.engine.outcomes import TaskOutcome
from coworker.engine.tasks import TaskSpec
from coworker.engine.worker import run_batch


def test_configure_builds_the_clients_so_a_cold_batch_of_threads_builds_none(make_settings, monkeypatch):
    # Given a process configured as a cold worker is (make_settings calls bootstrap.configure)
    created: list[str] = []
    original = botocore.session.Session.create_client

    def counting(self, service_name, *args, **kwargs):
        created.append(service_name)
        return original(self, service_name, *args, **kwargs)

    monkeypatch.setattr(botocore.session.Session, "create_client", counting)
    settings = make_settings()
    built_at_start = len(created)

    # When 8 threads put tasks at once (plain and in a batch: both connections) and a batch runs
    start = threading.Barrier(8)

    def put(i: int) -> None:
        start.wait()
        submit.put_task(TaskSpec(key=f"t{i}", type="quick", batch_id="b1" if i % 2 else None), settings)

    threads = [threading.Thread(target=put, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    reports = run_batch([f"t{i}" for i in range(8)], "w", settings, time.monotonic() + 60)

    # Then every task ran, and no thread built a client of its own
    assert [r.outcome for r in reports] == [TaskOutcome.FINISHED] * 8
    assert created[built_at_start:] == []
    # and every model and the transactions' connection send through the one client built at start
    connections = [m._get_connection().connection for m in models.ALL_MODELS] + [connection.transaction_connection()]
    assert len({id(each.client) for each in connections}) == 1
