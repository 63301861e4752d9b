"""The task API behind API Gateway: :func:`coworker.api.app.create_app` builds it.

* ``app``      -- the resolver (strict JSON bodies), ``create_app`` composing the routers, the
  answer for unknown routes and methods, ``GET /openapi.json``; its docstring lists every route.
* ``errors``   -- the one error format, the mapping of domain errors to HTTP codes
  (``ERROR_STATUS``), readable validation errors, the API's own errors, the handlers an app gets.
* ``routes_tasks``, ``routes_types``, ``routes_batches``, ``routes_stats`` -- one Powertools
  router per group of routes, built by ``router(services)``; routes parse and answer, the
  module's functions and the engine do the work.
* ``services`` -- what the routes of one app share: settings, invoker, cursor codec.
* ``cursors``  -- signed listing cursors and the bounded, sharded index reads they resume.
* ``models``   -- request and response bodies, the documented limits.
* ``bulk``     -- retry or cancel every task matching a filter, a page at a time.

Imports run one way, each module importing only those to its right: ``app``, the ``routes_*``
modules, ``services``, ``cursors``, ``errors``, ``models``, ``bulk``. Nothing in
``coworker.engine`` or ``coworker.data`` imports ``coworker.api``.
"""
