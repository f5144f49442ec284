"""The AppMaster's per-processor metrics, from task counters sampled over time."""

import pytest

from services.appmaster.metrics import ProcessorMetricsAggregator
from services.histogram import Histogram, quantile
from shared.messages import BATCH_MS_BOUNDS, ProcessorInfo, TaskCounters, TaskId

PROCESSORS = [ProcessorInfo(0, "read", 2), ProcessorInfo(1, "count", 1)]
NOW_MS = 1_700_000_010_000


def counters(processor, index, epoch=0, **values):
    return TaskCounters(TaskId(processor, index), epoch=epoch, **values)


def test_rates_and_shares_come_from_the_change_since_the_previous_sample():
    agg = ProcessorMetricsAggregator(PROCESSORS)
    first = agg.update([counters(0, 0, records_out=1000), counters(0, 1, records_out=500),
                        counters(1, 0, records_in=1500, busy_ms=100.0)], 10.0, NOW_MS)
    assert first[0].records_out == 1500 and first[0].records_out_per_s == 0.0  # nothing to compare with yet
    second = agg.update([counters(0, 0, records_out=3000, backpressure_ms=500.0),
                         counters(0, 1, records_out=1500, backpressure_ms=100.0),
                         counters(1, 0, records_in=4500, busy_ms=600.0)], 12.0, NOW_MS)
    read, count = second
    assert read.records_out == 4500 and read.records_out_per_s == 1500.0  # (2000 + 1000) / 2 s
    assert read.backpressure == 0.25  # the most back-pressured task: 500 ms of 2 s
    assert count.records_in_per_s == 1500.0 and count.busy == 0.25


def test_totals_go_on_across_a_redeployment_and_the_rate_never_drops_to_zero():
    """A rescale of ``count`` from 1 to 2 tasks while ``read`` is kept running: the old
    task's count is carried, the new tasks count from zero, and until they report the
    processor keeps its figures."""
    agg = ProcessorMetricsAggregator(PROCESSORS)
    agg.update([counters(0, 0, records_out=500), counters(1, 0, records_in=10_000)], 0.0, NOW_MS)
    agg.update([counters(0, 0, records_out=1500), counters(1, 0, records_in=11_000)], 1.0, NOW_MS)
    rescaled = [ProcessorInfo(0, "read", 2), ProcessorInfo(1, "count", 2)]
    agg.redeployed(rescaled, kept={(0, 0), (0, 1)})
    waiting = agg.update([counters(0, 0, epoch=1, records_out=1500)], 2.0, NOW_MS)[1]
    assert (waiting.records_in, waiting.records_in_per_s, waiting.parallelism) == (11_000, 1000.0, 2)
    after = agg.update([counters(0, 0, epoch=1, records_out=3500), counters(1, 0, epoch=1, records_in=1200),
                        counters(1, 1, epoch=1, records_in=800)], 3.0, NOW_MS)
    read, count = after
    assert count.records_in == 13_000 and count.records_in_per_s == 1000.0  # 2000 more over 2 s since its last
    assert read.records_out == 3500 and read.records_out_per_s == 2000.0  # kept: its count goes on, not doubled


def test_a_recovery_carries_every_tasks_count():
    agg = ProcessorMetricsAggregator(PROCESSORS)
    agg.update([counters(1, 0, records_in=10_000)], 0.0, NOW_MS)
    agg.redeployed(PROCESSORS, kept=set())
    after_rollback = agg.update([counters(1, 0, epoch=1, records_in=300)], 1.0, NOW_MS)[1]
    assert after_rollback.records_in == 10_300 and after_rollback.records_in_per_s == 300.0


def test_watermark_lag_is_measured_from_the_slowest_unfinished_task():
    agg = ProcessorMetricsAggregator(PROCESSORS)
    read = agg.update([counters(0, 0, watermark=NOW_MS - 2000), counters(0, 1, watermark=NOW_MS - 500)],
                      0.0, NOW_MS)[0]
    assert read.watermark == NOW_MS - 2000 and read.watermark_lag_ms == 2000
    done = agg.update([counters(0, 0, watermark=NOW_MS - 2000, finished=True)], 1.0, NOW_MS)[0]
    assert done.watermark_lag_ms is None and done.finished_tasks == 1


def test_a_processor_without_reports_is_listed_with_zeros():
    idle = ProcessorMetricsAggregator(PROCESSORS).update([], 0.0, NOW_MS)
    assert [(m.name, m.records_in, m.latency_p99_ms) for m in idle] == [("read", 0, None), ("count", 0, None)]


def test_latency_percentiles_come_from_the_merged_histograms():
    fast, slow = Histogram(), Histogram()
    for _ in range(99):
        fast.observe(0.3)
    slow.observe(40.0)
    agg = ProcessorMetricsAggregator(PROCESSORS)
    read = agg.update([counters(0, 0, batch_ms_buckets=fast.counts), counters(0, 1, batch_ms_buckets=slow.counts)],
                      0.0, NOW_MS)[0]
    assert read.latency_p50_ms == 0.5 and read.latency_p99_ms == 0.5
    assert quantile(slow.counts, 0.99) == 50.0
    huge = Histogram()
    huge.observe(5000.0)
    assert quantile(huge.counts, 0.5) == BATCH_MS_BOUNDS[-1]
    assert fast.total_ms == pytest.approx(99 * 0.3)
