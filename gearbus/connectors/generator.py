"""A generator source: consecutive integers at a steady rate, for tests, demos and
benchmarks (Gearpump's and Flink's data generators)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gearbus.api.task import DataSource, Record, TaskContext, new_record, now_ms


class RateSource(DataSource):
    """Emits ``value_fn(n)`` for n = 0, 1, 2, ... at ``rate`` records per second in all,
    forever or until ``count`` records; task i of N emits the n with n % N == i."""

    def __init__(self, rate: float, count: int | None = None, value_fn: Callable[[int], Any] | None = None):
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate!r}")
        if count is not None and count < 0:
            raise ValueError(f"count must be >= 0, got {count!r}")
        self.rate = rate
        self.count = count
        self.value_fn = value_fn

    def open(self, context: TaskContext) -> None:
        self._step = context.parallelism
        self._next = context.index
        self._period = self._step / self.rate  # seconds between this task's records
        self._started = time.monotonic()
        self._emitted = 0

    def read(self, max_records: int) -> list[Record] | None:
        if self.count is not None and self._next >= self.count:
            return None
        due = int((time.monotonic() - self._started) / self._period) + 1 - self._emitted
        take = min(due, max_records)
        if self.count is not None:
            take = min(take, len(range(self._next, self.count, self._step)))
        if take <= 0:
            return []
        numbers = range(self._next, self._next + take * self._step, self._step)
        self._next += take * self._step
        self._emitted += take
        ts, fn = now_ms(), self.value_fn
        return [new_record(Record, (fn(n) if fn else n, ts, None)) for n in numbers]

    def idle_wait_s(self) -> float:
        """Until this task's next record is due."""
        next_due = self._started + self._emitted * self._period
        return max(next_due - time.monotonic(), 0.0002)
