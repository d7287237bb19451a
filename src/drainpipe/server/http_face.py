"""The HTTP face every drainpipe process that has one shows (``serve``; ``consume --port``): the read routes and the
rule of who may read them, in one place, so that the two processes cannot drift apart.

::

    GET /            the dashboard page (static: no data, no token needed)
    GET /healthz     {"status": ...}: 200 while the process works, 503 otherwise (no token needed: a probe)
    GET /v1/stats    the live view as JSON (the dashboard, ``drainpipe stats``)
    GET /v1/service  one service over a range of buckets, from the store (:mod:`.drilldown`); 400 for a bad query
    GET /metrics     Prometheus text, or OpenMetrics when the Accept header asks for it

The rule: with a token, every route but ``/`` and ``/healthz`` wants ``Authorization: Bearer <token>`` (401 with
``WWW-Authenticate`` otherwise; Prometheus sends it as ``authorization: {credentials: ...}``); a process refuses to
listen on a non-loopback address without a token (:func:`check_bind`), since ``/v1/stats`` and ``/v1/service`` show
the store's data. The token comes from ``--token`` or ``DRAINPIPE_TOKEN`` (:func:`token_of`).

Each server writes an :class:`Answer` its own way (``serve`` counts it in its request metrics); errors are JSON
``{"error": ..., "status": ...}`` as every other error of the API. Thread-safety: :meth:`ReadRoutes.get` may be
called from any number of request threads at once; what it calls must allow that.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import StoreError, UsageError
from .auth import bearer_ok
from .dashboard import PAGE

__all__ = ["TOKEN_ENV", "Answer", "ReadRoutes", "check_bind", "error_answer", "is_loopback", "json_answer", "token_of"]

#: the environment variable a token is read from when ``--token`` is not given
TOKEN_ENV = "DRAINPIPE_TOKEN"

#: the routes that show data, and want the token when there is one (``/`` and ``/healthz`` do not)
GUARDED_ROUTES = frozenset({"/v1/stats", "/v1/service", "/metrics"})


@dataclass(frozen=True)
class Answer:
    """A response: status, body, content type and any further headers."""

    status: int
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)


def json_answer(status: int, obj: Any, headers: dict[str, str] | None = None) -> Answer:
    """``obj`` as standard JSON (no NaN)."""
    body = json.dumps(obj, allow_nan=False, separators=(",", ":")).encode()
    return Answer(status, body, "application/json", headers or {})


def error_answer(status: int, message: str, headers: dict[str, str] | None = None) -> Answer:
    return json_answer(status, {"error": message, "status": status}, headers)


UNAUTHORIZED = error_answer(401, "missing or bad bearer token", {"WWW-Authenticate": 'Bearer realm="drainpipe"'})


@dataclass(frozen=True)
class ReadRoutes:
    """The read routes of one process (the module docstring): what each route reads is handed in.

    ``health()``: (status, body); ``stats()``: the live view; ``metrics(accept)``: (page, content type); ``store``
    and ``definitions``: for the drill-down; ``token``: None for none."""

    health: Callable[[], tuple[int, dict[str, Any]]]
    stats: Callable[[], dict[str, Any]]
    metrics: Callable[[str], tuple[bytes, str]]
    store: Any
    definitions: Any
    token: str | None = None

    def authorized(self, authorization: str | None) -> bool:
        """Whether a request with this ``Authorization`` header may read a route that needs the token."""
        return bearer_ok(authorization, self.token)

    def get(self, target: str, authorization: str | None, accept: str = "") -> Answer | None:
        """The answer to ``GET target`` (a path with its query), or None when the path is not a read route (the
        caller answers 404 or 405). Never raises for a bad request: a bad query is a 400 answer."""
        path, _, query = target.partition("?")
        if path in GUARDED_ROUTES and not self.authorized(authorization):
            return UNAUTHORIZED
        if path == "/healthz":
            status, body = self.health()
            return json_answer(status, body)
        if path in ("/", "/index.html"):
            return Answer(200, PAGE, "text/html; charset=utf-8")
        if path == "/v1/stats":
            return json_answer(200, self.stats())
        if path == "/v1/service":
            from .drilldown import service_view_of_query  # (the pipeline's modules: not for a CLI's start)

            try:
                return json_answer(200, service_view_of_query(self.store, self.definitions, query))
            except (ValueError, StoreError) as exc:
                return error_answer(400, str(exc))
        if path == "/metrics":
            page, content_type = self.metrics(accept)
            return Answer(200, page, content_type)
        return None


def token_of(given: str | None) -> str | None:
    """The token a command was given: ``--token`` if set, else ``DRAINPIPE_TOKEN``; None for none (or empty)."""
    return given if given is not None else os.environ.get(TOKEN_ENV) or None


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` resolves to is a loopback address."""
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def check_bind(host: str, token: str | None, command: str) -> None:
    """Refuse (:class:`~drainpipe.errors.UsageError`, one line) to serve the read routes on a non-loopback address
    without a token: they show the store's data to whoever can reach the port."""
    if not token and not is_loopback(host):
        raise UsageError(
            f"{command}: refusing to listen on {host!r} without a token: pass --token or set {TOKEN_ENV} "
            "(or bind 127.0.0.1)"
        )
