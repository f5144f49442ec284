"""WindowOperator.snapshot/restore: an operator restored from a snapshot taken at any
point, then fed the rest of the input, fires what the uninterrupted one fires."""

from __future__ import annotations

import pickle
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from gearbus.api.aggregators import AggregateFunction, Count
from gearbus.api.windows import (
    WATERMARK_MAX,
    WATERMARK_MIN,
    Accumulation,
    SessionWindows,
    SlidingWindows,
    Triggers,
    TumblingWindows,
)
from gearbus.api.partitioners import MAX_PARALLELISM, key_group
from gearbus.runtime.windows import WindowOperator

FAST = settings(max_examples=150, deadline=None)

KEYS = ["a", "b", "c", 7, ("t", 1), None]
records = st.tuples(st.just("r"), st.sampled_from(KEYS), st.integers(-40, 40))
moves = st.tuples(st.just("w"), st.integers(0, 25), st.booleans())


@st.composite
def streams(draw):
    """("r", key, ts) records near the watermark and ("w", watermark, explicit) moves; an
    explicit move calls advance(), otherwise the next records carry it to process()."""
    stream, position = [], 0
    for event in draw(st.lists(st.one_of(records, records, moves), max_size=50)):
        if event[0] == "r":
            stream.append(("r", event[1], position + event[2]))
        else:
            position += event[1]
            stream.append(("w", position, event[2]))
    return stream + [("w", WATERMARK_MAX, True)]


assigners = st.one_of(
    st.builds(TumblingWindows, st.integers(1, 30), st.integers(-20, 20)),
    st.tuples(st.integers(1, 6), st.integers(1, 4), st.integers(-10, 10)).map(
        lambda t: SlidingWindows(t[0] * t[1], t[1], t[2])
    ),
    st.builds(SessionWindows, st.sampled_from([1, 3, 5, 10, 20])),
)


def collect_in_place():
    """A list accumulator updated in place, so a snapshot that shared it would change."""

    def add(acc, value):
        acc.append(value)
        return acc

    def merge(a, b):
        a.extend(b)
        return a

    return AggregateFunction(list, add, merge, tuple)


@st.composite
def operators(draw):
    """A factory of identically configured operators."""
    assigner = draw(assigners)
    aggregator = draw(st.sampled_from(["count", "list"]))
    every = draw(st.sampled_from([None, 1, 2, 3]))
    accumulation = draw(st.sampled_from(list(Accumulation)))
    lateness = draw(st.sampled_from([0, 0, 5, 17, 10**6]))
    side_output = draw(st.booleans())

    def make():
        return WindowOperator(
            assigner,
            Count() if aggregator == "count" else collect_in_place(),
            Triggers.repeat(Triggers.count(every)) if every else None,
            accumulation,
            lateness,
            side_output,
        )

    return make


def apply(op: WindowOperator, event, watermark: int):
    """Feed one event; return its panes and the driver's watermark after it."""
    if event[0] == "w":
        return (op.advance(event[1]) if event[2] else []), event[1]
    _, key, ts = event
    return op.process(key, ts, ts, watermark), watermark


def observe(op: WindowOperator, panes) -> tuple:
    """What one step shows: its panes (the firing order of windows and timings, and the
    panes as a multiset: keys of one window may come out in another order after a
    restore), the late records and counters, and the size of the state."""
    order = [(r.window_end, r.window_start, r.timing) for r in panes]
    return order, Counter(panes), op.drain_late(), op.late_dropped, op.late_side_output, op.state_size


def run(make, stream, cuts=frozenset()):
    """Run ``stream``; before each event whose index is in ``cuts``, snapshot, let the old
    operator go on with that event (as a zombie would), and continue with a new operator
    restored from the pickled snapshot."""
    op = make()
    watermark = WATERMARK_MIN
    steps = []
    for i, event in enumerate(stream):
        if i in cuts:
            state = op.snapshot()
            apply(op, event, watermark)
            op = make()
            op.restore(pickle.loads(pickle.dumps(state)))
        panes, watermark = apply(op, event, watermark)
        steps.append(observe(op, panes))
    assert op.state_size == 0
    return steps


@FAST
@given(operators(), streams(), st.data())
def test_restored_operator_fires_what_the_uninterrupted_one_fires(make, stream, data):
    cuts = data.draw(st.sets(st.integers(0, len(stream) - 1), max_size=4))
    assert run(make, stream, cuts) == run(make, stream)


@FAST
@given(operators(), streams(), st.data())
def test_groups_of_two_tasks_restore_into_one(make, stream, data):
    """Rescaling 2 -> 1: two operators each own the keys of half the key groups; their
    snapshots at the same point, merged, restore one operator that takes all keys. Every
    task receives every watermark, so watermark moves are all explicit here."""
    stream = [("w", e[1], True) if e[0] == "w" else e for e in stream]
    cut = data.draw(st.integers(0, len(stream) - 1))
    whole = run(make, stream)

    halves = [make(), make()]
    watermark = WATERMARK_MIN
    merged = []
    for event in stream[:cut]:
        panes = []
        for half, op in enumerate(halves):
            if event[0] == "w" or key_group(event[1]) % 2 == half:
                panes += apply(op, event, watermark)[0]
        watermark = event[1] if event[0] == "w" else watermark
        late = halves[0].drain_late() + halves[1].drain_late()
        merged.append((Counter(panes), sorted(late, key=repr), sum(op.state_size for op in halves)))
    states = [op.snapshot() for op in halves]
    assert states[0]["watermark"] == states[1]["watermark"]
    assert not states[0]["groups"].keys() & states[1]["groups"].keys()
    op = make()
    op.restore(pickle.loads(pickle.dumps({
        "watermark": states[0]["watermark"],
        "late_dropped": sum(s["late_dropped"] for s in states),
        "late_side_output": sum(s["late_side_output"] for s in states),
        "late": states[0]["late"] + states[1]["late"],
        "groups": states[0]["groups"] | states[1]["groups"],
    })))
    for event in stream[cut:]:
        panes, watermark = apply(op, event, watermark)
        merged.append((Counter(panes), sorted(op.drain_late(), key=repr), op.state_size))
    assert merged == [(panes, sorted(late, key=repr), size) for _, panes, late, _, _, size in whole]
    assert (op.late_dropped, op.late_side_output) == whole[-1][3:5]


def test_snapshot_is_plain_data_grouped_by_key_group():
    op = WindowOperator(
        SessionWindows(10), Count(), accumulation=Accumulation.ACCUMULATING, allowed_lateness_ms=100,
        side_output_late=True,
    )
    for key, ts in [("a", 1), ("b", 2), ("a", 8), (3, 30)]:
        op.process(key, "v", ts, WATERMARK_MIN)
    op.advance(30)
    op.process("z", "late", -200, 30)
    state = op.snapshot()
    assert state == {
        "watermark": 30,
        "late_dropped": 0,
        "late_side_output": 1,
        "late": [("z", "late", -200)],
        "groups": state["groups"],
    }
    assert all(0 <= group < MAX_PARALLELISM for group in state["groups"])
    entries = sorted((e for group in state["groups"].values() for e in group), key=repr)
    assert entries == sorted([(1, 18, "a", 2, 0), (2, 12, "b", 1, 0), (30, 40, 3, 1, 0)], key=repr)
    for group, rows in state["groups"].items():
        assert {key_group(row[2]) for row in rows} == {group}
    assert pickle.loads(pickle.dumps(state)) == state


def test_restore_replaces_the_operators_state():
    used = WindowOperator(TumblingWindows(10), Count())
    used.process("x", "v", 5, WATERMARK_MIN)
    empty = WindowOperator(TumblingWindows(10), Count()).snapshot()
    used.restore(empty)
    assert used.state_size == 0
    assert used.advance(WATERMARK_MAX) == []
