"""drainpipe as a service: HTTP ingest into a live local engine, ``/metrics``, ``/healthz``, a live dashboard,
and the ``drainpipe stats`` terminal view (:mod:`.client`)."""

from __future__ import annotations

from .service import IngestService, ServiceOptions, serve_engine_options

__all__ = ["IngestService", "ServiceOptions", "serve_engine_options", "IngestServer", "run_server"]


def __getattr__(name: str):
    if name in ("IngestServer", "run_server"):
        from . import http

        return getattr(http, name)
    raise AttributeError(name)
