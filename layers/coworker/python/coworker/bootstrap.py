"""Process start-up shared by the Lambda handlers, the local runtime and the tests."""

from __future__ import annotations

import gc

from coworker.config import Settings
from coworker.data import connection
from coworker.engine import durations, handlers, offload

_started = False


def configure(settings: Settings | None = None) -> Settings:
    """Read settings (from the environment unless given), bind the model, load handler modules.

    The first call in a process then freezes what start-up built (modules, botocore's service
    model, handler modules) out of the garbage collector's reach: it lives as long as the
    process, and otherwise every full collection walks its hundreds of thousands of objects
    again, stopping every worker thread for a tenth of a second several times a second under load.
    """
    global _started
    settings = settings or Settings.from_env()
    connection.bind(settings)
    durations.observed.forget()  # run times read or counted belong to the table bound before
    connection.build_clients()  # once per process, before any worker thread needs one
    offload.store_for(settings)
    handlers.load_handler_modules(settings.handler_module_list)
    if not _started:
        _started = True
        gc.collect()  # leave start-up's garbage out of the frozen set
        gc.freeze()
    return settings
