"""Local copies of state on disk (gearbus/runtime/local_copies.py): a task on the rocksdb
backend keeps one at each checkpoint's snapshot, and a task restoring that checkpoint on
the same host takes its key groups from the copies instead of the store: the old owner's
database cloned, the groups it does not own removed, the others copied raw. What it takes
must be exactly the checkpoint's state of its groups, whatever the parallelisms, and
anything it cannot take must leave it as if no copy had been offered."""

from __future__ import annotations

import collections
import json
import os
import pickle
import shutil
import socket

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gearbus.api.partitioners import MAX_PARALLELISM, key_group, owned_groups
from gearbus.runtime import local_copies
from gearbus.runtime.snapshots import TaskSnapshot
from gearbus.runtime.state_backend import MAX_PARTS, RocksDBBackend, open_backend

KEYS = st.one_of(st.text(max_size=6), st.integers(-10**6, 10**6), st.tuples(st.text(max_size=3), st.integers(0, 9)))


def old_tasks(root, state: dict, parallelism: int, checkpoint_id: int = 7, after: dict | None = None) -> list[str]:
    """Each of ``parallelism`` old tasks holding its groups of ``state`` keeps a copy at
    ``checkpoint_id``, then writes ``after`` (what the copy must not hold) and stops."""
    locators = []
    for index in range(parallelism):
        owned = owned_groups(index, parallelism)
        backend = RocksDBBackend(str(root), f"p1-t{index}-e1", owned=owned)
        table = backend.table("count", copied=True)
        for key, value in state.items():
            if key_group(key) in owned:
                table[key] = value
        locators += backend.keep_copy(checkpoint_id)
        for key, value in (after or {}).items():
            if key_group(key) in owned:
                table[key] = value
        table.flush()
        backend.close()
    return locators


def restored(root, locators, parallelism: int, index: int, epoch: int = 2):
    backend = RocksDBBackend(str(root), f"p1-t{index}-e{epoch}", owned=owned_groups(index, parallelism))
    table = backend.table("count", copied=True)
    backend.offer(tuple(locators))
    return backend, table, table.adopt()


def check_restored(table, adopted, state: dict, owned: range) -> None:
    assert adopted == frozenset(owned)
    expected = {key: value for key, value in state.items() if key_group(key) in owned}
    assert dict(table.items()) == expected
    assert len(table) == len(expected)  # counted from the manifests, no pass over the keys
    assert table.group_counts == [sum(key_group(k) == g for k in expected) for g in range(MAX_PARALLELISM)]
    assert len(table.parts) <= MAX_PARTS


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(state=st.dictionaries(KEYS, st.integers(), max_size=300), parallelisms=st.lists(st.integers(1, 6), min_size=2,
                                                                                        max_size=3),
       changes=st.lists(st.dictionaries(KEYS, st.one_of(st.integers(), st.none()), max_size=40), min_size=3,
                        max_size=3))
def test_rescaled_again_and_again_a_task_takes_exactly_its_groups_of_the_checkpoint_from_the_copies(
        tmp_path_factory, state, parallelisms, changes):
    """Each rescale's new tasks take their groups from the last tasks' copies (clones of up
    to MAX_PARTS of their databases, the rest copied in), write on (their keys then go to
    their group's database), keep copies of their own, and the next ones take from those."""
    root = tmp_path_factory.mktemp("copies")
    state = dict(state)
    locators = old_tasks(root, state, parallelisms[0], after={key: "later" for key in changes[0]})
    for step, parallelism in enumerate(parallelisms[1:], start=1):
        checkpoint_id, written = 7 + step, changes[step % len(changes)]
        kept = []
        for index in range(parallelism):
            owned = owned_groups(index, parallelism)
            backend, table, adopted = restored(root, locators, parallelism, index, epoch=1 + step)
            try:
                check_restored(table, adopted, state, owned)
                for key, value in written.items():
                    if key_group(key) in owned:
                        table.pop(key, None) if value is None else table.__setitem__(key, value)
                table.flush()  # into the databases holding their groups, counted
                assert len(table) == len(dict(table.items()))
                kept += backend.keep_copy(checkpoint_id)
            finally:
                backend.close()
        for key, value in written.items():
            state.pop(key, None) if value is None else state.__setitem__(key, value)
        locators = kept
    backend, table, adopted = restored(root, locators, 1, 0, epoch=9)
    check_restored(table, adopted, state, range(MAX_PARALLELISM))
    backend.close()


def test_from_more_copies_than_a_table_keeps_databases_the_rest_is_copied_in(tmp_path):
    state = {f"k{i}": i for i in range(3000)}
    locators = old_tasks(tmp_path, state, MAX_PARTS + 3)
    backend, table, adopted = restored(tmp_path, locators, 1, 0)
    check_restored(table, adopted, state, range(MAX_PARALLELISM))
    assert len(table.parts) == MAX_PARTS
    table.prefetch(list(state))  # a multi-get over the databases
    assert all(table.get(key) == value for key, value in state.items())
    backend.close()


def test_a_copy_on_another_host_or_unfinished_or_pruned_is_not_taken(tmp_path):
    state = {f"k{i}": i for i in range(500)}
    locators = old_tasks(tmp_path, state, 2)
    elsewhere = [f"not-{socket.gethostname()}:{locators[0].partition(':')[2]}", locators[1]]
    os.remove(os.path.join(local_copies.path_of(locators[1]), local_copies.MANIFEST))  # as if cut off mid-copy
    backend, table, adopted = restored(tmp_path, elsewhere, 1, 0)
    assert adopted == frozenset() and len(table) == 0 and dict(table.items()) == {}
    backend.close()
    local_copies.prune(str(tmp_path), 8)
    assert os.listdir(tmp_path / local_copies.COPIES_DIR) == []
    backend, table, adopted = restored(tmp_path, locators, 1, 0)
    assert adopted == frozenset() and len(table) == 0
    backend.close()


def test_a_copy_that_cannot_be_taken_leaves_the_table_empty_to_load_from_the_store(tmp_path):
    state = {f"k{i}": i for i in range(2000)}
    locators = old_tasks(tmp_path, state, 2)
    damaged = os.path.join(local_copies.path_of(locators[1]), "step0.0")
    for name in os.listdir(damaged):
        if name.endswith(".sst"):
            with open(os.path.join(damaged, name), "wb") as file:
                file.write(b"not a table")
    backend, table, adopted = restored(tmp_path, locators, 1, 0)
    assert adopted == frozenset() and len(table) == 0 and dict(table.items()) == {}
    table.update({"a": 1})
    table.flush()
    assert dict(table.items()) == {"a": 1} and len(table) == 1
    backend.close()


def test_a_task_keeps_its_newest_copies_and_completion_prunes_the_older_ones(tmp_path):
    backend = RocksDBBackend(str(tmp_path), "p1-t0-e1", owned=range(0, MAX_PARALLELISM))
    table = backend.table("count", copied=True)
    kept = []
    for checkpoint_id in range(1, 6):
        table[f"k{checkpoint_id}"] = checkpoint_id
        kept += backend.keep_copy(checkpoint_id)
    present = sorted(os.listdir(tmp_path / local_copies.COPIES_DIR))
    assert [name.split("-")[0] for name in present] == [f"c{n}" for n in range(6 - local_copies.COPIES_KEPT, 6)]
    backend.completed(5)
    assert [name.split("-")[0] for name in os.listdir(tmp_path / local_copies.COPIES_DIR)] == ["c5"]
    manifest = json.loads(open(os.path.join(local_copies.path_of(kept[-1]), local_copies.MANIFEST)).read())
    assert sum(manifest["tables"]["count"][2]) == 5 and manifest["owned"] == [0, MAX_PARALLELISM]
    backend.close()
    assert os.listdir(tmp_path / local_copies.COPIES_DIR)  # a copy outlives its task: the next epoch's take it


def test_no_copy_without_a_directory_that_is_cleaned_up_or_of_tables_not_asked_or_in_memory(tmp_path):
    backend = RocksDBBackend(None, "t", owned=range(0, 4))
    backend.table("count", copied=True)["a"] = 1
    assert backend.keep_copy(1) == ()
    backend.close()
    backend = RocksDBBackend(str(tmp_path), "t", owned=range(0, 4))
    backend.table("join (left)")["a"] = 1  # a step whose restore reads each entry anyway
    assert backend.keep_copy(1) == ()
    backend.close()
    memory = open_backend("memory", str(tmp_path), "t")
    assert memory.keep_copy(1) == ()


def test_the_envelope_carries_its_copies_and_older_envelopes_read_without(tmp_path):
    envelope = TaskSnapshot(3, {"count": None}, False, 5, 1, copies=("host:/a",))
    assert TaskSnapshot.decode(envelope.encode()) == envelope
    older = pickle.dumps((5, 3, None, False, 5, 1, None, 0, 0, None), pickle.HIGHEST_PROTOCOL)
    assert TaskSnapshot.decode(older).copies == ()


def test_a_clone_links_the_tables_files_and_copies_the_rest(tmp_path):
    locators = old_tasks(tmp_path, {f"k{i}": i for i in range(3000)}, 1)
    source = os.path.join(local_copies.path_of(locators[0]), "step0.0")
    local_copies.clone(source, str(tmp_path / "clone"))
    linked = collections.Counter(os.stat(tmp_path / "clone" / name).st_nlink > 1 for name in os.listdir(source)
                                 if name.endswith(".sst"))
    assert linked[True] >= 1 and not linked[False]
    shutil.rmtree(tmp_path / "clone")
