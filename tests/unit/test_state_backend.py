"""The state backends: a table behaves as a dict whatever is written back when, its files
go away with the task, and a backend that cannot write says so as an OSError (the app
rolls back) while a value it cannot serialise names the step, the key and the type."""

from __future__ import annotations

import os
import subprocess
import threading
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gearbus.api.partitioners import key_group
from gearbus.runtime import state_backend
from gearbus.runtime.appmaster_state import Settings
from gearbus.runtime.keygroups import UnserialisableState
from gearbus.api.aggregators import Count
from gearbus.api.windows import TumblingWindows
from gearbus.runtime.chain import WindowAggregateOp
from gearbus.runtime.joins import IntervalJoinOp, TableJoinOp
from gearbus.runtime.keyed import StatefulMapOp
from gearbus.runtime.windows import WindowOperator
from gearbus.control.config import BACKEND_ENV, AppConfig
from gearbus.runtime.state_backend import (RocksDBBackend, StateBackendError, decode_key,
                                           encode_key, open_backend)

pytestmark = pytest.mark.unit

KEYS = st.one_of(st.sampled_from(["a", "b", "", "é", 0, -1, 2**70, b"\x00", ("t", 1), ("t", "t"), 3.5, None,
                                  "x" * 700, ("y" * 300, "y" * 300)]),
                 st.text(max_size=4), st.integers(-5, 5))
VALUES = st.one_of(st.integers(), st.text(max_size=3), st.builds(list, st.lists(st.integers(), max_size=3)))
OPS = st.lists(st.one_of(
    st.tuples(st.just("set"), KEYS, VALUES),
    st.tuples(st.just("get"), KEYS),
    st.tuples(st.just("pop"), KEYS),
    st.tuples(st.just("del"), KEYS),
    st.tuples(st.just("append"), KEYS),  # a list state changed in place, never assigned back
    st.tuples(st.just("prefetch"), st.lists(KEYS, max_size=4)),  # a batch's keys read in one go
    st.tuples(st.just("settle")),
    st.tuples(st.just("flush")),
    st.tuples(st.just("items")),
    st.tuples(st.just("clear")),
), max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops=OPS, flush_entries=st.sampled_from([0, 2, 1000]))
def test_a_rocksdb_table_holds_what_a_dict_holds(tmp_path_factory, ops, flush_entries):
    backend = RocksDBBackend(str(tmp_path_factory.mktemp("state")), "t", flush_entries)
    try:
        table, truth = backend.table("step"), {}
        for op, *args in ops:
            if op == "set":
                table[args[0]] = truth[args[0]] = args[1]
            elif op == "get":
                assert table.get(args[0], "none") == truth.get(args[0], "none")
                assert (args[0] in table) == (args[0] in truth)
            elif op == "pop":
                assert table.pop(args[0], "none") == truth.pop(args[0], "none")
            elif op == "del":
                if args[0] in truth:
                    del table[args[0]], truth[args[0]]
                else:
                    with pytest.raises(KeyError):
                        del table[args[0]]
            elif op == "append":
                state = table.get(args[0])
                if isinstance(state, list):
                    state.append(9)
                    truth[args[0]].append(9)
            elif op == "prefetch":
                table.prefetch(args[0])
            elif op == "settle":
                table.settle()
            elif op == "flush":
                table.flush()
                assert len(table) == len(truth)
            elif op == "items":
                assert dict(table.items()) == truth
                assert len(list(table.items())) == len(truth)
            else:
                table.clear()
                truth.clear()
            assert len(table) >= len(truth)
        assert dict(table.items()) == truth
        table.flush()
        assert dict(table.items()) == truth and len(table) == len(truth)
        assert sorted(map(repr, table)) == sorted(map(repr, truth))
    finally:
        backend.close()


def test_a_batch_read_in_one_go_then_written_keeps_the_count_exact(tmp_path):
    backend = RocksDBBackend(str(tmp_path), "t", 0)
    try:
        table = backend.table("step")
        table["stored"] = 1
        table.flush()
        table.prefetch(["stored", "new", "stored"])
        assert table.get("stored") == 1 and "new" not in table
        table["stored"], table["new"] = 2, 1
        table.flush()
        assert len(table) == 2 and dict(table.items()) == {"stored": 2, "new": 1}
        table.prefetch(["stored", "absent"])
        del table["stored"]
        table.flush()
        assert len(table) == 1 and dict(table.items()) == {"new": 1}
    finally:
        backend.close()


def test_entries_are_stored_by_key_group_and_equal_keys_encode_alike():
    same = "ab" * 3
    built = "".join(["ab"] * 3)
    assert encode_key((same, same)) == encode_key((same, built))
    for key in ["a", "", 17, -3, 2**70, ("t", 1), b"x", None, 3.5, "z" * 900]:
        assert int.from_bytes(encode_key(key)[:2], "big") == key_group(key)
        assert decode_key(encode_key(key)) == key


def test_a_tasks_files_are_removed_when_it_closes(tmp_path):
    backend = open_backend("rocksdb", str(tmp_path / "state"), "p1-t0-e0")
    table = backend.table("count")
    table["k"] = 1
    table.flush()
    directory = backend.directory
    assert os.listdir(directory)
    backend.close()
    assert not os.path.exists(directory) and os.listdir(tmp_path / "state") == []


def test_a_full_disk_is_an_os_error_naming_the_backend_and_the_step(tmp_path, monkeypatch):
    """On a 1 MiB file system: once RocksDB cannot write its memtable out (in the
    background), the next write-out fails the task as an OSError (the app rolls back),
    naming the backend, its directory and the step."""
    disk = tmp_path / "small"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("mounting a small file system needs root")
    monkeypatch.setattr(state_backend, "WRITE_BUFFER_BYTES", 256 * 1024)  # memtables fill sooner
    backend = open_backend("rocksdb", str(disk), "t")
    try:
        table = backend.table("count")
        with pytest.raises(StateBackendError, match=r"rocksdb state backend at .*small.* failed writing the state "
                                                    r"of step 'count'.*No space left on device") as failed:
            for round in range(1000):
                for i in range(2000):
                    table[f"key{round}-{i}"] = os.urandom(100)
                table.flush()
        assert isinstance(failed.value, OSError)
    finally:
        backend.close()
        subprocess.run(["umount", str(disk)], check=True)


def test_a_directory_it_cannot_make_is_an_os_error(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    backend = open_backend("rocksdb", str(tmp_path / "file" / "state"), "t")
    with pytest.raises(StateBackendError, match="rocksdb state backend cannot open its files under .*file/state"):
        backend.table("count")


def test_a_value_it_cannot_serialise_names_the_step_the_key_and_the_type(tmp_path):
    backend = open_backend("rocksdb", str(tmp_path), "t")
    try:
        table = backend.table("count")
        table["good"] = 1
        table[("user", 7)] = lambda: None
        with pytest.raises(UnserialisableState, match=r"step 'count' holds a function for key \('user', 7\)"):
            table.flush()
    finally:
        backend.close()


def test_the_backend_is_the_apps_else_the_clusters_default_and_unknown_names_are_refused(monkeypatch):
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    def backend(config: dict) -> str:
        return AppConfig.parse(config).resolved().state_backend

    assert backend({}) == "memory"
    assert backend({"state_backend": "rocksdb"}) == "rocksdb"
    monkeypatch.setenv(BACKEND_ENV, "rocksdb")
    assert backend({}) == "rocksdb" and backend({"state_backend": "memory"}) == "memory"
    with pytest.raises(ValueError, match="application config state_backend must be one of memory, rocksdb, got 'lmdb'"):
        backend({"state_backend": "lmdb"})
    monkeypatch.setenv(BACKEND_ENV, "disk")
    with pytest.raises(ValueError, match=f"{BACKEND_ENV} must be one of memory, rocksdb, got 'disk'"):
        backend({})


def test_its_size_is_measured_without_writing_out_what_waits(tmp_path):
    """A metric must not fail the task: a value that cannot be serialised waits unwritten."""
    backend = open_backend("rocksdb", str(tmp_path), "t")
    try:
        table = backend.table("count")
        for i in range(100):
            table[i] = "v" * 50
        table.flush()
        keys, stored = table.size()
        assert keys == 100 and stored >= 100 * 50
        table["lock"] = threading.Lock()
        keys, size = table.size()
        assert keys == 101 and size > stored
    finally:
        backend.close()
    assert table.size() == (0, 0)  # the metrics may still ask once the task stopped


def stateful_ops() -> list:
    """One op of each kind that holds state through the backend, and a record for it."""
    window = WindowAggregateOp("w", lambda: WindowOperator(TumblingWindows(10), Count()), False)
    return [(StatefulMapOp("count", lambda state, value: ((state or 0) + 1, None), None), ("v", 1, "k")),
            (window, ("v", 1, "k")),
            (IntervalJoinOp("ij", -10, 10), ((0, "l"), 1, "k")),
            (TableJoinOp("tj", "event_time", None, "inner", None), ((1, "v"), 1, "k"))]


@pytest.mark.parametrize("op, record", stateful_ops(), ids=lambda value: type(value).__name__)
def test_every_stateful_step_measures_its_state_on_disk_and_after_its_backend_closed(op, record, tmp_path):
    """The executor's metrics ask for a task's state size even after it stopped: once the
    task closed its backend, the answer is nothing held on disk, not an error."""
    backend = open_backend("rocksdb", str(tmp_path), "t")
    op.open(SimpleNamespace(state_backend=backend, context=None))
    op.process([record])
    keys, size = op.state_size()
    assert keys == 1 and size > 0
    backend.close()
    assert op.state_size()[1] == 0


def test_keys_a_dict_holds_as_one_are_one_here(tmp_path, monkeypatch):
    """Key groups as executors compute them (a fixed hash seed: equal keys hash alike; a
    process with a random seed hashes their repr, and routes them apart too)."""
    monkeypatch.setattr(state_backend, "stable_hash", hash)
    backend = open_backend("rocksdb", str(tmp_path), "t")
    try:
        table = backend.table("count")
        table[1] = "one"
        table.flush()
        assert table.get(1.0) == table.get(True) == "one"
        table[True] = "true"
        table[0.0] = "zero"
        table.flush()
        assert len(table) == 2 and table.get(1) == "true" and table.get(-0.0) == table.get(False) == "zero"
        table[("t", 1)] = "tuple"
        table[frozenset([1, 9])] = "set"
        table.flush()
        assert table.get(("t", 1.0)) == table.get(("t", True)) == "tuple"
        assert table.get(frozenset([9, 1])) == "set"
        # a key comes back as written, not as the int it equals
        assert {repr(key) for key in table} == {"True", "0.0", "('t', 1)", "frozenset({1, 9})"}
    finally:
        backend.close()


def test_a_failing_store_fails_the_step_as_an_os_error_not_as_user_code(tmp_path):
    """What user code raises fails the app; what the store raises rolls it back, even
    when it is raised while the user's function reads its state."""
    op = StatefulMapOp("count", lambda state, value: ((state or 0) + value, None), None)

    class Task:
        state_backend = open_backend("rocksdb", str(tmp_path), "t")

    op.open(Task())
    op.process([(1, 0, "k")])
    Task.state_backend.close()
    with pytest.raises(StateBackendError, match="failed reading the state of step 'count'"):
        op.process([(1, 0, "other")])


def test_a_whole_snapshot_does_not_keep_what_it_read(tmp_path):
    op = StatefulMapOp("collect", lambda state, value: ((state or []) + [value], None), None)

    class Task:
        state_backend = open_backend("rocksdb", str(tmp_path), "t")

    try:
        op.open(Task())
        op.process([(n, 0, f"k{n}") for n in range(100)])
        op.states.values.flush()
        whole = op.snapshot()
        assert sum(map(len, whole["groups"].values())) == 100
        assert op.states.values._pending == {}
    finally:
        Task.state_backend.close()


def test_the_appmaster_decides_the_backend_for_all_its_executors(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV, "rocksdb")
    assert Settings.of(AppConfig.parse({})).state_backend == "rocksdb"
    assert Settings.of(AppConfig.parse({"state_backend": "memory"})).state_backend == "memory"
    with pytest.raises(ValueError, match="state_backend must be one of memory, rocksdb, got ''"):
        Settings.of(AppConfig.parse({"state_backend": ""}))
