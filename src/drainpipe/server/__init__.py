"""drainpipe as a service: HTTP ingest into a live local engine, ``/metrics``, ``/healthz``, a live dashboard,
and the ``drainpipe stats`` terminal view (:mod:`.client`).

The names are imported on first use (PEP 562): the CLI registers the ``serve`` subcommands from
:mod:`.commands`, and ``drainpipe run`` must not pay for loading the service with them."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - for type checkers: the names as if imported eagerly
    from .assembly import ServeConfig, build_service, serve
    from .http import IngestServer, run_server
    from .service import IngestService, ServiceOptions, serve_engine_options

__all__ = [
    "ServeConfig",
    "build_service",
    "serve",
    "IngestService",
    "ServiceOptions",
    "serve_engine_options",
    "IngestServer",
    "run_server",
]

_HOMES = {
    "ServeConfig": "assembly",
    "build_service": "assembly",
    "serve": "assembly",
    "IngestService": "service",
    "ServiceOptions": "service",
    "serve_engine_options": "service",
    "IngestServer": "http",
    "run_server": "http",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{home}", __name__), name)
