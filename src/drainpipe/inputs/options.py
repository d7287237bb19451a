"""What reading an input needs beyond its bytes: the service and the line format of an access log, the span mapping
and the endpoint rules (from the metrics TOML). Plain frozen data: it travels with a
:class:`~drainpipe.inputs.parts.Part` to worker processes and Spark executors."""

from __future__ import annotations

from dataclasses import dataclass, field

from .endpoints import EndpointRules
from .log_formats import DEFAULT_LOG_FORMAT, LogFormat
from .spans import SpanMapping

__all__ = ["InputOptions"]


@dataclass(frozen=True)
class InputOptions:
    service: str = ""  # access logs: the service they belong to (``--service``)
    spans: SpanMapping = field(default_factory=SpanMapping)
    endpoints: EndpointRules = field(default_factory=EndpointRules)
    log_format: LogFormat = DEFAULT_LOG_FORMAT  # access logs: the format their lines are in (``--log-format``)
