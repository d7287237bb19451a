"""OTLP/gRPC: the trace service's ``Export`` on a port of its own (``drainpipe serve --grpc-port``; 4317 is OTLP's),
beside OTLP/HTTP's ``POST /v1/traces``, with the same token, limits, admission and write-ahead durability: both call
:meth:`~.service.IngestService.ingest`, so an export is answered only once its events are in the log.

Answers, as the OTLP specification's OTLP/gRPC section says (:func:`~.otlp_answers.grpc_status`):

* success: an ``ExportTraceServiceResponse``, with ``partial_success`` when spans were rejected;
* an export that does not decode: ``INVALID_ARGUMENT``, not retryable;
* an export over ``max_decoded_bytes`` after decompression: ``RESOURCE_EXHAUSTED`` (gRPC's own message limit), not
  retryable; more spans than ``max_events``: the same;
* throttling (shutting down, too many requests at once, the engine or the log behind): ``UNAVAILABLE`` with a
  ``google.rpc.RetryInfo`` of the delay the HTTP side sends as ``Retry-After`` (in the status details, and in
  ``google.rpc.retryinfo-bin`` metadata for OpenTelemetry's Python exporter);
* a missing or wrong token (``authorization: Bearer <token>`` metadata): ``UNAUTHENTICATED``.

gzip (``grpc-encoding``) is gRPC's own business: the export arrives decompressed. The export arrives as bytes (no
deserializer): the decoder parses it once, with the official classes, as it parses an HTTP body.

Thread-safety: gRPC runs each call on a thread of the server's pool, :data:`CALL_THREADS` of them (fewer if the
service's ``max_concurrent_requests`` is lower); calls beyond those wait in gRPC's queue. ``stop`` once.
"""

from __future__ import annotations

import collections
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NoReturn

import grpc
from google.rpc.error_details_pb2 import RetryInfo
from grpc_status import rpc_status

from ..errors import BadBody, IngestRefused
from .auth import bearer_ok
from .metrics import ServerMetrics
from .otlp_answers import GRPC_EXPORT_PATH, GRPC_SERVICE, export_answer, grpc_status
from .service import IngestService

__all__ = ["OtlpGrpcServer"]

MAX_ANSWER_BYTES = 4 << 20  # the specification's recommended response limit
RETRY_INFO_KEY = "google.rpc.retryinfo-bin"
#: calls run at once (more wait in gRPC's queue). Measured with 24 clients: 16 threads 413k request spans/s, p99
#: 117 ms; 64 threads 390k, p99 140 ms (two rounds each, the same hour): more threads only contend for the GIL
CALL_THREADS = 16


class OtlpGrpcServer:
    """``TraceService/Export`` on ``host:port`` (0: any free port; :attr:`port` says which) for ``service``."""

    def __init__(self, service: IngestService, metrics: ServerMetrics, token: str | None,
                 host: str, port: int) -> None:  # fmt: skip
        self._service = service
        self._metrics = metrics
        self._token = token
        limit = service.options.max_decoded_bytes
        threads = max(1, min(CALL_THREADS, service.options.max_concurrent_requests))
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="drainpipe-grpc")
        self._server = grpc.server(
            self._pool,
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", MAX_ANSWER_BYTES),
                ("grpc.so_reuseport", 0),
            ],  # fmt: skip
        )
        export = grpc.unary_unary_rpc_method_handler(self._export)  # bytes in, bytes out
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(GRPC_SERVICE, {"Export": export}),))
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            self.port = self._server.add_insecure_port(address)
        except RuntimeError:  # grpcio's way of saying the address cannot be bound (taken, or not this host's)
            self.port = 0
        if not self.port:
            raise OSError(f"cannot listen on {address} for OTLP/gRPC (in use, or not an address of this host)")
        self.address = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def start(self) -> OtlpGrpcServer:
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop at once: calls still running are cancelled (they were not answered, so their clients send again)."""
        self._server.stop(None).wait()
        self._pool.shutdown(wait=False)  # gRPC does not own the pool: its idle threads would outlive the server

    def _export(self, body: bytes, context: grpc.ServicerContext) -> bytes:
        t0 = time.perf_counter()
        status = 200
        try:
            metadata = dict(context.invocation_metadata())  # (a key not ending in -bin has a str value)
            if not bearer_ok(metadata.get("authorization"), self._token):
                status = 401
                _abort(context, status, "missing or bad bearer token")
            svc = self._service
            try:
                svc.enter()
            except IngestRefused as r:
                status = r.status
                _abort(context, status, r.message, r.retry_after)
            try:
                decoded = svc.ingest(body, form="otlp-protobuf", gzipped=False)
            except BadBody as exc:
                status = exc.status
                _abort(context, status, exc.message)
            except IngestRefused as r:
                status = r.status
                _abort(context, status, r.message, r.retry_after)
            finally:
                svc.leave()
                self._metrics.ingest_latency.observe(time.perf_counter() - t0)
            return export_answer(decoded.rejects, False, decoded.warnings)
        finally:
            self._metrics.count_request(GRPC_EXPORT_PATH, status)


class _Status(collections.namedtuple("_Status", ("code", "details", "trailing_metadata")), grpc.Status):
    pass


def _abort(context: grpc.ServicerContext, status: int, message: str, retry_after_s: int | None = None) -> NoReturn:
    """End the call with the gRPC form of an HTTP-status error (raises). RetryInfo goes where the specification
    says, in the status details (``grpc-status-details-bin``, which Go and Java clients read), and also on its own
    in ``google.rpc.retryinfo-bin`` trailing metadata, the one place OpenTelemetry's Python exporter looks."""
    answer = grpc_status(status, message, retry_after_s)
    wire = rpc_status.to_status(answer)
    metadata = tuple(wire.trailing_metadata)
    for detail in answer.details:
        if detail.Is(RetryInfo.DESCRIPTOR):
            metadata += ((RETRY_INFO_KEY, detail.value),)  # the Any's value: the RetryInfo's own bytes
    context.abort_with_status(_Status(wire.code, wire.details, metadata))
    raise AssertionError("abort_with_status returned")  # (it always raises)
