"""The engine: what happens to tasks, on top of :mod:`coworker.data`.

From the bottom up: ``tasks`` (a task's shape and limits), ``offload``, ``handlers``,
``lifecycle`` (every state change of a task), ``control`` (pauses, type limits, stopped
batches), ``slots`` (worker slots: ``max_concurrency``), ``gates`` (per-group concurrency),
``batches`` and ``progress`` (batch counts from the table's stream), ``outcomes``, ``feeder``,
``heartbeat``, ``worker``, ``dispatch`` (starting workers; the coordinator's supervisor),
``submit`` and ``redrive``; ``examples`` registers the example task types. Nothing here
imports the API.
"""
