"""The answers of OTLP (``POST /v1/traces`` and gRPC's ``TraceService/Export``), as the OTLP specification defines
them; over HTTP in the request's encoding (binary protobuf for ``application/x-protobuf``, OTLP JSON for
``application/json``):

* success: an ``ExportTraceServiceResponse``; when some spans were rejected, with ``partial_success``
  (``rejected_spans`` and a message naming the reasons); spans accepted with a warning (a sampling threshold that
  could not be used) are named in its message too, which with ``rejected_spans`` 0 is the spec's warning;
* failure over HTTP (4xx, 5xx): a ``google.rpc.Status`` with the gRPC code that matches the HTTP status and a
  one-line message. 429 and 503 carry ``Retry-After`` (the caller adds the header);
* failure over gRPC: the status :func:`grpc_status` gives. Throttling (the HTTP side's 429 and 503) is
  ``UNAVAILABLE`` with a ``google.rpc.RetryInfo`` of the Retry-After delay, the spec's throttling signal; a body
  over the size limit is ``RESOURCE_EXHAUSTED`` without one, which clients must not retry.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from google.protobuf import any_pb2, duration_pb2, json_format
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

__all__ = ["GRPC_EXPORT_PATH", "GRPC_SERVICE", "JSON", "PROTOBUF", "content_type", "export_answer", "grpc_status",
           "status_answer"]  # fmt: skip

GRPC_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
GRPC_EXPORT_PATH = f"/{GRPC_SERVICE}/Export"  # the call's path (HTTP/2 :path), also its label in request metrics
PROTOBUF = "application/x-protobuf"
JSON = "application/json"

# google.rpc.Code by HTTP status (the gRPC <-> HTTP mapping)
_CODES = {400: 3, 401: 16, 403: 7, 404: 5, 405: 12, 411: 3, 413: 8, 415: 3, 429: 8, 501: 12, 503: 14}


def content_type(json_body: bool) -> str:
    return JSON if json_body else PROTOBUF


def _encode(message: ExportTraceServiceResponse | Status, json_body: bool) -> bytes:
    if json_body:
        return json_format.MessageToJson(message, indent=None).encode()
    return bytes(message.SerializeToString())


def export_answer(
    rejects: Sequence[tuple[int, str]], json_body: bool, warnings: Sequence[tuple[str, int]] = ()
) -> bytes:
    """The 200 answer: empty, or ``partial_success`` with the rejected span count and a message naming their
    reasons and the warnings (``(reason, spans)``)."""
    response = ExportTraceServiceResponse()
    parts = []
    if rejects:
        reasons = Counter(reason for _, reason in rejects)
        response.partial_success.rejected_spans = len(rejects)
        parts.append("rejected spans: " + ", ".join(f"{reason} ({n})" for reason, n in reasons.most_common()))
    if warnings:
        parts.append("accepted with a warning: " + ", ".join(f"{reason} ({n})" for reason, n in warnings))
    if parts:
        response.partial_success.error_message = "; ".join(parts)
    return _encode(response, json_body)


def status_answer(status: int, message: str, json_body: bool) -> bytes:
    """The body of an error answer: a ``google.rpc.Status``."""
    return _encode(Status(code=_CODES.get(status, 2), message=message), json_body)


def grpc_status(status: int, message: str, retry_after_s: int | None = None) -> Status:
    """An error of the ingest path (its HTTP status) as OTLP/gRPC answers it: throttling (429, 503) is
    ``UNAVAILABLE`` with ``RetryInfo`` (``retry_after_s``), anything else the mapped code without details."""
    if status in (429, 503):
        answer = Status(code=_CODES[503], message=message)  # UNAVAILABLE: the spec's throttling code
        if retry_after_s is not None:
            detail = any_pb2.Any()
            detail.Pack(RetryInfo(retry_delay=duration_pb2.Duration(seconds=retry_after_s)))
            answer.details.append(detail)
        return answer
    return Status(code=_CODES.get(status, 2), message=message)
