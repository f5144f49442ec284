"""The stored formats: a task's snapshot envelope and a savepoint's record."""

import pickle
import threading

import numpy
import pytest

from gearbus import CollectSink, DataSink, Pipeline
from gearbus.api.graph import Processor
from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from gearbus.planner import plan
from gearbus.runtime.keygroups import (Groups, KeyedDelta, Stopped, StoredGroups, WindowDelta, chain_onto,
                                       entries_from, fields_of)
from gearbus.runtime.savepoints import SavepointRecord, savepoint_parts, stateful_steps, task_states
from gearbus.runtime.snapshots import TaskSnapshot


def test_a_task_snapshot_survives_encoding():
    snapshot = TaskSnapshot(7, {"counts": {"a": 3}, "offset": (1, 2)}, True, WATERMARK_MAX)
    assert TaskSnapshot.decode(snapshot.encode()) == snapshot


def test_state_by_key_group_is_pickled_and_read_back_a_group_at_a_time():
    """One pickle call over a whole state holds the interpreter lock throughout (seconds,
    for millions of keys: heartbeats stop): a snapshot's entries by key group are pickled
    one group per call, and read back one group at a time, when read."""
    groups = Groups({group: [(f"k{group}-{n}", n, None) for n in range(3)] for group in range(5)})
    _, (parts,) = groups.__reduce__()
    assert [group for group, _ in parts] == list(range(5))
    assert all(entries_from(data) == groups[group] for group, data in parts)
    assert all(pickle.loads(data) == fields_of(groups[group]) for group, data in parts)  # as columns
    delta = KeyedDelta(7, {1: [("a", 1, None)]}, {2: ["b"]})
    assert type(delta.written) is Groups and type(delta.removed) is Groups  # built from plain dicts
    envelope = TaskSnapshot(3, {"count": delta, "other": {"watermark": 1, "groups": groups}}, False, 1)
    decoded = TaskSnapshot.decode(envelope.encode())
    assert decoded == envelope
    stored = decoded.state["other"]["groups"]
    assert type(stored) is StoredGroups and stored[4] == groups[4] and stored[4] is not stored[4]  # not kept


def test_a_chain_adds_up_group_by_group_and_stores_the_groups_it_did_not_change_as_they_were():
    whole = pickle.loads(pickle.dumps({"watermark": 0, "groups": Groups({1: [("a", 1, None)], 2: [("b", 2, None)]})}))
    deltas = [KeyedDelta(5, {2: [("c", 3, None)], 3: [("d", 4, None)]}, {}), KeyedDelta(6, {}, {3: ["d"]})]
    added = chain_onto(whole, deltas)
    assert added == {"watermark": 6, "groups": {1: [("a", 1, None)], 2: [("b", 2, None), ("c", 3, None)]}}
    assert sorted(added["groups"]) == [1, 2, 3] and added["groups"][3] == []  # emptied: holds nothing
    _, (parts,) = added["groups"].__reduce__()
    assert dict(parts)[1] is whole["groups"].pickled(1) and 3 not in dict(parts)


@pytest.mark.parametrize("kind", ["keyed", "windows"])
def test_adding_up_a_chain_stops_at_the_next_key_group_once_told_to(kind):
    """A compaction runs on a thread that a cancel does not stop: given up (a restore is
    waiting), it must not go on taking the cores the restore needs."""
    stop = threading.Event()
    if kind == "keyed":
        whole = {"watermark": 0, "groups": Groups({group: [(f"k{group}", 1, None)] for group in range(4)})}
        deltas = [KeyedDelta(1, {group: [(f"k{group}", 2, None)] for group in range(4)}, {})]
    else:
        rest = {"operator": {"groups": {}}, "other": 1}
        whole = {**rest, "operator": {"groups": Groups({group: [(0, 10, f"k{group}", 1, 1)] for group in range(4)})}}
        deltas = [WindowDelta({group: [(0, 10, f"k{group}", 2, 2)] for group in range(4)}, {}, rest)]
    added = chain_onto(whole, deltas, stop)
    groups = added["groups"] if kind == "keyed" else added["operator"]["groups"]
    assert entries_from(groups.pickled(0)) == groups[0] == deltas[0].written[0]  # before the stop: as ever
    stop.set()
    with pytest.raises(Stopped):
        groups.pickled(1)
    with pytest.raises(Stopped):
        pickle.dumps(added)
    again = pickle.loads(pickle.dumps(chain_onto(whole, deltas)))  # without a stop: every group
    assert len(again["groups"] if kind == "keyed" else again["operator"]["groups"]) == 4


class EqualToAnything:
    """A user's state whose == says True to anything, None included."""

    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


def test_a_keyed_chain_adds_up_whatever_its_states_say_to_none():
    """A keyed chain adds up a column at a time and leaves out a column of Nones: a None
    is told by identity, never by the state's ==, which is the user's (a numpy array's
    answers with an array; another's may say True)."""
    array = numpy.array([1, 2])
    timers_only = ("t", None, None, [5], [])  # a process_keyed key with timers and no state
    whole = {"watermark": 0, "groups": Groups({1: [timers_only, ("a", array, None, [], [])]})}
    deltas = [KeyedDelta(1, {1: [("b", EqualToAnything(), None, [], [])]}, {}), KeyedDelta(2, {}, {1: ["x"]})]
    for added in (chain_onto(whole, deltas), pickle.loads(pickle.dumps(chain_onto(whole, deltas)))):
        (t, a, b), = [added["groups"][1]]
        assert t == timers_only and a[0] == "a" and list(a[1]) == [1, 2] and type(b[1]) is EqualToAnything


def test_an_envelope_of_format_2_with_groups_as_dicts_still_decodes():
    state = {"watermark": 4, "groups": {3: [("a", 1, None)]}}
    old = pickle.dumps((2, 9, state, False, 4, 1, (8, 1), 2, 7))
    assert TaskSnapshot.decode(old) == TaskSnapshot(9, state, False, 4, 1, (8, 1), 2, 7)


def test_a_seeded_snapshot_starts_fresh_with_the_state():
    assert TaskSnapshot.seeded(1, {"x": 1}) == TaskSnapshot(1, {"x": 1}, False, WATERMARK_MIN)


def test_an_envelope_of_another_format_is_refused_clearly():
    old = pickle.dumps({"task": 3, "ended": False, "watermark": 0, "checkpoint_id": 2})
    with pytest.raises(ValueError, match="not a task snapshot of format"):
        TaskSnapshot.decode(old)


def test_a_savepoint_record_survives_plain_data():
    record = SavepointRecord("half", 3, "wordcount", 12, 1_700_000_000_000, {"count": 2, "read": 1})
    assert SavepointRecord.from_dict(record.to_dict()) == record


def test_a_savepoint_saved_with_keys_routed_by_hash_modulo_moves_them_to_their_key_groups_owners():
    """Before key-group ranges a key went to task ``hash % n``: such a savepoint (its record
    has no layout) hands each key to the task that now owns its group, even at the same
    parallelism; other state stays with its task index."""
    data = SavepointRecord("old", 1, "a", 5, 0, {"running": 2}).to_dict()
    del data["layout"]
    assert SavepointRecord.from_dict(data).layout == 1
    pipeline = Pipeline("p", parallelism=2)
    (pipeline.from_collection([], name="read", parallelism=1).group_by(lambda n: n, name="by")
        .stateful_map(lambda s, n: (n, n), name="running").sink(CollectSink([]), name="write"))
    [processor] = [p for p in plan(pipeline, "test").graph.processors if "running" in stateful_steps(p)]
    keys = [3, 64, 65, 127]  # ints hash to themselves here: key group = key % 128
    by_modulo = [{"watermark": 0, "groups": {k % 128: [(k, f"v{k}", None)] for k in keys if k % 2 == index}}
                 for index in range(2)]
    moved = task_states(processor, {"running": by_modulo}, layout=1)
    held = [sorted(k for entries in state["running"]["groups"].values() for k, *_ in entries) for state in moved]
    assert held == [[3], [64, 65, 127]]  # groups 0..63 to task 0, 64..127 to task 1
    assert task_states(processor, {"running": by_modulo}) == [{"running": state} for state in by_modulo]


class Discard(DataSink):
    def write(self, records):
        pass


def test_a_savepoint_keeps_a_sink_that_holds_nothing_so_a_pipeline_restored_from_it_claims_it():
    """A sink without transactions snapshots None; the savepoint still names its step."""
    sink = Processor.sink(Discard(), name="discard")
    parts = savepoint_parts(sink, [TaskSnapshot.seeded(3, None)])
    assert {step: pickle.loads(data) for step, data in parts.items()} == {"discard": None}
