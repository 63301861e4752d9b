"""What the routes of one app share: its settings, its invoker and its cursor codec.

Each app gets its own :class:`Services` (tests build several apps with different settings in one
process), handed to every route module's ``router(services)``: nothing is kept in module globals.
"""

from __future__ import annotations

import dataclasses

from coworker.api.cursors import CursorCodec, cursor_secret
from coworker.config import Settings
from coworker.engine import dispatch


@dataclasses.dataclass(frozen=True)
class Services:
    """The settings, the optional invoker (dispatch on submit) and the cursor codec of one app."""

    settings: Settings
    invoker: dispatch.Invoker | None
    cursors: CursorCodec

    @classmethod
    def of(cls, settings: Settings, invoker: dispatch.Invoker | None = None) -> Services:
        """The services of an app for ``settings``: cursors signed with its :func:`cursor_secret`."""
        return cls(settings, invoker, CursorCodec(cursor_secret(settings)))
