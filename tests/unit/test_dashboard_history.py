"""The dashboard's sampled history of each app: the charts' series and the timeline."""

from __future__ import annotations

import pytest

from gearbus.dashboard.history import History
from shared.messages import (AppError, AppState, AppSummary, AppVersion, CheckpointRecord, CheckpointStats,
                             ProcessorMetrics)


def summary(state=AppState.ACTIVE, restarts=0, rate=10.0, checkpoints=(), epoch=0, error=None,
            counters=2, versions=()) -> AppSummary:
    processors = [ProcessorMetrics(processor=p, name=name, parallelism=2 if p == 0 else counters,
                                   records_in_per_s=rate * (p + 1),
                                   backpressure=0.25, watermark_lag_ms=40, state_bytes=1000 * p)
                  for p, name in enumerate(("source", "count"))]
    stats = CheckpointStats(interval_ms=1000, epoch=epoch, history=list(checkpoints))
    return AppSummary(app_id=7, name="app", state=state, submitted_ms=0, restarts=restarts, processors=processors,
                      checkpoints=stats, error=error, versions=list(versions))


def test_each_sample_charts_every_processors_figures_and_what_is_older_than_the_window_goes():
    h = History(sample_s=1, window_s=10)
    for second in range(15):
        h.observe([summary(rate=second)], now_ms=second * 1000)
    series = h.series(7)
    assert series["processors"] == [{"processor": 0, "name": "source"}, {"processor": 1, "name": "count"}]
    assert [s["t_ms"] for s in series["samples"]] == [t * 1000 for t in range(4, 15)]  # 10 s back, and now
    last = series["samples"][-1]["processors"]
    assert last["1"] == {"records_in_per_s": 28.0, "backpressure": 0.25, "watermark_lag_ms": 40, "state_bytes": 1000}
    assert h.series(99)["samples"] == [] and h.timeline(99) == []


def test_the_timeline_tells_state_changes_restarts_and_each_checkpoint_once_in_time_order():
    h = History(sample_s=1, window_s=600)
    h.observe([summary(state=AppState.PENDING)], now_ms=1000)
    done = CheckpointRecord(1, "completed", trigger_ms=2500, duration_ms=120, size_bytes=64)
    flying = CheckpointRecord(2, "in_progress", trigger_ms=3500)
    h.observe([summary(checkpoints=[done, flying])], now_ms=4000)
    failed = CheckpointRecord(2, "failed", trigger_ms=3500, duration_ms=900, failure="declined by 1.0")
    h.observe([summary(checkpoints=[done, failed], restarts=1, epoch=1)], now_ms=5000)
    h.observe([summary(checkpoints=[done, failed], restarts=1, epoch=1)], now_ms=6000)  # nothing new
    error = AppError("ValueError", "bad record", "count")
    h.observe([summary(state=AppState.FAILED, restarts=1, error=error, checkpoints=[done, failed])], now_ms=7000)
    assert [(e["t_ms"], e["kind"]) for e in h.timeline(7)] == [
        (2500, "checkpoint_completed"), (3500, "checkpoint_failed"), (4000, "state"), (5000, "restart"),
        (7000, "state")]
    events = h.timeline(7)
    assert events[1]["detail"] == "checkpoint 2: 900 ms, 0 bytes, declined by 1.0"
    assert events[2]["detail"] == "ACTIVE" and events[3]["detail"] == "restart 1, epoch 1"
    assert events[4]["detail"] == "FAILED (ValueError: bad record)"


def test_an_app_no_longer_listed_is_forgotten_and_a_bad_window_is_refused():
    h = History(sample_s=1, window_s=60)
    h.observe([summary()], now_ms=0)
    h.observe([], now_ms=1000)
    assert h.series(7)["samples"] == []
    with pytest.raises(ValueError):
        History(sample_s=0)
    with pytest.raises(ValueError):
        History(sample_s=10, window_s=5)


def test_a_change_of_parallelism_is_a_rescale_on_the_timeline():
    h = History(sample_s=1, window_s=600)
    h.observe([summary()], now_ms=1000)
    h.observe([summary(counters=4, epoch=1)], now_ms=2000)
    h.observe([summary(counters=4, epoch=1)], now_ms=3000)
    assert h.timeline(7) == [{"t_ms": 2000, "kind": "rescale", "detail": "count 2 → 4"}]


def test_each_change_of_a_replacement_is_on_the_timeline_once():
    first = AppVersion(1, "app.py", "app", "module")
    second = AppVersion(2, "app2.py", "app", "module", processor=1, step="count", state="pending")
    h = History(sample_s=1, window_s=600)
    h.observe([summary(versions=[first])], now_ms=1000)
    h.observe([summary(versions=[first, second])], now_ms=2000)
    h.observe([summary(versions=[first, second])], now_ms=3000)
    rolled_back = AppVersion(2, "app2.py", "app", "module", processor=1, step="count", state="rolled back",
                             error="KeyError: 'user'")
    h.observe([summary(versions=[first, rolled_back])], now_ms=4000)
    assert h.timeline(7) == [
        {"t_ms": 2000, "kind": "replace", "detail": "version 2 of processor 1 (step count) pending"},
        {"t_ms": 4000, "kind": "replace", "detail": "version 2 of processor 1 (step count) rolled back: "
                                                    "KeyError: 'user'"}]
