"""What an AppMaster keeps of its app's life for the dashboard: bounded events, and samples
of its processors' figures bounded by the window and by their number."""

from __future__ import annotations

import pytest

from services.appmaster.timeline import AppTimeline
from shared.messages import MetricsHistory, ProcessorInfo, ProcessorMetrics, decode

pytestmark = pytest.mark.unit


def figures(*rates: float) -> list[ProcessorMetrics]:
    return [ProcessorMetrics(p, f"p{p}", 1, records_in_per_s=rate, state_bytes=10 * p) for p, rate in enumerate(rates)]


def test_samples_cover_the_window_and_go_on_the_wire_with_each_processors_figures():
    timeline = AppTimeline(window_ms=10_000, samples_kept=100)
    for second in range(30):
        timeline.sample(second * 1000, figures(second, 2.0 * second))
    history = timeline.history(7, [ProcessorInfo(0, "p0", 1), ProcessorInfo(1, "p1", 1)], heartbeat_ms=1000)
    assert [s.t_ms for s in history.samples] == [t * 1000 for t in range(19, 30)]  # 10 s back, and now
    assert [(p.processor, p.records_in_per_s, p.state_bytes) for p in history.samples[-1].processors] == \
        [(0, 29.0, 0), (1, 58.0, 10)]
    assert decode(history.encode(), (MetricsHistory,)) == history


def test_many_processors_are_sampled_less_often_so_what_is_kept_stays_bounded():
    timeline = AppTimeline(window_ms=60_000, samples_kept=120)
    for second in range(600):
        timeline.sample(second * 1000, figures(*[1.0] * 10))  # 10 processors every second
    kept = sum(len(s.processors) for s in timeline.samples)
    assert timeline.spacing_ms(10) == 5000 and kept <= 120 + 10
    assert timeline.history(7, [], heartbeat_ms=1000).interval_ms == 1000
    assert timeline.history(7, [ProcessorInfo(p, "p", 1) for p in range(10)], heartbeat_ms=1000).interval_ms == 5000


def test_only_the_last_events_are_kept_oldest_first():
    timeline = AppTimeline(events_kept=3)
    for t in range(5):
        timeline.event(t, "rescale", f"count {t} → {t + 1}")
    assert [(e.t_ms, e.detail) for e in timeline.events] == [(2, "count 2 → 3"), (3, "count 3 → 4"),
                                                             (4, "count 4 → 5")]


def test_a_relaunched_appmasters_timeline_goes_on_with_what_its_predecessor_stored():
    before = AppTimeline(events_kept=3)
    before.event(1, "rescale", "count 2 → 3")
    after = AppTimeline(events_kept=3)
    after.restore(list(before.events))
    after.event(2, "restart", "AppMaster relaunched (attempt 1), from checkpoint 4")
    assert [e.t_ms for e in after.events] == [1, 2] and (before.recorded, after.recorded) == (1, 1)
