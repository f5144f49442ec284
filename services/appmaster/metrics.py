"""Per-processor metrics from the tasks' counters, as an AppMaster sums them up on each of
its heartbeats. Free of I/O: counters and the time in, ProcessorMetrics out.

Counters are totals since a task attempt started; rates and shares come from the change
since the previous sample of the same attempt (a new attempt starts from zero)."""

from __future__ import annotations

from shared.messages import ProcessorInfo, ProcessorMetrics, TaskCounters
from services.histogram import merge, quantile

_RATED = ("records_in", "records_out", "backpressure_ms", "busy_ms")


class ProcessorMetricsAggregator:
    def __init__(self, processors: list[ProcessorInfo]):
        self.processors = processors
        self._previous: dict[tuple[int, int], tuple[int, tuple[float, ...]]] = {}  # task -> (epoch, _RATED values)
        self._previous_at: float | None = None

    def update(self, counters: list[TaskCounters], now_s: float, now_ms: int) -> list[ProcessorMetrics]:
        """``counters``: the live tasks' latest; ``now_s`` a monotonic clock, ``now_ms`` the wall clock."""
        elapsed = now_s - self._previous_at if self._previous_at is not None else 0.0
        by_processor: dict[int, list[tuple[TaskCounters, tuple[float, ...]]]] = {}
        previous, self._previous = self._previous, {}
        for c in counters:
            key = (c.task.processor, c.task.index)
            values = tuple(float(getattr(c, name)) for name in _RATED)
            prior = previous.get(key)
            before = prior[1] if prior and prior[0] == c.epoch else (0.0,) * len(_RATED)  # new since then
            deltas = tuple(max(v - b, 0.0) for v, b in zip(values, before))
            self._previous[key] = (c.epoch, values)
            by_processor.setdefault(c.task.processor, []).append((c, deltas))
        self._previous_at = now_s
        return [self._processor(p, by_processor.get(p.id, []), elapsed, now_ms) for p in self.processors]

    @staticmethod
    def _processor(info: ProcessorInfo, tasks: list[tuple[TaskCounters, tuple[float, ...]]], elapsed: float,
                   now_ms: int) -> ProcessorMetrics:
        metrics = ProcessorMetrics(info.id, info.name, info.parallelism)
        if not tasks:
            return metrics
        counters = [c for c, _ in tasks]
        watermarks = [c.watermark for c in counters]
        unfinished = [c.watermark for c in counters if not c.finished]
        buckets = merge(c.batch_ms_buckets for c in counters)

        def per_second(i: int) -> float:
            return sum(d[i] for _, d in tasks) / elapsed if elapsed > 0 else 0.0

        def share(i: int) -> float:
            return min(max(d[i] for _, d in tasks) / (elapsed * 1000), 1.0) if elapsed > 0 else 0.0

        return ProcessorMetrics(
            info.id, info.name, info.parallelism,
            records_in=sum(c.records_in for c in counters),
            records_out=sum(c.records_out for c in counters),
            bytes_in=sum(c.bytes_in for c in counters),
            bytes_out=sum(c.bytes_out for c in counters),
            records_in_per_s=per_second(0),
            records_out_per_s=per_second(1),
            watermark=min(watermarks),
            watermark_lag_ms=max(now_ms - min(unfinished), 0) if unfinished and min(unfinished) > 0 else None,
            backpressure=share(2),
            busy=share(3),
            latency_p50_ms=quantile(buckets, 0.5),
            latency_p99_ms=quantile(buckets, 0.99),
            inbox_depth=sum(c.inbox_depth for c in counters),
            late_records=sum(c.late_records for c in counters),
            messages_dropped=sum(c.messages_dropped for c in counters),
            dead_letters=sum(c.dead_letters for c in counters),
            finished_tasks=sum(c.finished for c in counters),
            state_keys=sum(c.state_keys for c in counters),
            state_bytes=sum(c.state_bytes for c in counters),
        )
