"""Per-processor metrics from the tasks' counters, as an AppMaster sums them up on each of
its heartbeats. Free of I/O: counters and the time in, ProcessorMetrics out.

A task's counters are totals since its attempt started. A processor's totals go on across
attempts: when a deployment (a rescale, a replacement, a recovery) starts tasks anew, what
their predecessors counted is carried into their processor's totals, so "records in" never
restarts from zero. Rates come from the change of those continuous totals since the last
sample that had a report, and a processor none of whose tasks has reported yet in a new
deployment keeps its last figures rather than dropping to zero."""

from __future__ import annotations

import dataclasses

from shared.messages import ProcessorInfo, ProcessorMetrics, TaskCounters
from services.histogram import merge, quantile

_SHARED = ("backpressure_ms", "busy_ms")  # a share of the time: the busiest task's, from its own change
_TOTALS = ("records_in", "records_out", "bytes_in", "bytes_out", "late_records", "messages_dropped", "dead_letters")


class ProcessorMetricsAggregator:
    def __init__(self, processors: list[ProcessorInfo]):
        self.processors = processors
        self._tasks: dict[tuple[int, int], TaskCounters] = {}  # each task's latest report, this attempt
        self._carried: dict[int, dict[str, int]] = {}  # processor -> what its ended attempts counted
        self._rated: dict[int, tuple[float, int, int]] = {}  # processor -> (time, records in, out) at its last report
        self._shares: dict[tuple[int, int], tuple[float, float, float]] = {}  # task -> (time, _SHARED values)
        self._last: dict[int, ProcessorMetrics] = {}  # processor -> its figures at its last report

    def redeployed(self, processors: list[ProcessorInfo], kept: set[tuple[int, int]]) -> None:
        """A deployment with ``processors`` (their parallelism may have changed): the tasks
        not ``kept`` running start new attempts, so their counts so far are carried."""
        self.processors = processors
        for key, counters in list(self._tasks.items()):
            if key not in kept:
                carried = self._carried.setdefault(key[0], dict.fromkeys(_TOTALS, 0))
                for name in _TOTALS:
                    carried[name] += getattr(counters, name)
                del self._tasks[key]
                self._shares.pop(key, None)

    def update(self, counters: list[TaskCounters], now_s: float, now_ms: int) -> list[ProcessorMetrics]:
        """``counters``: the live tasks' latest; ``now_s`` a monotonic clock, ``now_ms`` the wall clock."""
        reported: dict[int, list[TaskCounters]] = {}
        for c in counters:
            self._tasks[(c.task.processor, c.task.index)] = c
            reported.setdefault(c.task.processor, []).append(c)
        live: dict[int, list[TaskCounters]] = {}  # each processor's tasks of this attempt, grouped once
        for (processor, _), c in self._tasks.items():
            live.setdefault(processor, []).append(c)
        metrics = []
        for info in self.processors:
            tasks = reported.get(info.id)
            if tasks:
                totals = self._totals(info.id, live[info.id])
                self._last[info.id] = self._processor(info, tasks, totals, now_s, now_ms)
            last = self._last.get(info.id)
            metrics.append(dataclasses.replace(last, name=info.name, parallelism=info.parallelism) if last
                           else ProcessorMetrics(info.id, info.name, info.parallelism))
        return metrics

    def _totals(self, processor: int, live: list[TaskCounters]) -> dict[str, int]:
        """The processor's _TOTALS: what its ended attempts counted and its ``live`` tasks'."""
        carried = self._carried.get(processor, {})
        return {name: carried.get(name, 0) + sum(getattr(c, name) for c in live) for name in _TOTALS}

    def _share(self, c: TaskCounters, now_s: float) -> tuple[float, ...]:
        """The task's share of the time since its previous report spent on each of _SHARED."""
        key = (c.task.processor, c.task.index)
        values = tuple(float(getattr(c, name)) for name in _SHARED)
        before = self._shares.get(key)
        self._shares[key] = (now_s, *values)
        if before is None or now_s <= before[0]:
            return (0.0,) * len(_SHARED)
        return tuple(min(max(v - b, 0.0) / ((now_s - before[0]) * 1000), 1.0) for v, b in zip(values, before[1:]))

    def _processor(self, info: ProcessorInfo, counters: list[TaskCounters], totals: dict[str, int], now_s: float,
                   now_ms: int) -> ProcessorMetrics:
        before = self._rated.get(info.id)
        self._rated[info.id] = (now_s, totals["records_in"], totals["records_out"])
        elapsed = now_s - before[0] if before else 0.0

        def per_second(total: int, prior: int) -> float:
            return max(total - prior, 0) / elapsed if elapsed > 0 else 0.0

        shares = [self._share(c, now_s) for c in counters]
        watermarks = [c.watermark for c in counters]
        unfinished = [c.watermark for c in counters if not c.finished]
        buckets = merge(c.batch_ms_buckets for c in counters)
        return ProcessorMetrics(
            info.id, info.name, info.parallelism, **totals,
            records_in_per_s=per_second(totals["records_in"], before[1]) if before else 0.0,
            records_out_per_s=per_second(totals["records_out"], before[2]) if before else 0.0,
            watermark=min(watermarks),
            watermark_lag_ms=max(now_ms - min(unfinished), 0) if unfinished and min(unfinished) > 0 else None,
            backpressure=max(s[0] for s in shares),
            busy=max(s[1] for s in shares),
            latency_p50_ms=quantile(buckets, 0.5),
            latency_p99_ms=quantile(buckets, 0.99),
            inbox_depth=sum(c.inbox_depth for c in counters),
            finished_tasks=sum(c.finished for c in counters),
            state_keys=sum(c.state_keys for c in counters),
            state_bytes=sum(c.state_bytes for c in counters),
        )
