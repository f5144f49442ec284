"""The dashboard's sampled history of each app: the charts' series and the timeline."""

from __future__ import annotations

import dataclasses

import pytest

from gearbus.dashboard.history import History
from shared.messages import (AppError, AppEvent, AppState, AppSummary, CheckpointRecord, CheckpointStats,
                             MetricsHistory, MetricsSample, ProcessorInfo, ProcessorMetrics, ProcessorSample)


def summary(state=AppState.ACTIVE, restarts=0, rate=10.0, checkpoints=(), epoch=0, error=None,
            counters=2, events=()) -> AppSummary:
    processors = [ProcessorMetrics(processor=p, name=name, parallelism=2 if p == 0 else counters,
                                   records_in_per_s=rate * (p + 1),
                                   backpressure=0.25, watermark_lag_ms=40, state_bytes=1000 * p)
                  for p, name in enumerate(("source", "count"))]
    stats = CheckpointStats(interval_ms=1000, epoch=epoch, history=list(checkpoints))
    return AppSummary(app_id=7, name="app", state=state, submitted_ms=0, restarts=restarts, processors=processors,
                      checkpoints=stats, error=error, events=list(events))


def test_each_sample_charts_every_processors_figures_and_what_is_older_than_the_window_goes():
    h = History(sample_s=1, window_s=10)
    for second in range(15):
        h.observe([summary(rate=second)], now_ms=second * 1000)
    series = h.series(7)
    assert series["processors"] == [{"processor": 0, "name": "source"}, {"processor": 1, "name": "count"}]
    assert [s["t_ms"] for s in series["samples"]] == [t * 1000 for t in range(4, 15)]  # 10 s back, and now
    last = series["samples"][-1]["processors"]
    assert last["1"] == {"records_in_per_s": 28.0, "backpressure": 0.25, "watermark_lag_ms": 40, "state_bytes": 1000}
    assert h.series(99)["samples"] == []


def test_the_timeline_tells_what_the_cluster_recorded_at_its_times_and_each_checkpoint_seen_once():
    """A dashboard started late: the AppMaster's events, the master's submission and end,
    and every checkpoint this dashboard saw, though the AppMaster reports only its last."""
    h = History(sample_s=1, window_s=600)
    done = CheckpointRecord(1, "completed", trigger_ms=2500, duration_ms=120, size_bytes=64)
    flying = CheckpointRecord(2, "in_progress", trigger_ms=3500)
    h.observe([summary(checkpoints=[done, flying])], now_ms=4000)
    failed = CheckpointRecord(2, "failed", trigger_ms=3500, duration_ms=900, failure="declined by 1.0")
    h.observe([summary(checkpoints=[failed], restarts=1, epoch=1)], now_ms=5000)  # the first is no longer reported
    error = AppError("ValueError", "bad record", "count")
    events = [AppEvent(1500, "state", "ACTIVE"), AppEvent(3000, "rescale", "count 2 → 4"),
              AppEvent(3600, "restart", "restart 1, epoch 2, from checkpoint 1")]
    ended = summary(state=AppState.FAILED, restarts=1, error=error, checkpoints=[failed], events=events)
    timeline = h.timeline(dataclasses.replace(ended, submitted_ms=1000, finished_ms=7000), now_ms=8000)
    assert [(e["t_ms"], e["kind"], e["detail"]) for e in timeline] == [
        (1000, "state", "PENDING (submitted)"), (1500, "state", "ACTIVE"),
        (2500, "checkpoint_completed", "checkpoint 1: 120 ms, 64 bytes"), (3000, "rescale", "count 2 → 4"),
        (3500, "checkpoint_failed", "checkpoint 2: 900 ms, 0 bytes, declined by 1.0"),
        (3600, "restart", "restart 1, epoch 2, from checkpoint 1"),
        (7000, "state", "FAILED (ValueError: bad record)")]
    assert [e["t_ms"] for e in h.timeline(ended, now_ms=700_000)] == []  # all older than the window


def test_the_charts_show_what_the_appmaster_kept_from_before_the_dashboard_started():
    h = History(sample_s=5, window_s=900)
    kept = MetricsHistory(7, interval_ms=1000, window_ms=900_000, processors=[ProcessorInfo(0, "source", 2)],
                          samples=[MetricsSample(t, [ProcessorSample(0, records_in_per_s=t / 1000)])
                                   for t in (1000, 2000)])
    series = h.series(7, kept)
    assert (series["sample_s"], series["processors"]) == (1.0, [{"processor": 0, "name": "source"}])
    assert [(s["t_ms"], s["processors"]["0"]["records_in_per_s"]) for s in series["samples"]] == [(1000, 1.0),
                                                                                                   (2000, 2.0)]


def test_an_app_no_longer_listed_is_forgotten_and_a_bad_window_is_refused():
    h = History(sample_s=1, window_s=60)
    h.observe([summary()], now_ms=0)
    h.observe([], now_ms=1000)
    assert h.series(7)["samples"] == []
    with pytest.raises(ValueError):
        History(sample_s=0)
    with pytest.raises(ValueError):
        History(sample_s=10, window_s=5)
