"""Process start-up shared by the Lambda handlers, the local runtime and the tests."""

from __future__ import annotations

from coworker import batches, handlers, model, offload
from coworker.config import Settings


def configure(settings: Settings | None = None) -> Settings:
    """Read settings (from the environment unless given), bind the model, load handler modules."""
    settings = settings or Settings.from_env()
    model.bind(settings)
    model.build_clients()  # once per process, before any worker thread needs one
    batches.build_client()
    offload.store_for(settings)
    handlers.load_handler_modules(settings.handler_module_list)
    return settings
