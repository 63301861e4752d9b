"""Coworker: a coordinator-worker task system on DynamoDB (library shared by all functions).

The package is grouped by concern, each layer importing only the ones below it:

* ``coworker.data``   -- the one table: its layout and item kinds (``layout``), every pynamodb
  model (``models``), where requests go (``connection``), the conditional and transactional
  writes (``writes``) and the status-index reads (``index``). It knows nothing of the engine.
* ``coworker.engine`` -- what happens to tasks: their shape and limits (``tasks``), the
  lifecycle, handlers, worker (with its ``feeder`` and ``heartbeat``), worker ``slots``,
  concurrency ``gates``, ``control`` (pauses, limits), ``batches`` and their ``progress``,
  ``submit``, ``redrive``, ``offload`` and ``dispatch`` (the coordinator).
* ``coworker.api``    -- the HTTP API: app and error mapping, routes, request/response models,
  cursors, bulk actions.

Beside them, at the top: ``config`` (one place for settings), ``errors`` (every exception),
``observability`` (logger, metrics, tracer), ``bootstrap`` (process start-up) and ``testing``
(running one handler in a test). Client-side tools (the ``coworker`` CLI, the index migration,
the local runtime) live in ``coworker_local`` and never ship in the Lambda layer.
"""

from coworker.config import Settings
from coworker.engine.callbacks import read_results
from coworker.engine.handlers import TaskContext, task_handler
from coworker.errors import CoworkerError, TaskFailed, TaskFailedError

__all__ = ["CoworkerError", "Settings", "TaskContext", "TaskFailed", "TaskFailedError", "read_results",
           "task_handler"]
__version__ = "0.1.0"
