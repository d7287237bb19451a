"""Prometheus remote-write's protobuf messages (``prometheus/prompb``: ``WriteRequest``, ``TimeSeries``, ``Label``,
``Sample``, ``Exemplar``), as message classes of the protobuf library, built from their descriptor here.

Prometheus publishes the ``.proto`` files but no Python package; the handful of messages remote-write 1.0 needs are
described below field by field, with Prometheus' own field numbers and types, and the protobuf library does all the
encoding (no wire format written by hand). Fields drainpipe never sends (metadata, native histograms) are left out:
a reader skips what it does not know, and the writer does not need them.
"""

from __future__ import annotations

import functools
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["decode_write_request", "write_request"]

_F = descriptor_pb2.FieldDescriptorProto

#: message -> (field, number, type, label, message type) as in prometheus/prompb/types.proto and remote.proto
_MESSAGES: dict[str, list[tuple[str, int, int, int, str]]] = {
    "WriteRequest": [("timeseries", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".prometheus.TimeSeries")],
    "TimeSeries": [
        ("labels", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".prometheus.Label"),
        ("samples", 2, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".prometheus.Sample"),
        ("exemplars", 3, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".prometheus.Exemplar"),
    ],
    "Label": [
        ("name", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, ""),
        ("value", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, ""),
    ],
    "Sample": [
        ("value", 1, _F.TYPE_DOUBLE, _F.LABEL_OPTIONAL, ""),
        ("timestamp", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
    ],
    "Exemplar": [
        ("labels", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".prometheus.Label"),
        ("value", 2, _F.TYPE_DOUBLE, _F.LABEL_OPTIONAL, ""),
        ("timestamp", 3, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
    ],
}


@functools.cache
def _classes() -> dict[str, Any]:
    proto = descriptor_pb2.FileDescriptorProto(name="drainpipe/prompb.proto", package="prometheus", syntax="proto3")
    for name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=name)
        for field, number, kind, label, type_name in fields:
            message.field.add(name=field, number=number, type=kind, label=label, type_name=type_name or None)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"prometheus.{name}"))
            for name in _MESSAGES}  # fmt: skip


def write_request() -> Any:
    """A new, empty ``prometheus.WriteRequest`` (``.timeseries.add()`` and so on, as any protobuf message)."""
    return _classes()["WriteRequest"]()


def decode_write_request(body: bytes) -> Any:
    """A ``WriteRequest`` from its (uncompressed) bytes; ``google.protobuf.message.DecodeError`` if they are not one."""
    request = write_request()
    request.ParseFromString(body)
    return request
