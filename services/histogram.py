"""Batch processing times as a fixed-bucket histogram (bounds in shared.messages.BATCH_MS_BOUNDS):
cheap to record on the task loop, small on the heartbeat, and mergeable across tasks, so an
AppMaster can give a processor's latency percentiles and Prometheus a histogram."""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from shared.messages import BATCH_MS_BOUNDS


class Histogram:
    __slots__ = ("counts", "total_ms")

    def __init__(self):
        self.counts = [0] * (len(BATCH_MS_BOUNDS) + 1)
        self.total_ms = 0.0

    def observe(self, ms: float) -> None:
        self.counts[bisect.bisect_left(BATCH_MS_BOUNDS, ms)] += 1
        self.total_ms += ms


def merge(bucket_lists: Iterable[list[int]]) -> list[int]:
    """Sum histograms bucket by bucket (an empty list counts as no batches)."""
    merged = [0] * (len(BATCH_MS_BOUNDS) + 1)
    for buckets in bucket_lists:
        for i, count in enumerate(buckets[: len(merged)]):
            merged[i] += count
    return merged


def quantile(buckets: list[int], q: float) -> float | None:
    """The upper bound of the bucket holding the ``q`` quantile: None without batches, the
    last bound when the quantile lies above it (as Prometheus' histogram_quantile)."""
    total = sum(buckets)
    if not total:
        return None
    rank, seen = q * total, 0
    for i, count in enumerate(buckets):
        seen += count
        if seen >= rank and count:
            return BATCH_MS_BOUNDS[min(i, len(BATCH_MS_BOUNDS) - 1)]
    return BATCH_MS_BOUNDS[-1]
