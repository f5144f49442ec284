"""``map_async``: a step whose function is a coroutine, run on the task's event loop with
at most ``concurrency`` calls in flight (Flink's async I/O).

Records queue in input order, split into segments by the watermarks that arrived
between them. Ordered mode lets a result out once every record before it has its own;
unordered mode lets results out as calls finish, but only from the first segment, so no
result overtakes a watermark and no watermark overtakes a result: a watermark goes on
once every record before it is out. The op holds what is not out yet, which makes the
task full at ``concurrency`` records (it stops taking input; a batch already taken
queues whole, so memory is bounded by ``concurrency`` + one batch), pending (its end
waits), and part of every snapshot: finished results are kept, unfinished records are
called again after a restore, so each record's result goes out exactly once.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any

from gearbus.api.task import NotRescalable, Record, Task, new_record
from gearbus.runtime.chain import Op, StepError


async def call(fn: Callable[[Any], Awaitable], value, timeout_ms: float | None,
               on_timeout: Callable[[Any], Any] | None):
    """One call of the user's function: its result; past ``timeout_ms``, ``on_timeout(value)``
    or a TimeoutError. The one rule for every runner (the Spark runner's partitions use it too)."""
    if timeout_ms is None:
        return await fn(value)
    scope = asyncio.timeout(timeout_ms / 1000)
    try:
        async with scope:
            return await fn(value)
    except TimeoutError:
        if not scope.expired():  # the function's own TimeoutError
            raise
    if on_timeout is None:
        raise TimeoutError(f"the call took longer than timeout_ms={timeout_ms:g}")
    return on_timeout(value)


class _Call:
    """One record on its way through the step."""

    __slots__ = ("value", "timestamp", "key", "segment", "done", "result", "error")

    def __init__(self, value, timestamp: int, key, segment: _Segment):
        self.value, self.timestamp, self.key, self.segment = value, timestamp, key, segment
        self.done = False
        self.result = None
        self.error: BaseException | None = None


class _Segment:
    """The records between two watermarks, and the watermark after them (None: still open)."""

    __slots__ = ("calls", "finished", "watermark")

    def __init__(self, watermark: int | None = None):
        self.calls: collections.OrderedDict[int, _Call] = collections.OrderedDict()  # not out yet, in order
        self.finished: list[int] = []  # unordered mode: the calls finished since the last poll
        self.watermark = watermark


class AsyncMapOp(Op):
    """The step's queue and its calls; results go out through :meth:`poll`."""

    holds_output = True

    def __init__(self, step: str, fn: Callable[[Any], Awaitable], concurrency: int, ordered: bool,
                 timeout_ms: float | None, on_timeout: Callable[[Any], Any] | None):
        super().__init__(step)
        self.fn = fn
        self.concurrency = concurrency
        self.ordered = ordered
        self.timeout_ms = timeout_ms
        self.on_timeout = on_timeout
        self._reset()

    def _reset(self) -> None:
        self.segments: collections.deque[_Segment] = collections.deque([_Segment()])
        self.size = 0  # records not out yet
        self.waiting: collections.deque[tuple[int, _Call]] = collections.deque()  # not started yet
        self.running: dict[int, asyncio.Task] = {}
        self.failed: _Call | None = None
        self.numbered = 0  # records numbered so far
        self.closed = False

    def open(self, task: Task) -> None:
        self.loop = asyncio.get_running_loop()
        self.request_poll = task.context.request_poll

    def process(self, records):
        segment = self.segments[-1]
        for value, timestamp, key in records:
            self.waiting.append(self._add(segment, value, timestamp, key))
        self.size += len(records)
        self._start()
        return []

    def on_watermark(self, watermark):
        if self.size:
            self.segments[-1].watermark = watermark
            self.segments.append(_Segment())
        else:  # nothing before it: it goes on now
            self.released = watermark
        return []

    def pending(self):
        return self.size > 0

    def full(self):
        return self.size >= self.concurrency

    def poll(self):
        if self.failed is not None:
            raise StepError(self.step, self.failed.value, self.failed.error) from self.failed.error
        runs, out = [], []
        segments = self.segments
        while True:
            segment = segments[0]
            calls = segment.calls
            if self.ordered:
                while calls and calls[next(iter(calls))].done:
                    out.append(self._record(calls.popitem(last=False)[1]))
            else:
                for number in sorted(segment.finished):  # input order among those finished since
                    out.append(self._record(calls.pop(number)))
                segment.finished.clear()
            if calls or segment.watermark is None:
                break
            runs.append((out, segment.watermark))
            self.released = segment.watermark
            out = []
            segments.popleft()
        if out:
            runs.append((out, None))
        self.size -= sum(len(records) for records, _ in runs)
        return runs

    def _add(self, segment: _Segment, value, timestamp: int, key) -> tuple[int, _Call]:
        number, entry = self.numbered, _Call(value, timestamp, key, segment)
        self.numbered += 1
        segment.calls[number] = entry
        return number, entry

    @staticmethod
    def _record(entry: _Call) -> Record:
        return new_record(Record, (entry.result, entry.timestamp, entry.key))

    def _start(self) -> None:
        """Call the waiting records, in order, while fewer than ``concurrency`` calls run."""
        while self.waiting and len(self.running) < self.concurrency and not self.closed:
            number, entry = self.waiting.popleft()
            self.running[number] = self.loop.create_task(self._run(number, entry))

    async def _run(self, number: int, entry: _Call) -> None:
        try:
            entry.result = await call(self.fn, entry.value, self.timeout_ms, self.on_timeout)
        except Exception as exc:
            entry.error = exc
            if self.failed is None:
                self.failed = entry
        entry.done = True
        del self.running[number]
        if not self.ordered:
            entry.segment.finished.append(number)
        self._start()
        self.request_poll()

    def snapshot(self):
        """Every record not out yet, segment by segment with the watermark after it: a
        finished one with its result, the rest as (value, timestamp, key) to call again."""
        return {
            "segments": [([(c.value, c.timestamp, c.key, c.done and c.error is None, c.result)
                           for c in segment.calls.values()], segment.watermark) for segment in self.segments],
            "released": self.released,
        }

    def rescale(self, states, index, parallelism):
        """Records still in flight keep their order only on their own task: a savepoint
        holding any cannot be divided."""
        if any(calls for state in states for calls, _ in state["segments"]):
            raise NotRescalable(f"step {self.step!r} holds records in flight, so its state cannot be divided "
                                "over another number of tasks")
        return {"segments": [([], None)], "released": min(state["released"] for state in states)}

    def restore(self, state) -> None:
        """Rebuild the queue; the unfinished records are called again once the loop turns
        (restore may run off the loop: an executor restores in a thread)."""
        self._reset()
        self.segments.clear()
        for calls, watermark in state["segments"]:
            segment = _Segment(watermark)
            for value, timestamp, key, done, result in calls:
                number, entry = self._add(segment, value, timestamp, key)
                if not done:
                    self.waiting.append((number, entry))
                    continue
                entry.done, entry.result = True, result
                if not self.ordered:
                    segment.finished.append(number)
            self.segments.append(segment)
            self.size += len(calls)
        self.released = state["released"]
        self.loop.call_soon_threadsafe(self._resume)

    def _resume(self) -> None:
        self._start()
        self.request_poll()  # results kept in the snapshot go out

    def close(self) -> None:
        """The task stops: its calls are cancelled (a recovery calls them again)."""
        self.closed = True
        for running in self.running.values():
            running.cancel()
        self.running.clear()


__all__ = ["AsyncMapOp", "call"]
