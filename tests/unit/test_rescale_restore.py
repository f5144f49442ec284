"""A rescaled processor's new task restores its share of the old tasks' state itself: it
reads the snapshots of only the old tasks whose key groups overlap its own when all of its
state is held by key group, every old snapshot otherwise, and what it builds from them is
what it would build from all of them."""

from __future__ import annotations

import contextlib
import pickle
import tempfile
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gearbus import CollectSink, Pipeline
from gearbus.api.partitioners import group_owner, key_group, owned_groups
from gearbus.planner import plan
from gearbus.runtime.chain import CombineOp
from gearbus.runtime.keygroups import ChainedGroups, KeyedDelta
from gearbus.runtime.keyed import StatefulMapOp
from gearbus.runtime.savepoints import rescaled_snapshot, restored_from
from gearbus.runtime.snapshots import TaskSnapshot
from gearbus.runtime.state_backend import MemoryBackend, open_backend
from gearbus.runtime.windows import WindowOperator


class _Task:
    context = None
    state_backend = MemoryBackend()


def _plan(parallelism: int, combine: bool = False):
    """A keyed count at ``parallelism``; with ``combine``, whose output is counted again by
    another key (partials combined beside the count, before that shuffle)."""
    p = Pipeline("shares", parallelism=2)
    counted = p.from_collection(["a"], name="read").group_by(str, name="by_word", parallelism=parallelism) \
        .stateful_map(lambda seen, w: (w, w), name="count")
    if combine:
        counted = counted.group_by(len, name="by_length").count(name="lengths")
    counted.sink(CollectSink([]), name="out")
    return plan(p, "test")


def _counting(app):
    return next(p for p in app.graph.processors if "count" in p.config.get("steps", ()))


def _old_envelopes(keys: dict[str, int], old: int, watermarks: list[int]) -> list[TaskSnapshot]:
    """The whole snapshots of ``old`` tasks of the counting step, each holding the keys it owns."""
    envelopes = []
    for index in range(old):
        op = StatefulMapOp("count", lambda s, v: (s, v), None)
        op.open(_Task())
        op.restore({"watermark": watermarks[index], "groups": {}})
        for key, value in keys.items():
            if group_owner(key_group(key), old) == index:
                op.states.put(key, value, 0)
        envelopes.append(TaskSnapshot(7, {"count": op.snapshot()}, False, watermarks[index]))
    return envelopes


def _restored_keys(envelope: TaskSnapshot) -> dict:
    op = StatefulMapOp("count", lambda s, v: (s, v), None)
    op.open(_Task())
    op.restore(TaskSnapshot.decode(envelope.encode()).state["count"])  # as stored, then read back
    return dict(op.states.values)


@settings(max_examples=60, deadline=None)
@given(old=st.integers(1, 9), new=st.integers(1, 9),
       keys=st.dictionaries(st.text(min_size=1, max_size=6), st.integers(), max_size=60),
       marks=st.lists(st.integers(0, 1000), min_size=9, max_size=9))
def test_a_keyed_task_reads_only_the_old_tasks_owning_its_groups_and_gets_exactly_its_keys(old, new, keys, marks):
    counting = _counting(_plan(new))
    envelopes = _old_envelopes(keys, old, marks)
    for index in range(new):
        mine = owned_groups(index, new)
        read = restored_from(counting, old, index)
        assert read == [j for j in range(old) if set(owned_groups(j, old)) & set(mine)]
        assert len(read) <= -(-old // new) + 1
        share = rescaled_snapshot(counting, old, {j: envelopes[j] for j in read}, index)
        assert _restored_keys(share) == {k: v for k, v in keys.items() if key_group(k) in mine}
        assert share.watermark == min(marks[j] for j in read) and share.epoch is None  # nothing builds on it


def test_a_task_combining_partials_before_a_shuffle_or_reading_a_source_reads_every_old_task():
    """Partials of one key of the next shuffle may sit in any old task; a source's positions
    are divided by its class from all of them."""
    counting = _counting(_plan(4, combine=True))
    assert any(isinstance(op, CombineOp) for op in counting.config["ops"])
    assert restored_from(counting, 3, 0) == [0, 1, 2]
    source = next(p for p in _plan(4).graph.processors if p.is_source)
    assert restored_from(source, 3, 0) == [0, 1, 2]
    assert restored_from(_counting(_plan(4)), 8, 1) == [2, 3]


@pytest.mark.parametrize("old, new", [(2, 4), (4, 2), (3, 5), (5, 3), (1, 7)])
def test_counts_of_late_records_go_on_whole_in_the_tasks_that_inherit_them(old, new):
    """What belongs to no key goes to the new task owning the old task's first key group,
    which reads that old task anyway."""
    states = [{"watermark": 0, "groups": {}, "late": [], "late_dropped": 10 ** index, "late_side_output": index}
              for index in range(old)]
    total = 0
    for index in range(new):
        mine = owned_groups(index, new)
        read = [state if set(owned_groups(j, old)) & set(mine) else None for j, state in enumerate(states)]
        total += WindowOperator.rescale(read, index, new)["late_dropped"]
    assert total == sum(10 ** index for index in range(old))


@settings(max_examples=40, deadline=None)
@given(old=st.integers(1, 5), new=st.integers(1, 5),
       keys=st.dictionaries(st.text(min_size=1, max_size=4), st.integers(), max_size=40),
       changes=st.lists(st.tuples(st.text(min_size=1, max_size=4), st.one_of(st.none(), st.integers())), max_size=30),
       backend=st.sampled_from(["memory", "rocksdb"]))
def test_the_first_whole_snapshot_after_a_rescale_is_the_share_with_the_changes_since(old, new, keys, changes,
                                                                                      backend):
    """It holds what the step holds, as a pass over every key would (keys written, written
    again and forgotten since the restore), and the snapshot after it builds on it."""
    counting, envelopes = _counting(_plan(new)), _old_envelopes(keys, old, [0] * old)
    with contextlib.ExitStack() as closing:
        for index in range(new):
            mine = owned_groups(index, new)
            share = rescaled_snapshot(counting, old, {j: envelopes[j] for j in restored_from(counting, old, index)},
                                      index)
            task = SimpleNamespace(context=None, state_backend=open_backend(backend, tempfile.mkdtemp(), "t"))
            closing.callback(task.state_backend.close)
            op = StatefulMapOp("count", lambda state, value: (value, None), None)
            op.open(task)
            op.restore(share.state["count"])
            op.process([(value, 1, key) for key, value in changes if key_group(key) in mine])  # None forgets it
            op.prepare_checkpoint(9)
            taken = op.snapshot_since(None)
            if len(changes) < len(op.states.values):  # else a pass over the keys is no dearer: taken so
                assert isinstance(taken["groups"], ChainedGroups)
            stored = pickle.loads(pickle.dumps(taken))
            held = {**{k: v for k, v in keys.items() if key_group(k) in mine},
                    **{k: v for k, v in changes if key_group(k) in mine}}
            assert {entry[0]: entry[1] for group in stored["groups"] for entry in stored["groups"][group]} == \
                {k: v for k, v in held.items() if v is not None} == dict(op.states.values.items())
            op.process([(7, 2, key) for key in list(held)[:1]])
            op.prepare_checkpoint(10)
            later = op.snapshot_since(9)  # (whole when it holds no more keys than changed)
            assert op._share.state is None and (isinstance(later, KeyedDelta) or len(op.states.values) <= 1)


def test_a_share_whose_changes_the_step_forgot_is_let_go():
    """No checkpoint completing (or none taken), the keys changed since the restore
    outgrow what the step remembers: no snapshot can be built from the share any more, and
    its bytes go."""
    counting, envelopes = _counting(_plan(1)), _old_envelopes({f"k{n}": n for n in range(50)}, 1, [0])
    op = StatefulMapOp("count", lambda state, value: (value, None), None)
    op.open(_Task())
    op.restore(rescaled_snapshot(counting, 1, {0: envelopes[0]}, 0).state["count"])
    assert op._share.state is not None
    op.process([(n, 1, f"new{n}") for n in range(3000)] + [(None, 1, f"new{n}") for n in range(3000)])
    op.on_watermark(1)
    assert op._share.state is None and len(op.states.values) == 50
