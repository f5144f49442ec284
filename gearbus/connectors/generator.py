"""A generator source: consecutive integers at a steady rate, for tests, demos and
benchmarks (Gearpump's and Flink's data generators)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gearbus.api.task import DataSource, Record, TaskContext, new_record, now_ms


class RateSource(DataSource):
    """Emits ``value_fn(n)`` for n = 0, 1, 2, ... at ``rate`` records per second in all,
    forever or until ``count`` records; task i of N emits the n with n % N == i.

    Number n falls due ``n / rate`` seconds after the application started (a task that
    starts late catches up). A task restarted after a failure resumes with the numbers
    due now: those that fell due while it was down are lost, none is sent twice
    (at-most-once).
    """

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
        self._index = context.index
        self._started = context.app_start_ms / 1000 if context.app_start_ms else time.time()
        self._next = self._index
        if context.restarted:  # skip what fell due while the lost task was down
            due = self._due()
            self._next = due + (self._index - due) % self._step

    def _due(self) -> int:
        """How many numbers have fallen due by now (all tasks together)."""
        return int((time.time() - self._started) * self.rate) + 1

    def read(self, max_records: int) -> list[Record] | None:
        end = self._due()
        if self.count is not None:
            if self._next >= self.count:
                return None
            end = min(end, self.count)
        numbers = range(self._next, end, self._step)[:max_records]
        if not numbers:
            return []
        self._next = numbers[-1] + self._step
        ts, fn = now_ms(), self.value_fn
        return [new_record(Record, (fn(n) if fn else n, ts, None)) for n in numbers]

    def idle_wait_s(self) -> float:
        """Until this task's next number falls due."""
        return max(self._started + self._next / self.rate - time.time(), 0.0002)
