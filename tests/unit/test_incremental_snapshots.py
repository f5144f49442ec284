"""Incremental snapshots: any sequence of writes, removals, timers, snapshots, completions,
compactions and restores gives, from the chain of stored snapshots, exactly the state the
step held; and no chain reaches below the root its snapshot names (what pruning trusts).
On every state backend: the step's state in a dict, or in RocksDB written back in small
batches (so reads meet both written and waiting entries)."""

from __future__ import annotations

import contextlib
import copy
import gc
import pickle
import threading
from dataclasses import replace

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gearbus.api import partitioners
from gearbus.api.keyed import KeyedProcessFunction
from gearbus.runtime.keygroups import ChangeLog, Columns, KeyedDelta, chain_onto, collector_paused, keyed_share
from gearbus.runtime.keyed import KeyedProcessOp, StatefulMapOp
from gearbus.runtime.snapshots import Lineage, Link, TaskSnapshot
from tests.support.backends import task_holding_state_in

KEYS = st.sampled_from(["a", "b", "c", ("t", 1), 7, 3.5])


class Remember(KeyedProcessFunction):
    """value None: forget the key; an int: set the timer at that time; else: the state."""

    def process(self, value, ctx):
        if value is None:
            ctx.state = None
        elif isinstance(value, int):
            ctx.register_event_time_timer(value)
        elif value == "append":
            if ctx.state is not None and isinstance(ctx.state, list):
                ctx.state.append(1)  # changed in place, never assigned back
        else:
            ctx.state = value

    def on_timer(self, timestamp, ctx):
        ctx.state = ["fired", timestamp]


class _Context:
    epoch = 0
    task_name = "t"

    def now_ms(self):
        return 0


def new_op(slack: int = ChangeLog.SLACK, backends: contextlib.ExitStack | None = None,
           backend: str = "memory") -> KeyedProcessOp:
    """The step, its state in ``backend`` (closed with ``backends``)."""
    op = KeyedProcessOp("remember", Remember, None)
    op.open(task_holding_state_in(backend, backends or contextlib.ExitStack(), context=_Context()))
    op.changes.SLACK = slack
    return op


def whole(op: KeyedProcessOp) -> dict:
    """What the step holds, key by key (not as a snapshot reads it), without touching its
    change log."""
    keys = set(op.states.values) | set(op.event_timers.by_key) | set(op.processing_timers.by_key)
    return {key: op._entry(key) for key in keys}


def as_entries(state: dict) -> dict:
    return {key: tuple(entry) for group in state["groups"].values() for key, *entry in group}


def chain_of(stored: dict[int, TaskSnapshot], checkpoint_id: int) -> list[TaskSnapshot]:
    """The snapshot and those it builds on, newest first."""
    chain, at = [], checkpoint_id
    while at is not None:
        chain.append(stored[at])
        at = stored[at].base[0] if stored[at].base else None
    return chain


def from_chain(stored: dict[int, TaskSnapshot], checkpoint_id: int) -> dict:
    chain = chain_of(stored, checkpoint_id)
    state = None
    for envelope in reversed(chain):
        state = envelope.state.onto(state) if isinstance(envelope.state, KeyedDelta) else envelope.state
    return state


EVENTS = st.lists(st.one_of(
    st.tuples(st.just("write"), KEYS, st.one_of(st.none(), st.text(max_size=3), st.builds(lambda: ["l"]),
                                                st.just("append"), st.integers(0, 50))),
    st.tuples(st.just("watermark"), st.integers(0, 60)),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("complete"), st.integers(0, 3)),
    st.tuples(st.just("restore")),
    st.tuples(st.just("compact"), st.integers(0, 3)),
), max_size=80)


@settings(max_examples=400, deadline=None)
@given(events=EVENTS, max_depth=st.integers(0, 4), slack=st.sampled_from([0, 2, 1024]))
def test_a_chain_of_snapshots_adds_up_to_what_the_step_held(events, max_depth, slack):
    """``slack``: how many changes beyond twice the keys held the change log remembers
    before it forgets them and snapshots whole (0 and 2 make it forget often)."""
    check_chains(events, max_depth, lambda: new_op(slack))


@settings(max_examples=150, deadline=None)
@given(events=EVENTS, max_depth=st.integers(0, 4), slack=st.sampled_from([0, 2, 1024]))
def test_a_chain_of_snapshots_adds_up_to_what_the_step_held_in_rocksdb(events, max_depth, slack):
    """The same with the step's state in RocksDB, written out every few entries (fewer
    examples: each opens a database)."""
    with contextlib.ExitStack() as backends:
        check_chains(events, max_depth, lambda: new_op(slack, backends, "rocksdb"))


def check_chains(events, max_depth, new_step):
    op, lineage = new_step(), Lineage(max_depth)
    stored: dict[int, TaskSnapshot] = {}
    truth: dict[int, dict] = {}
    completed: list[int] = []
    taken: list[int] = []  # snapshots not yet completed
    next_id = 1
    for event in events:
        kind = event[0]
        if kind == "write":
            op.process([(event[2], 0, event[1])])
        elif kind == "watermark":
            op.on_watermark(event[1])
        elif kind == "snapshot":
            op.prepare_checkpoint(next_id)
            link, base = lineage.plan(next_id, 0)
            state = op.snapshot_since(base.checkpoint_id if base else None)
            assert base is not None or not isinstance(state, KeyedDelta)
            stored[next_id] = TaskSnapshot(next_id, state, False, op.watermark, 0,
                                           (base.checkpoint_id, 0) if base else None, link.depth, link.root)
            assert link.depth <= max_depth
            truth[next_id] = whole(op)
            taken.append(next_id)
            next_id += 1
        elif kind == "complete" and taken:
            checkpoint_id = taken[min(event[1], len(taken) - 1)]
            taken = [c for c in taken if c > checkpoint_id]  # older ones were abandoned
            completed.append(checkpoint_id)
            lineage.completed(checkpoint_id)
        elif kind == "compact" and completed:  # as the AppMaster does: same object, whole state
            checkpoint_id = completed[-1 - min(event[1], len(completed) - 1)]
            compacted = pickle.loads(pickle.dumps(from_chain(stored, checkpoint_id)))  # as stored: a group at a time
            stored[checkpoint_id] = replace(stored[checkpoint_id], state=compacted, base=None, depth=0, root=0)
            lineage.compacted(checkpoint_id)
        elif kind == "restore" and completed:
            checkpoint_id = completed[-1]
            state = from_chain(stored, checkpoint_id)
            op, lineage = new_step(), Lineage(max_depth)
            op.restore(copy.deepcopy(state))  # as decoded from the store: nothing shared with it
            lineage.restored(stored[checkpoint_id].link)
            taken = []
    for checkpoint_id in completed + taken:
        assert as_entries(from_chain(stored, checkpoint_id)) == truth[checkpoint_id]
        chain = chain_of(stored, checkpoint_id)
        assert len(chain) <= max_depth + 1
        assert chain[-1].checkpoint_id >= (stored[checkpoint_id].root or checkpoint_id)


def test_a_compaction_shortens_exactly_the_chains_through_it():
    lineage = Lineage()
    for checkpoint_id in (1, 2, 3):
        lineage.plan(checkpoint_id, 0)
        lineage.completed(checkpoint_id)
    four, base = lineage.plan(4, 0)  # taken on 3; 3's completion message is late for 5
    five, _ = lineage.plan(5, 0)
    assert (four.depth, four.root, base.checkpoint_id) == (3, 1, 3)
    lineage.compacted(2)
    lineage.completed(4)
    six, base = lineage.plan(6, 0)
    assert (base.checkpoint_id, six.depth, six.root) == (4, 3, 2)  # 6 -> 4 -> 3 -> 2, whole now
    lineage.compacted(5)  # 5 was abandoned: no chain passes through it
    lineage.completed(6)
    seven, _ = lineage.plan(7, 0)
    assert (seven.depth, seven.root) == (4, 2)


def test_a_snapshot_building_on_another_holds_only_the_keys_changed_since():
    op, lineage = new_op(), Lineage()
    op.process([(f"v{n}", 0, n) for n in range(1000)])
    op.prepare_checkpoint(1)
    link, base = lineage.plan(1, 0)
    assert base is None and len(op.snapshot_since(None)["groups"]) > 1
    lineage.completed(1)
    op.process([("new", 0, 5), (None, 0, 6)])
    op.prepare_checkpoint(2)
    _, base = lineage.plan(2, 0)
    delta = op.snapshot_since(base.checkpoint_id)
    assert [e[0] for entries in delta.written.values() for e in entries] == [5]
    assert [k for keys in delta.removed.values() for k in keys] == [6]


def test_changes_forgotten_past_the_bound_make_snapshots_whole_until_a_later_base():
    """Keys come and go faster than checkpoints complete: the change log forgets, and no
    snapshot may then build on a base from before it forgot (changes since it are lost)."""
    op, lineage = new_op(slack=0), Lineage()
    stored: dict[int, TaskSnapshot] = {}

    def snapshot(checkpoint_id: int) -> None:
        op.prepare_checkpoint(checkpoint_id)
        link, base = lineage.plan(checkpoint_id, 0)
        stored[checkpoint_id] = TaskSnapshot(checkpoint_id, op.snapshot_since(base.checkpoint_id if base else None),
                                             False, op.watermark, 0, (base.checkpoint_id, 0) if base else None,
                                             link.depth, link.root)

    op.process([("x", 0, "keep")] + [("x", 0, f"stay{n}") for n in range(4)])  # more keys than change later
    snapshot(1)
    lineage.completed(1)
    snapshot(2)  # builds on 1; completes only later
    op.process([("changed", 0, "keep")])  # after 2's snapshot: only the log knows
    op.process([("tmp", 0, f"k{n}") for n in range(12)] + [(None, 0, f"k{n}") for n in range(12)])  # it forgets
    snapshot(3)
    assert not isinstance(stored[3].state, KeyedDelta)
    lineage.completed(2)
    snapshot(4)  # its base is 2, from before the log forgot: whole
    assert not isinstance(stored[4].state, KeyedDelta)
    assert as_entries(from_chain(stored, 4))["keep"][0] == "changed"
    lineage.completed(4)
    op.process([("again", 0, "keep")])
    snapshot(5)
    assert isinstance(stored[5].state, KeyedDelta)
    assert as_entries(from_chain(stored, 5))["keep"][0] == "again"


def test_a_snapshot_is_whole_once_as_many_keys_changed_as_are_held():
    """Every key changed since the base: the changes would be as large as the whole state
    and cost more to gather, so the snapshot is whole (its chain still adds up)."""
    op, lineage = new_op(), Lineage()
    stored: dict[int, TaskSnapshot] = {}
    for checkpoint_id, keys in ((1, range(10)), (2, range(3)), (3, range(10))):
        op.process([("v", 0, f"k{n}") for n in keys])
        op.prepare_checkpoint(checkpoint_id)
        link, base = lineage.plan(checkpoint_id, 0)
        stored[checkpoint_id] = TaskSnapshot(checkpoint_id, op.snapshot_since(base.checkpoint_id if base else None),
                                             False, op.watermark, 0, (base.checkpoint_id, 0) if base else None,
                                             link.depth, link.root)
        lineage.completed(checkpoint_id)
    assert isinstance(stored[2].state, KeyedDelta) and not isinstance(stored[3].state, KeyedDelta)
    assert stored[3].base == (2, 0) and len(as_entries(from_chain(stored, 3))) == 10


def test_a_completion_come_late_is_no_base_once_a_later_whole_snapshot_was_taken():
    """Checkpoint 1's completion arrives after checkpoint 2's whole snapshot: once 2
    completes, 1 may be pruned, so nothing may build on it."""
    lineage = Lineage()
    lineage.plan(1, 0)
    _, base = lineage.plan(2, 0)  # 1's completion not heard yet: whole
    assert base is None
    lineage.completed(1)  # late
    link, base = lineage.plan(3, 0)
    assert base is None and link.root == 3
    lineage.completed(2)  # older than 3's whole snapshot too: a task's roots never go down
    _, base = lineage.plan(4, 0)
    assert base is None
    lineage.completed(4)
    link, base = lineage.plan(5, 0)
    assert base.checkpoint_id == 4 and link.root == 4


def test_no_snapshot_builds_on_a_base_older_than_a_whole_one_taken_since():
    """6 is taken whole, so its ack names 6 as the task's root and the AppMaster may prune
    1..5 once 6 completes; 7, planned before the task hears of 6's completion, must not
    build on 5 (its chain would reach back to 1)."""
    lineage = Lineage()
    for checkpoint_id in range(1, 6):
        lineage.plan(checkpoint_id, 0)
        lineage.completed(checkpoint_id)
    lineage.plan(6, 0)
    assert lineage.taken_whole(6) == Link(6, 0, 0, 6)
    link, base = lineage.plan(7, 0)
    assert base is None and link.root == 7
    lineage.completed(6)
    lineage.completed(7)
    link, base = lineage.plan(8, 0)
    assert base.checkpoint_id == 7 and link.root == 7


def keep_or_append(state, value):
    """A stateful_map function: "append" changes a list state in place (handed back
    as it is), anything else replaces the state (None forgets the key)."""
    if value == "append":
        if isinstance(state, list):
            state.append(1)
        return state, None
    return value, None


@settings(max_examples=200, deadline=None)
@given(rounds=st.lists(st.tuples(st.lists(st.tuples(KEYS, st.one_of(st.none(), st.integers(0, 9), st.just("append"),
                                                                    st.lists(st.integers(0, 3), max_size=2))),
                                          max_size=12), st.booleans()), min_size=1, max_size=6),
       ttl_ms=st.sampled_from([None, 1000]), backend=st.sampled_from(["memory", "rocksdb"]))
def test_a_stateful_map_restores_a_chain_layer_by_layer_to_what_it_held(rounds, ttl_ms, backend):
    """A ``stateful_map`` step puts a chain back one layer after another, straight into
    its state (a value None forgets the key; on disk, a key group at a time, added up),
    and a compaction adds it up key group by key group: the same state, and the same TTL write times, as the step held, with keys
    written, removed, changed in place and written again across layers, and checkpoints
    that do not complete (the next snapshot builds on an older one). Each snapshot goes
    through pickle, as it is stored, and so does the state a compaction adds up."""
    with contextlib.ExitStack() as backends:
        def new_step() -> StatefulMapOp:
            op = StatefulMapOp("count", keep_or_append, ttl_ms)
            op.open(task_holding_state_in(backend, backends, context=_Context()))
            return op

        op, stored, completed = new_step(), {}, None
        for checkpoint_id, (writes, completes) in enumerate(rounds, 1):
            op.process([(value, checkpoint_id, key) for key, value in writes])
            op.prepare_checkpoint(checkpoint_id)
            stored[checkpoint_id] = (pickle.loads(pickle.dumps(op.snapshot_since(completed))), completed)
            completed = checkpoint_id if completes else completed
        chain, at = [], len(rounds)
        while isinstance(stored[at][0], KeyedDelta):
            chain.insert(0, stored[at][0])
            at = stored[at][1]
        whole_state = stored[at][0]
        held = {key: (op.states.values.get(key), op.states.written.get(key)) for key in op.states.values}
        added_up = chain_onto(whole_state, chain) if chain else whole_state
        by_layers, by_groups, compacted, shared = new_step(), new_step(), new_step(), new_step()
        by_layers.restore(added_up)
        by_groups.restore({**added_up, "groups": {group: added_up["groups"][group] for group in added_up["groups"]}})
        compacted.restore(pickle.loads(pickle.dumps(added_up)))  # what a compaction stores
        shared.restore(keyed_share([added_up], 0, 1))  # a rescale's share: the chain's layers, restricted
        for restored in (by_layers, by_groups, compacted, shared):
            assert {key: (restored.states.values.get(key), restored.states.written.get(key))
                    for key in restored.states.values} == held
            if backend == "rocksdb":
                restored.states.values.flush()
            assert len(restored.states.values) == len(held)  # counted exactly, loaded at once or written out


def test_the_collector_is_paused_while_any_pause_lasts_and_runs_again_after():
    """Pauses in several threads share one: the collector runs again once the last ends."""
    assert gc.isenabled()
    inside, leave = threading.Event(), threading.Event()

    def other_pause():
        with collector_paused():
            inside.set()
            leave.wait(5)

    other = threading.Thread(target=other_pause)
    other.start()
    inside.wait(5)
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other thread's pause lasts
    leave.set()
    other.join(5)
    assert gc.isenabled()


def test_a_stateful_maps_changes_keep_the_key_groups_they_were_taken_with():
    """Changes taken where the built-in hash is stable (an executor) read back, wherever
    they are read, in the key groups the executor hashed their keys to: the groups go
    with the columns and are never worked out again."""
    keys = ["a", "b", ("t", 1), 7, 3.5, -2]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(partitioners, "stable_hash", partitioners._fixed_seed_hash)
        op = StatefulMapOp("count", keep_or_append, None)
        op.process([(1, 0, key) for key in [*keys, *range(100, 120)]])  # more held than changed next
        op.prepare_checkpoint(1)
        op.snapshot_since(None)
        op.process([(2, 0, key) for key in keys])
        op.prepare_checkpoint(2)
        delta = op.snapshot_since(1)
        taken_with = {key: partitioners.key_group(key) for key in keys}
    stored = pickle.loads(pickle.dumps(delta))  # read where the hash is another
    assert isinstance(stored.written, Columns)
    assert {key: group for group in stored.written for key, *_ in stored.written[group]} == taken_with
    keys_taken, states, written = stored.written.columns()
    assert sorted(map(repr, zip(keys_taken, states))) == sorted(repr((key, 2)) for key in keys) and written is None


@pytest.mark.parametrize("ttl_ms", [None, 1000])
def test_a_stateful_map_holding_numpy_arrays_checkpoints_changes_and_restores_them(ttl_ms):
    """States whose == answers with an array (numpy's) are told from None by identity: a
    change taken, a chain restored and compacted, never asking an array its truth."""
    def add(state, value):
        return (numpy.zeros(2) if state is None else state) + value, None

    with contextlib.ExitStack() as backends:
        def new_step() -> StatefulMapOp:
            op = StatefulMapOp("sums", add, ttl_ms)
            op.open(task_holding_state_in("memory", backends, context=_Context()))
            return op

        op = new_step()
        op.process([(1, 0, key) for key in "abcdefg"])
        op.prepare_checkpoint(1)
        whole_state = pickle.loads(pickle.dumps(op.snapshot_since(None)))
        op.process([(2, 0, "a"), (3, 0, "h")])
        op.prepare_checkpoint(2)
        delta = pickle.loads(pickle.dumps(op.snapshot_since(1)))
        assert isinstance(delta, KeyedDelta)
        for state in (chain_onto(whole_state, [delta]), pickle.loads(pickle.dumps(chain_onto(whole_state, [delta])))):
            restored = new_step()
            restored.restore(state)
            assert {key: list(value) for key, value in restored.states.values.items()} == \
                {**{key: [1.0, 1.0] for key in "bcdefg"}, "a": [3.0, 3.0], "h": [3.0, 3.0]}
