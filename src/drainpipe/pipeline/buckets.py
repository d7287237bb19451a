"""The pipeline's fixed vocabulary of time buckets and percentiles, shared by the functions, the definitions' alert
rules and the engines (a leaf module: it imports nothing of drainpipe)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["GRANULARITY_MS", "GRANULARITIES", "TOPN_BUCKET_MS", "PERCENTILES", "PERCENTILE_LABELS"]

#: metric granularities and the length of their buckets (UTC minutes, hours and days)
GRANULARITY_MS: Mapping[str, int] = MappingProxyType({"minute": 60_000, "hour": 3_600_000, "day": 86_400_000})
GRANULARITIES: tuple[str, ...] = tuple(GRANULARITY_MS)
#: top-N rows are kept per 10-minute bucket
TOPN_BUCKET_MS = 600_000
PERCENTILES: tuple[int, ...] = (50, 75, 90, 95, 99)
PERCENTILE_LABELS: tuple[str, ...] = tuple(f"p{p}" for p in PERCENTILES)
