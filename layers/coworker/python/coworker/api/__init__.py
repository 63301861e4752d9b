"""The task API behind API Gateway: :func:`coworker.api.app.create_app` builds it.

``app`` (the resolver, routes and error mapping), ``models`` (request and response bodies, the
documented limits) and ``bulk`` (retry or cancel every task matching a filter).
"""
