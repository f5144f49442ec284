"""Property tests of the window operator on random streams of records and watermarks,
checked against an independent per-(record, window) model of lateness."""

from __future__ import annotations

from collections import Counter, defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from gearbus.api.aggregators import Count, Sum
from gearbus.api.windows import (
    WATERMARK_MAX,
    WATERMARK_MIN,
    Accumulation,
    SessionWindows,
    SlidingWindows,
    Triggers,
    TumblingWindows,
)
from gearbus.runtime.windows import WindowOperator

FAST = settings(max_examples=80, deadline=None)

# Records land near the watermark, so that boundaries (a window's last timestamp equal
# to the watermark, sessions that just touch) come up often.
records = st.tuples(st.just("r"), st.sampled_from("abc"), st.integers(-40, 40))
moves = st.tuples(st.just("w"), st.integers(0, 25), st.booleans())
lateness = st.sampled_from([0, 0, 5, 17, 10**6])
early = st.sampled_from([None, 1, 2, 3])


@st.composite
def streams(draw):
    """A list of ("r", key, ts) records and ("w", watermark, explicit) moves; an explicit
    move calls advance(), otherwise the following records carry it to process()."""
    stream, position, started = [], 0, False
    for event in draw(st.lists(st.one_of(records, records, moves), max_size=60)):
        if event[0] == "r":
            stream.append(("r", event[1], position + event[2]))
        else:
            position += event[1] if started else 0
            started = True
            stream.append(("w", position, event[2]))
    return stream


def feed(op: WindowOperator, stream, partials: bool = False):
    """Run ``stream`` through ``op`` (as per-window partials when asked), ending with
    WATERMARK_MAX. Returns the panes, checking each advance() and each window's panes."""
    out = []
    watermark = WATERMARK_MIN
    batch: dict = {}

    def flush():
        # Map-side combine: one partial per (key, window) of the records since the last
        # watermark, in first-seen order, like a combiner flushing before a watermark.
        for (key, _), (acc, weight, ts) in batch.items():
            out.extend(op.process_partial(key, acc, weight, ts, watermark))
        batch.clear()

    def advance(to):
        fired = op.advance(to)
        assert [(r.window_end, r.window_start) for r in fired] == sorted(
            (r.window_end, r.window_start) for r in fired
        )
        assert {r.timing for r in fired} <= {"on_time"}
        out.extend(fired)

    for event in stream:
        if event[0] == "w":
            flush()
            watermark = event[1]
            if event[2]:
                advance(watermark)
        elif partials:
            _, key, ts = event
            (window,) = op.assigner.assign(ts)
            acc, weight, first_ts = batch.get((key, window), (0, 0, ts))
            batch[key, window] = (acc + ts, weight + 1, first_ts)
        else:
            _, key, ts = event
            out.extend(op.process(key, ts, ts, watermark))
    flush()
    advance(WATERMARK_MAX)
    for rows in by_window(out).values():
        timings = [r.timing for r in rows]
        assert timings == sorted(timings, key=["early", "on_time", "late"].index)
        assert timings.count("on_time") <= 1
    assert op.state_size == 0
    return out


def brute_windows(ts: int, size: int, slide: int, offset: int):
    """Every [s, s + size) with s on the slide grid that contains ts."""
    return [(s, s + size) for s in range(ts - size + 1, ts + 1) if (s - offset) % slide == 0]


def model(stream, size: int, slide: int, offset: int, allowed: int):
    """Per (key, start, end): how many records arrived on time and late-but-allowed; and
    how many records were too late for every one of their windows."""
    on_time, late = Counter(), Counter()
    dropped = 0
    watermark = WATERMARK_MIN
    for event in stream:
        if event[0] == "w":
            watermark = event[1]
            continue
        _, key, ts = event
        kept = 0
        for start, end in brute_windows(ts, size, slide, offset):
            if end - 1 > watermark:
                on_time[key, start, end] += 1
            elif end - 1 + allowed > watermark:
                late[key, start, end] += 1
            else:
                continue
            kept += 1
        dropped += not kept
    return on_time, late, dropped


def by_window(panes):
    grouped = defaultdict(list)
    for r in panes:
        grouped[r.key, r.window_start, r.window_end].append(r)
    return grouped


gaps = st.sampled_from([1, 3, 5, 10, 20])
fixed_windows = st.one_of(
    st.tuples(st.integers(1, 30), st.integers(-20, 20)).map(lambda t: (t[0], t[0], t[1])),
    st.tuples(st.integers(1, 6), st.integers(1, 4), st.integers(-10, 10)).map(
        lambda t: (t[0] * t[1], t[1], t[2])
    ),
    st.tuples(st.integers(2, 25), st.integers(1, 25), st.integers(0, 5)).filter(lambda t: t[1] <= t[0]),
)


@FAST
@given(streams(), fixed_windows, lateness, early)
def test_tumbling_and_sliding_panes_match_the_model(stream, shape, allowed, every):
    size, slide, offset = shape
    assigner = TumblingWindows(size, offset) if size == slide else SlidingWindows(size, slide, offset)
    trigger = Triggers.repeat(Triggers.count(every)) if every else None
    discarding = WindowOperator(assigner, Count(), trigger, Accumulation.DISCARDING, allowed)
    accumulating = WindowOperator(assigner, Count(), trigger, Accumulation.ACCUMULATING, allowed)
    on_time, late, dropped = model(stream, size, slide, offset, allowed)

    panes = by_window(feed(discarding, stream))
    finals = by_window(feed(accumulating, stream))
    assert panes.keys() == (on_time + late).keys() == finals.keys()
    for window, rows in panes.items():
        timings = [r.timing for r in rows]
        assert timings.count("early") == (on_time[window] // every if every else 0)
        assert timings.count("on_time") == (1 if on_time[window] else 0)
        assert timings.count("late") == late[window]
        total = on_time[window] + late[window]
        assert sum(r.value for r in rows) == total
        assert finals[window][-1].value == total  # DISCARDING totals == ACCUMULATING finals
    assert discarding.late_dropped == accumulating.late_dropped == dropped

    n_records = sum(e[0] == "r" for e in stream)
    counted = sum(r.value for rows in panes.values() for r in rows)
    if size == slide:
        assert counted == n_records - dropped
    if allowed == 10**6:
        assert dropped == 0
        assert counted == sum(len(brute_windows(e[2], size, slide, offset)) for e in stream if e[0] == "r")


@FAST
@given(streams(), gaps, early, lateness)
def test_sessions_count_every_kept_record_once(stream, gap, every, allowed):
    trigger = Triggers.repeat(Triggers.count(every)) if every else None
    discarding = WindowOperator(SessionWindows(gap), Count(), trigger, Accumulation.DISCARDING, allowed)
    accumulating = WindowOperator(SessionWindows(gap), Count(), trigger, Accumulation.ACCUMULATING, allowed)
    panes = feed(discarding, stream)
    finals = feed(accumulating, stream)
    n_records = sum(e[0] == "r" for e in stream)
    assert sum(r.value for r in panes) == n_records - discarding.late_dropped
    assert accumulating.late_dropped == discarding.late_dropped
    assert discarding._sessions == {}
    if allowed:
        return
    # Without lateness a late record is dropped, and a fired session is gone: each
    # surviving session fires one ON_TIME pane holding everything merged into it.
    assert all(r.timing != "late" for r in panes + finals)
    per_key, final_per_key = Counter(), Counter()
    for r in panes:
        per_key[r.key] += r.value
    for r in finals:
        if r.final:
            final_per_key[r.key] += r.value
    assert +per_key == +final_per_key


@FAST
@given(streams(), gaps)
def test_sessions_with_huge_lateness_drop_nothing_and_end_as_the_model(stream, gap):
    allowed = 10**6
    discarding = WindowOperator(SessionWindows(gap), Count(), allowed_lateness_ms=allowed)
    accumulating = WindowOperator(
        SessionWindows(gap), Count(), accumulation=Accumulation.ACCUMULATING, allowed_lateness_ms=allowed
    )
    panes = feed(discarding, stream)
    last = {(r.key, r.window_start, r.window_end): r.value for r in feed(accumulating, stream)}
    n_records = sum(e[0] == "r" for e in stream)
    assert discarding.late_dropped == accumulating.late_dropped == 0
    assert sum(r.value for r in panes) == n_records

    # Nothing expires before the end, so the sessions are those of all timestamps.
    stamps = defaultdict(list)
    for e in stream:
        if e[0] == "r":
            stamps[e[1]].append(e[2])
    for key, times in stamps.items():
        times.sort()
        start, end, count = times[0], times[0] + gap, 0
        for ts in times + [None]:
            if ts is not None and ts <= end:
                end, count = max(end, ts + gap), count + 1
                continue
            assert last[key, start, end] == count
            if ts is not None:
                start, end, count = ts, ts + gap, 1


@FAST
@given(streams(), st.integers(1, 30), st.integers(-20, 20), lateness)
def test_partials_give_the_same_results_as_records(stream, size, offset, allowed):
    one_by_one = WindowOperator(TumblingWindows(size, offset), Sum(), allowed_lateness_ms=allowed)
    combined = WindowOperator(TumblingWindows(size, offset), Sum(), allowed_lateness_ms=allowed)
    expected = feed(one_by_one, stream)
    got = feed(combined, stream, partials=True)
    assert [r for r in got if r.timing == "on_time"] == [r for r in expected if r.timing == "on_time"]
    totals = {w: sum(r.value for r in rows) for w, rows in by_window(expected).items()}
    assert {w: sum(r.value for r in rows) for w, rows in by_window(got).items()} == totals
    assert combined.late_dropped == one_by_one.late_dropped
