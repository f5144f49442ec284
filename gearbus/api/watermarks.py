"""Watermarks: how a source tells the pipeline how far event time has progressed.

A watermark W means no more records with a timestamp <= W will arrive (Flink's
meaning). A bounded input ends with WATERMARK_MAX, which completes every window.
"""

from __future__ import annotations

WATERMARK_MIN = -(2**63)
WATERMARK_MAX = 2**63 - 1


class WatermarkGenerator:
    """Observes the timestamps a source produces and derives its watermark."""

    def observe(self, max_timestamp: int) -> None:
        raise NotImplementedError

    def current(self) -> int:
        raise NotImplementedError

    def snapshot(self):
        """What the generator has observed, for a checkpoint."""
        return None

    def restore(self, state) -> None:
        """Continue from :meth:`snapshot`'s state."""


class BoundedOutOfOrderness(WatermarkGenerator):
    """Records may arrive up to ``max_delay_ms`` behind the newest one seen: the
    watermark trails the highest timestamp by that much (0 for in-order input)."""

    def __init__(self, max_delay_ms: int = 0):
        if not isinstance(max_delay_ms, int) or max_delay_ms < 0:
            raise ValueError(f"max_delay_ms must be a non-negative integer, got {max_delay_ms!r}")
        self.max_delay_ms = max_delay_ms
        self._max = WATERMARK_MIN

    def observe(self, max_timestamp: int) -> None:
        if max_timestamp > self._max:
            self._max = max_timestamp

    def snapshot(self) -> int:
        return self._max

    def restore(self, state: int) -> None:
        self._max = state

    def current(self) -> int:
        if self._max == WATERMARK_MIN:
            return WATERMARK_MIN
        return self._max - self.max_delay_ms - 1
