"""WindowOperator.snapshot/restore: an operator restored from a snapshot taken at any
point, then fed the rest of the input, fires what the uninterrupted one fires."""

from __future__ import annotations

import contextlib
import pickle
from collections import Counter

import pytest

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
from gearbus.runtime.chain import WindowAggregateOp
from gearbus.runtime.snapshots import Lineage
from gearbus.runtime.state_backend import BACKENDS
from gearbus.runtime.windows import WindowOperator
from tests.support.backends import task_holding_state_in
from tests.support.chains import added_up, snapshot_into

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
    """Feed one event (then settle, as the step does between batches); return its panes
    and the driver's watermark after it."""
    if event[0] == "w":
        panes, watermark = (op.advance(event[1]) if event[2] else []), event[1]
    else:
        _, key, ts = event
        panes = op.process(key, ts, ts, watermark)
    op.settle()
    return panes, watermark


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
@given(operators(), streams(), st.data(), st.sampled_from([0, 1, 3, 1000]))
def test_panes_held_on_disk_fire_what_panes_in_memory_fire(make, stream, data, flush_entries):
    """The operator with its panes in RocksDB, written out every few entries (or rarely),
    snapshotted and restored at any points, fires what it fires in memory."""
    cuts = data.draw(st.sets(st.integers(0, len(stream) - 1), max_size=4))
    with contextlib.ExitStack() as backends:
        def make_on_disk():
            op = make()
            op.hold_in(task_holding_state_in("rocksdb", backends, flush_entries).state_backend, "w")
            return op

        assert run(make_on_disk, stream, cuts) == run(make, stream)


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


@FAST
@given(make=operators(), stream=streams(), data=st.data(), backend=st.sampled_from(BACKENDS))
def test_a_chain_of_incremental_snapshots_adds_up_to_the_whole_state(make, stream, data, backend):
    """Snapshots at any points, each holding the panes changed since the last completed
    one's (as the window step takes them), with completions, compactions and restores
    between: every chain adds up to the whole snapshot taken at the same point, and an
    operator restored from one fires what the uninterrupted operator fires. Each example
    holds the panes in a backend drawn at random."""
    with contextlib.ExitStack() as backends:
        check_chain(make, stream, data, lambda: task_holding_state_in(backend, backends))


def check_chain(make, stream, data, new_task):
    step = WindowAggregateOp("w", make, partial_input=False)
    step.open(new_task())
    lineage, stored, truth, completed = Lineage(data.draw(st.sampled_from([0, 2, 4, 4]))), {}, {}, []
    plain = make()
    watermark = WATERMARK_MIN
    for i, event in enumerate(stream):
        action = data.draw(st.sampled_from(["", "snapshot", "snapshot", "complete", "complete", "compact", "restore"]),
                           label=f"at {i}")
        if action == "snapshot":
            truth[snapshot_into(stored, lineage, step, watermark)] = step.snapshot()
        elif action == "complete" and stored:
            completed.append(max(stored))
            lineage.completed(max(stored))
        elif action == "compact" and completed:
            stored[completed[-1]] = stored[completed[-1]].whole(added_up(stored, completed[-1])).self_contained()
            lineage.compacted(completed[-1])
        elif action == "restore" and completed:  # as after a crash: only what the last completed one holds
            state = pickle.loads(pickle.dumps(added_up(stored, completed[-1])))
            step = WindowAggregateOp("w", make, partial_input=False)
            step.open(new_task())
            step.restore(state)
            lineage.restored(stored[completed[-1]].link)
            plain = make()
            plain.restore(pickle.loads(pickle.dumps(truth[completed[-1]]["operator"])))
            stored = {c: envelope for c, envelope in stored.items() if c <= completed[-1]}
            watermark = state["watermark"]
        panes, _ = apply(step.operator, event, watermark)
        expected, watermark = apply(plain, event, watermark)
        assert Counter(panes) == Counter(expected)
    for checkpoint_id in stored:
        assert as_panes(added_up(stored, checkpoint_id)) == as_panes(truth[checkpoint_id])


def as_panes(state: dict) -> tuple:
    """A window step's state with its panes as a multiset (their order within a group is
    the order they changed in, not kept)."""
    operator = dict(state["operator"])
    panes = Counter(repr(entry) for entries in operator.pop("groups").values() for entry in entries)
    return operator, state["watermark"], panes


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


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fired_pane_kept_for_late_records_holds_only_what_came_after(backend):
    """Discarding panes with allowed lateness: a pane read back from disk to fire is reset
    where it is stored, so a late record fires alone."""
    with contextlib.ExitStack() as backends:
        op = WindowOperator(TumblingWindows(10), Count(), None, Accumulation.DISCARDING, 100)
        op.hold_in(task_holding_state_in(backend, backends, flush_entries=0).state_backend, "w")
        fired, watermark = [], WATERMARK_MIN
        for event in [("r", "a", 1), ("r", "a", 2), ("r", "b", 3), ("w", 20, True), ("r", "a", 4),
                      ("w", 30, True), ("r", "b", 5)]:
            panes, watermark = apply(op, event, watermark)
            fired += [(r.key, r.value, r.timing) for r in panes]
        # keys fired together come out in another order on disk
        assert sorted(fired) == [("a", 1, "late"), ("a", 2, "on_time"), ("b", 1, "late"), ("b", 1, "on_time")]
        assert op.state_size == 2


@pytest.mark.parametrize("key", [True, 2.0, ("t", 1.0), frozenset({1, 9})], ids=repr)
@pytest.mark.parametrize("start", [0, 2**63 - 2, -(2**63)], ids=["zero", "largest", "smallest"])
def test_panes_read_back_from_disk_fire_with_their_own_key_and_window(key, start, backends):
    """A key that decodes only as an equal one (a bool as an int) fires as written, and
    windows past the 64-bit range are held as well as any."""
    fired = {}
    for backend in BACKENDS:
        op = WindowOperator(SlidingWindows(10, 5), Count())
        op.hold_in(task_holding_state_in(backend, backends, flush_entries=0).state_backend, "w")
        op.process(key, 1, start, WATERMARK_MIN)
        op.settle()
        fired[backend] = [(repr(r.key), r.value, r.window_start, r.window_end) for r in op.advance(WATERMARK_MAX)]
    assert fired["rocksdb"] == fired["memory"] and len(fired["memory"]) == 2
