"""Windows, triggers and aggregators on hand-built record and watermark sequences."""

from __future__ import annotations

from collections import defaultdict

import msgpack
import pytest

from gearbus.api.aggregators import (
    AggregateFunction,
    Aggregator,
    Count,
    Fold,
    Mean,
    Reduce,
    Sum,
)
from gearbus.api.windows import (
    WATERMARK_MAX,
    WATERMARK_MIN,
    Accumulation,
    GlobalWindows,
    SessionWindows,
    SlidingWindows,
    Triggers,
    TumblingWindows,
    Window,
    WindowResult,
)
from gearbus.runtime.windows import WindowOperator

EARLY_5 = Triggers.repeat(Triggers.count(5))


def run(op: WindowOperator, events) -> list[WindowResult]:
    """Feed ``events``: an int is a watermark, a tuple is a record (key, ts[, value])."""
    out: list[WindowResult] = []
    watermark = WATERMARK_MIN
    for event in events:
        if isinstance(event, int):
            watermark = event
            out += op.advance(event)
        else:
            key, ts, *value = event
            out += op.process(key, value[0] if value else None, ts, watermark)
    return out


def on_time(key, value, start, end):
    return (key, value, start, end, "on_time")


def early(key, value, start, end):
    return (key, value, start, end, "early")


def late(key, value, start, end):
    return (key, value, start, end, "late")


# --- tumbling, watermarks and order ------------------------------------------------


def test_tumbling_out_of_order_fires_when_watermark_reaches_max_timestamp():
    op = WindowOperator(TumblingWindows(10), Count())
    out = run(op, [("a", 3), ("b", 12), ("a", 7), ("a", 1), ("b", 5), 8])
    assert out == []  # [0, 10) is complete only at watermark 9
    assert op.advance(9) == [on_time("a", 3, 0, 10), on_time("b", 1, 0, 10)]
    assert run(op, [("a", 15), 100]) == [on_time("b", 1, 10, 20), on_time("a", 1, 10, 20)]
    assert op.state_size == 0


def test_record_at_the_watermark_is_late_and_one_above_is_on_time():
    op = WindowOperator(TumblingWindows(10), Count())
    assert run(op, [8, ("a", 9), 9, ("a", 9), ("a", 10), WATERMARK_MAX]) == [
        on_time("a", 1, 0, 10),
        on_time("a", 1, 10, 20),
    ]
    assert op.late_dropped == 1


def test_windows_without_records_emit_nothing():
    op = WindowOperator(TumblingWindows(10), Count())
    assert run(op, [("a", 5), ("a", 35), 1000]) == [on_time("a", 1, 0, 10), on_time("a", 1, 30, 40)]


def test_advance_ignores_an_older_watermark_and_process_applies_a_newer_one():
    op = WindowOperator(TumblingWindows(10), Count())
    run(op, [("a", 3)])
    # The record's watermark is ahead of the operator: the window fires first.
    assert op.process("a", None, 15, 9) == [on_time("a", 1, 0, 10)]
    assert op.watermark == 9
    assert op.advance(5) == [] and op.watermark == 9
    assert op.process("a", None, 7, 5) == []  # judged against 9, not 5: dropped
    assert op.late_dropped == 1
    assert op.advance(19) == [on_time("a", 1, 10, 20)]


def test_tumbling_offset_and_negative_timestamps():
    assign = TumblingWindows(10).assign
    assert assign(-1) == (Window(-10, 0),)
    assert assign(-10) == (Window(-10, 0),)
    assert assign(-11) == (Window(-20, -10),)
    assert assign(0) == (Window(0, 10),)
    shifted = TumblingWindows(10, offset_ms=3).assign
    assert shifted(2) == (Window(-7, 3),)
    assert shifted(3) == (Window(3, 13),)
    assert TumblingWindows(10, offset_ms=-7).assign(2) == (Window(-7, 3),)

    op = WindowOperator(TumblingWindows(10), Sum())
    assert run(op, [("a", -15, 1), ("a", -1, 2), ("a", -10, 4), ("a", 0, 8), -11, -1, 9]) == [
        on_time("a", 1, -20, -10),
        on_time("a", 6, -10, 0),
        on_time("a", 8, 0, 10),
    ]


# --- sliding -------------------------------------------------------------------------


@pytest.mark.parametrize("size,slide,offset", [(10, 5, 0), (10, 4, 0), (10, 3, 2), (7, 7, 0), (10, 1, 0)])
def test_sliding_assigns_every_window_that_contains_the_timestamp(size, slide, offset):
    assigner = SlidingWindows(size, slide, offset)
    for ts in range(-40, 40):
        expected = tuple(
            Window(s, s + size) for s in range(-100, 100) if (s - offset) % slide == 0 and s <= ts < s + size
        )
        assert assigner.assign(ts) == expected, ts


def test_sliding_fires_in_window_end_order_with_keys_in_first_seen_order():
    op = WindowOperator(SlidingWindows(10, 5), Count())
    assert run(op, [("a", 7), ("b", 2), ("b", 8), 100]) == [
        on_time("b", 1, -5, 5),
        on_time("a", 1, 0, 10),
        on_time("b", 2, 0, 10),
        on_time("a", 1, 5, 15),
        on_time("b", 1, 5, 15),
    ]


def test_sliding_record_late_for_one_window_is_kept_by_the_other():
    op = WindowOperator(SlidingWindows(10, 5), Count())
    out = run(op, [9, ("a", 7), 14, ("a", 7), 100])
    assert out == [on_time("a", 1, 5, 15)]
    assert op.late_dropped == 1  # only the second record, too late for both windows


# --- sessions -----------------------------------------------------------------------


def test_session_record_that_bridges_two_sessions_merges_them():
    op = WindowOperator(SessionWindows(10), Sum())
    out = run(op, [("u", 0, 1), ("u", 5, 2), ("u", 25, 4), ("v", 3, 100)])
    assert out == []
    assert sorted(op._sessions["u"]) == [Window(0, 15), Window(25, 35)]
    assert run(op, [("u", 15, 8), 100]) == [on_time("v", 100, 3, 13), on_time("u", 15, 0, 35)]
    assert op.state_size == 0 and op._sessions == {}


def test_sessions_that_touch_merge_and_a_gap_keeps_them_apart():
    op = WindowOperator(SessionWindows(10), Count())
    assert run(op, [("a", 0), ("a", 10), ("b", 0), ("b", 11), 100]) == [
        on_time("b", 1, 0, 10),
        on_time("a", 2, 0, 20),
        on_time("b", 1, 11, 21),
    ]


def test_sessions_out_of_order_and_ties_in_firing_order():
    op = WindowOperator(SessionWindows(10), Count())
    assert run(op, [("a", 20), ("a", 0), ("a", 10), 100]) == [on_time("a", 3, 0, 30)]

    op = WindowOperator(SessionWindows(10), Count())
    # b is seen first, but a's session starts earlier; b and c share one window.
    assert run(op, [("b", 15), ("a", 0), ("c", 15), ("a", 5), ("a", 15), 100]) == [
        on_time("a", 3, 0, 25),
        on_time("b", 1, 15, 25),
        on_time("c", 1, 15, 25),
    ]


def test_session_record_behind_the_watermark_that_joins_a_live_session_is_on_time():
    op = WindowOperator(SessionWindows(10), Count())
    out = run(op, [("u", 50), 52, ("u", 42), ("v", 30), ("w", 43), ("x", 44), 100])
    assert out == [on_time("x", 1, 44, 54), on_time("u", 2, 42, 60)]
    assert op.late_dropped == 2  # the lone sessions [30, 40) and [43, 53) were complete


def test_session_bounds_seen_again_fire_once():
    # [0, 10) is scheduled for u, merges away, then is scheduled again for v.
    op = WindowOperator(SessionWindows(10), Count(), allowed_lateness_ms=100)
    assert run(op, [("u", 0), ("u", 5), ("v", 0), 100]) == [on_time("v", 1, 0, 10), on_time("u", 2, 0, 15)]


def test_session_early_trigger_sums_the_counts_of_merged_sessions():
    op = WindowOperator(SessionWindows(10), Count(), EARLY_5)
    out = run(op, [("u", 0), ("u", 1), ("u", 20), ("u", 21)])
    assert out == []
    assert run(op, [("u", 11), 100]) == [early("u", 5, 0, 31), on_time("u", 0, 0, 31)]


def test_session_lateness_late_panes_and_expiry():
    op = WindowOperator(SessionWindows(10), Count(), allowed_lateness_ms=20)
    assert run(op, [("u", 0), 20]) == [on_time("u", 1, 0, 10)]
    # Joins the kept session [0, 10): the merged [0, 11) is complete, so a LATE pane.
    assert run(op, [("u", 1)]) == [late("u", 1, 0, 11)]
    assert op.state_size == 1
    assert run(op, [30]) == []
    assert op.state_size == 0 and op._sessions == {}
    assert run(op, [("u", 2)]) == [late("u", 1, 2, 12)]  # 11 + 20 > 30: still allowed
    assert run(op, [("v", 1)]) == []  # 10 + 20 <= 30: expired
    assert op.late_dropped == 1


def test_session_late_record_can_reopen_a_complete_session():
    # As in Flink: a record within the lateness that extends a complete session past the
    # watermark makes it incomplete again; it fires ON_TIME once more when it completes.
    op = WindowOperator(SessionWindows(10), Count(), allowed_lateness_ms=20)
    assert run(op, [("u", 0), 9]) == [on_time("u", 1, 0, 10)]
    assert run(op, [("u", 5), 20]) == [on_time("u", 1, 0, 15)]


# --- global ------------------------------------------------------------------------------


def test_global_window_fires_only_at_the_final_watermark():
    op = WindowOperator(GlobalWindows(), Count())
    assert run(op, [("a", -(10**15)), ("b", 3), ("a", 10**15), 10**16]) == []
    assert op.advance(WATERMARK_MAX) == [
        on_time("a", 2, WATERMARK_MIN, WATERMARK_MAX),
        on_time("b", 1, WATERMARK_MIN, WATERMARK_MAX),
    ]


def test_global_window_with_early_trigger():
    op = WindowOperator(GlobalWindows(), Count(), Triggers.repeat(Triggers.count(2)))
    out = run(op, [("a", 1), ("a", 2), ("a", 3), WATERMARK_MAX])
    assert out == [early("a", 2, WATERMARK_MIN, WATERMARK_MAX), on_time("a", 1, WATERMARK_MIN, WATERMARK_MAX)]
    assert [r.final for r in out] == [False, True]


def test_final_watermark_fires_and_clears_everything_despite_lateness():
    op = WindowOperator(TumblingWindows(10), Count(), allowed_lateness_ms=10**6)
    out = run(op, [("a", 1), ("b", 25), 9, ("a", 2), WATERMARK_MAX])
    assert out == [on_time("a", 1, 0, 10), late("a", 1, 0, 10), on_time("b", 1, 20, 30)]
    assert op.state_size == 0
    assert op.process("a", None, 3, WATERMARK_MAX) == []
    assert op.late_dropped == 1


# --- early trigger and accumulation ------------------------------------------------------


def test_pageviews_early_every_5_discarding_ends_with_one_final_pane_per_window():
    op = WindowOperator(TumblingWindows(10_000), Count(), EARLY_5, Accumulation.DISCARDING)
    views = {"m": 5, "n": 7, "o": 3, "p": 10}
    events = [(member, 1000 + i) for member, n in views.items() for i in range(n)]
    events += [("m", 12_000), 9_999, WATERMARK_MAX]
    out = run(op, events)
    assert out == [
        early("m", 5, 0, 10_000),
        early("n", 5, 0, 10_000),
        early("p", 5, 0, 10_000),
        early("p", 5, 0, 10_000),
        on_time("m", 0, 0, 10_000),
        on_time("n", 2, 0, 10_000),
        on_time("o", 3, 0, 10_000),
        on_time("p", 0, 0, 10_000),
        on_time("m", 1, 10_000, 20_000),
    ]
    finals = defaultdict(int)
    totals = defaultdict(int)
    for r in out:
        finals[r.key, r.window_start] += r.final
        totals[r.key, r.window_start] += r.value
    assert set(finals.values()) == {1}
    assert totals == {("m", 0): 5, ("n", 0): 7, ("o", 0): 3, ("p", 0): 10, ("m", 10_000): 1}


def test_early_trigger_accumulating_carries_everything_so_far():
    op = WindowOperator(TumblingWindows(10_000), Count(), EARLY_5, Accumulation.ACCUMULATING)
    out = run(op, [("m", ts) for ts in range(12)] + [WATERMARK_MAX])
    assert out == [early("m", 5, 0, 10_000), early("m", 10, 0, 10_000), on_time("m", 12, 0, 10_000)]


def test_count_trigger_counts_per_key_and_window():
    op = WindowOperator(SlidingWindows(10, 5), Count(), Triggers.repeat(Triggers.count(2)))
    out = run(op, [("a", 7), ("b", 7), ("a", 12)])
    assert out == [early("a", 2, 5, 15)]


# --- lateness, dropping and side output --------------------------------------------------


@pytest.mark.parametrize(
    "mode,panes",
    [
        (Accumulation.DISCARDING, [1, 1, 1]),
        (Accumulation.ACCUMULATING, [3, 4, 5]),
    ],
)
def test_allowed_lateness_fires_late_panes_until_the_window_expires(mode, panes):
    op = WindowOperator(TumblingWindows(10), Count(), accumulation=mode, allowed_lateness_ms=5)
    out = run(op, [("a", 1), ("a", 2), 9, ("a", 3), 13, ("a", 4), ("b", 5), 14, ("a", 6)])
    assert out == [
        on_time("a", 2, 0, 10),
        late("a", panes[0], 0, 10),
        late("a", panes[1], 0, 10),
        late("b", 1, 0, 10),  # b's first record was late: no ON_TIME pane for it
    ]
    assert op.state_size == 0
    assert op.late_dropped == 1


def test_too_late_records_go_to_the_side_output_when_asked():
    op = WindowOperator(TumblingWindows(10), Count(), side_output_late=True)
    assert run(op, [("a", 1, "x"), 20, ("a", 5, "y"), ("b", 15, "z")]) == [on_time("a", 1, 0, 10)]
    assert op.drain_late() == [("a", "y", 5), ("b", "z", 15)]
    assert op.drain_late() == []
    assert (op.late_side_output, op.late_dropped) == (2, 0)


def test_sensors_mean_per_minute_with_lateness():
    op = WindowOperator(TumblingWindows(60_000), Mean(lambda r: r["temp"]), allowed_lateness_ms=30_000)
    readings = [("s1", 1_000, 20.0), ("s1", 50_000, 22.0), ("s2", 3_000, 10.0), ("s1", 61_000, 30.0)]
    out = run(op, [(k, ts, {"temp": t}) for k, ts, t in readings] + [60_000])
    assert out == [on_time("s1", 21.0, 0, 60_000), on_time("s2", 10.0, 0, 60_000)]
    out = run(op, [60_000, ("s1", 2_000, {"temp": 24.0}), 90_000, ("s1", 3_000, {"temp": 0.0}), WATERMARK_MAX])
    assert out == [late("s1", 24.0, 0, 60_000), on_time("s1", 30.0, 60_000, 120_000)]
    assert op.late_dropped == 1


# --- partials (map-side combine) -----------------------------------------------------------


def test_process_partial_matches_process():
    records = [("a", 1, 1), ("b", 2, 10), ("a", 3, 2), ("a", 12, 4)]
    one_by_one = WindowOperator(TumblingWindows(10), Sum())
    expected = run(one_by_one, records + [WATERMARK_MAX])
    combined = WindowOperator(TumblingWindows(10), Sum())
    assert combined.process_partial("a", 3, 2, 1, WATERMARK_MIN) == []
    assert combined.process_partial("b", 10, 1, 2, WATERMARK_MIN) == []
    assert combined.process_partial("a", 4, 1, 12, WATERMARK_MIN) == []
    assert combined.advance(WATERMARK_MAX) == expected


def test_partial_weight_counts_toward_the_trigger_and_late_drops():
    op = WindowOperator(TumblingWindows(10), Mean(), EARLY_5)
    assert op.process_partial("a", (6, 3), 3, 1, WATERMARK_MIN) == []
    assert op.process_partial("a", [8, 2], 2, 4, WATERMARK_MIN) == [early("a", 2.8, 0, 10)]
    assert op.advance(9) == [on_time("a", None, 0, 10)]
    assert op.process_partial("a", (5, 4), 4, 5, 9) == []
    assert op.late_dropped == 4


def test_late_partial_within_lateness_fires_one_late_pane():
    op = WindowOperator(TumblingWindows(10), Count(), allowed_lateness_ms=10)
    run(op, [("a", 1), 9])
    assert op.process_partial("a", 4, 4, 5, 9) == [late("a", 4, 0, 10)]


def test_process_partial_refuses_what_it_cannot_do_exactly():
    with pytest.raises(ValueError, match="SessionWindows"):
        WindowOperator(SessionWindows(10), Count()).process_partial("a", 1, 1, 0, 0)
    with pytest.raises(ValueError, match="combinable"):
        WindowOperator(TumblingWindows(10), Fold(0, max)).process_partial("a", 1, 1, 0, 0)
    with pytest.raises(ValueError, match="side_output_late"):
        WindowOperator(TumblingWindows(10), Count(), side_output_late=True).process_partial("a", 1, 1, 0, 0)


# --- validation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: TumblingWindows(0), "size_ms must be >= 1"),
        (lambda: TumblingWindows(-5), "size_ms must be >= 1"),
        (lambda: TumblingWindows(1.5), "size_ms must be an int"),
        (lambda: TumblingWindows("10"), "size_ms must be an int"),
        (lambda: TumblingWindows(True), "size_ms must be an int"),
        (lambda: TumblingWindows(10, offset_ms=0.5), "offset_ms must be an int"),
        (lambda: SlidingWindows(0, 1), "size_ms must be >= 1"),
        (lambda: SlidingWindows(10, 0), "slide_ms must be >= 1"),
        (lambda: SlidingWindows(10, 11), "must not exceed size_ms"),
        (lambda: SessionWindows(0), "gap_ms must be >= 1"),
        (lambda: WindowOperator(TumblingWindows(10), Count(), allowed_lateness_ms=-1), "allowed_lateness_ms"),
        (lambda: Triggers.count(0), "positive int"),
        (lambda: Triggers.count(2.0), "positive int"),
        (lambda: Triggers.repeat(Triggers.watermark()), "only Triggers.count"),
        (lambda: WindowOperator(TumblingWindows(10), Count(), Triggers.count(5)), r"Triggers.repeat\(Triggers.count"),
        (lambda: WindowOperator(SessionWindows(10), Fold(0, lambda a, v: a + v)), "Fold.*not combinable"),
        (
            lambda: WindowOperator(SessionWindows(10), AggregateFunction(list, lambda a, v: a + [v])),
            "not combinable",
        ),
    ],
)
def test_invalid_arguments_raise_clear_value_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_invalid_types_raise_type_errors():
    with pytest.raises(TypeError, match="WindowAssigner"):
        WindowOperator(10, Count())
    with pytest.raises(TypeError, match="Aggregator"):
        WindowOperator(TumblingWindows(10), len)
    with pytest.raises(TypeError, match="Accumulation"):
        WindowOperator(TumblingWindows(10), Count(), accumulation="discarding")


def test_watermark_trigger_is_the_default():
    op = WindowOperator(TumblingWindows(10), Count(), Triggers.watermark())
    assert run(op, [("a", ts) for ts in range(10)] + [9]) == [on_time("a", 10, 0, 10)]


# --- aggregators -------------------------------------------------------------------------


def roundtrip(acc):
    """What a partial looks like after crossing the bus."""
    return msgpack.unpackb(msgpack.packb(acc))


def fold_all(agg: Aggregator, values):
    acc = agg.create()
    for v in values:
        acc = agg.add(acc, v)
    return acc


def test_builtin_aggregators():
    assert Count().result(fold_all(Count(), "abc")) == 3
    assert Sum().result(fold_all(Sum(), [1, 2.5])) == 3.5
    assert Sum(len).result(fold_all(Sum(len), ["ab", "c"])) == 3
    assert Reduce(max).result(Reduce(max).create()) is None
    assert Reduce(max).merge(None, fold_all(Reduce(max), [3, 9, 4])) == 9
    assert Reduce(max).merge(7, None) == 7
    mean = Mean(lambda r: r["t"])
    a = roundtrip(fold_all(mean, [{"t": 1}, {"t": 2}]))
    b = roundtrip(fold_all(mean, [{"t": 6}]))
    assert mean.result(mean.merge(a, b)) == 3.0
    assert mean.result(mean.add(a, {"t": 5})) == 8 / 3
    assert mean.result(mean.create()) is None
    assert all(agg.combinable for agg in (Count(), Sum(), Reduce(max), Mean()))


def test_fold_is_not_combinable_and_copies_its_zero():
    fold = Fold([], lambda acc, v: acc.append(v) or acc)
    assert not fold.combinable
    assert fold_all(fold, [1, 2]) == [1, 2]
    assert fold.create() == []
    with pytest.raises(TypeError, match="Fold has no merge"):
        fold.merge([1], [2])


def test_aggregate_function_is_combinable_only_with_merge():
    plain = AggregateFunction(lambda: 0, lambda acc, v: acc + v)
    assert not plain.combinable
    assert plain.result(fold_all(plain, [1, 2])) == 3
    full = AggregateFunction(lambda: [], lambda acc, v: acc + [v], lambda a, b: a + b, sorted)
    assert full.combinable
    assert full.result(full.merge([3, 1], roundtrip(fold_all(full, [2])))) == [1, 2, 3]

    class NoMerge(Aggregator):
        def create(self):
            return 0

        def add(self, acc, value):
            return acc + 1

    assert not NoMerge().combinable


def test_aggregate_function_in_sessions_and_tumbling():
    distinct = AggregateFunction(
        create=lambda: [],
        add=lambda acc, v: acc if v in acc else acc + [v],
        merge=lambda a, b: a + [v for v in b if v not in a],
        result=sorted,
    )
    op = WindowOperator(SessionWindows(10), distinct)
    assert run(op, [("u", 0, "x"), ("u", 20, "y"), ("u", 10, "x"), 100]) == [on_time("u", ["x", "y"], 0, 30)]
    op = WindowOperator(TumblingWindows(10), distinct)
    assert run(op, [("u", 0, "x"), ("u", 2, "x"), 100]) == [on_time("u", ["x"], 0, 10)]


def test_window_result_final_flag():
    assert not WindowResult("k", 1, 0, 10, "early").final
    assert WindowResult("k", 1, 0, 10, "on_time").final
    assert WindowResult("k", 1, 0, 10, "late").final
