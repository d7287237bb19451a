"""The remote writer's counters on ``/metrics`` (``serve`` and ``consume``): what was sent, refused, skipped and
late, and how far it got; read at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..pipeline import RemoteWriter

__all__ = ["RemoteWriteCollector"]


class RemoteWriteCollector(Collector):
    """``drainpipe_remote_write_*`` from a :class:`~drainpipe.pipeline.RemoteWriter`."""

    def __init__(self, writer: RemoteWriter) -> None:
        self.writer = writer

    def collect(self) -> Iterator[Metric]:
        s = self.writer.stats()
        samples = CounterMetricFamily(
            "drainpipe_remote_write_samples",
            "Stored values by what became of them: sent (acknowledged), rejected (refused for good by the receiver)",
            labels=["outcome"],
        )
        samples.add_metric(["sent"], s["sent_samples"])
        samples.add_metric(["rejected"], s["rejected_samples"])
        yield samples
        for name, doc, key in (
            ("exemplars", "Stored exemplars sent (acknowledged): the slowest traced request per entity and minute",
             "sent_exemplars"),
            ("requests", "Requests the receiver answered for good", "requests"),
            ("failures", "Requests the receiver could not take (sent again after a back-off)", "failures"),
            ("skipped_minutes", "Minutes not sent: older than --remote-write-max-age-s when their turn came",
             "skipped_minutes"),
            ("late_events", "Events of minutes already sent: in the store, not sent again", "late_events"),
        ):  # fmt: skip
            yield CounterMetricFamily(f"drainpipe_remote_write_{name}", doc, value=s[key])
        position = s["position_ms"]
        yield GaugeMetricFamily("drainpipe_remote_write_sent_until_seconds",
                                "Start of the last minute sent (epoch seconds; -1: none yet)",
                                value=position / 1000 if position >= 0 else -1)  # fmt: skip
