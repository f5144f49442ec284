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
    starts late catches up).

    Replayable: a snapshot is the task's next number, and a task restored from it emits
    exactly the numbers after it (the overdue ones at once, then on the clock), so with
    checkpoints each number counts in the results exactly once. The timestamps are the
    clock's at emission, not replayed: give the source step a ``timestamp_fn`` of the
    value for event times that replay too.
    """

    replayable = True

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

    def snapshot(self) -> dict:
        return {"next": self._next, "index": self._index, "parallelism": self._step}

    def restore(self, state: dict) -> None:
        if (state["index"], state["parallelism"]) != (self._index, self._step):
            raise ValueError(
                f"RateSource: task {self._index} of {self._step} cannot resume from a snapshot of task "
                f"{state['index']} of {state['parallelism']}; the parallelism changed"
            )
        self._next = state["next"]

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
