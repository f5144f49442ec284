"""Exactly-once file connectors: the sources resume from a snapshot with exactly the
rest of their split; JsonLinesSink commits in two phases, so after any crash and
restore its file holds each line once, in order, and a replaced attempt cannot write."""

from __future__ import annotations

import itertools
import json
import logging
import os
import pickle
import tempfile
import threading
from types import SimpleNamespace
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gearbus.api.task import Record, TaskContext
from gearbus.connectors import files
from gearbus.connectors.files import (
    CollectionSource,
    JsonLinesSink,
    JsonLinesSource,
    StaleAttemptError,
    TextFileSource,
)
from gearbus.connectors.generator import RateSource

FAST = settings(max_examples=100, deadline=None)


def context(parallelism=1, index=0, epoch=0, app_id=1, start_ms=1000):
    processor = SimpleNamespace(id=0, name="p", parallelism=parallelism, config={})
    return TaskContext(app_id, "t", processor, index, 0, app_start_ms=start_ms, epoch=epoch)


def roundtrip(state):
    return pickle.loads(pickle.dumps(state))


# --- sources -------------------------------------------------------------------------


def opened(source_class, path, parallelism, index):
    source = source_class(path)
    source.open(context(parallelism, index))
    return source


def read_rest(source, batch_size=1000):
    values = []
    while (batch := source.read(batch_size)) is not None:
        values += [r.value for r in batch]
    return values


def check_every_cut(source_class, path, parallelism, batch_sizes):
    """Read each task's split batch by batch, snapshotting before every batch; a task
    restored from any of the snapshots reads exactly what followed it. Returns every
    value read."""
    everything = []
    for index in range(parallelism):
        source = opened(source_class, path, parallelism, index)
        values, cuts = [], []
        for i in itertools.count():
            cuts.append((len(values), roundtrip(source.snapshot())))
            batch = source.read(batch_sizes[i % len(batch_sizes)])
            if batch is None:
                break
            values += [r.value for r in batch]
        source.close()
        for position, state in cuts:
            restored = opened(source_class, path, parallelism, index)
            restored.restore(state)
            assert read_rest(restored, 3) == values[position:]
            restored.close()
        everything += values
    return everything


TEXT = "alpha\n\nnaïve 日本語\n" + "x" * 40 + "\n😀 😀\nlast line without newline"
JSONL = '{"a": 1}\n\n  \n"ünï"\n\u00a0\n[1, 2, 3]\n\u2028\n' + '"' + "y" * 40 + '"\n' + "null\n42"


@pytest.mark.parametrize("parallelism", [1, 2, 3, 4])
@pytest.mark.parametrize("chunk", [3, 16, 1 << 20])
@pytest.mark.parametrize("batch_sizes", [[1], [2, 1, 5], [1000]])
@pytest.mark.parametrize("source_class", [TextFileSource, JsonLinesSource])
def test_snapshot_before_every_batch_resumes_with_exactly_the_rest(
    tmp_path, monkeypatch, source_class, parallelism, chunk, batch_sizes
):
    monkeypatch.setattr(files, "READ_CHUNK_BYTES", chunk)
    path = tmp_path / "in.txt"
    content = TEXT if source_class is TextFileSource else JSONL
    path.write_text(content, encoding="utf-8")
    values = check_every_cut(source_class, str(path), parallelism, batch_sizes)
    if source_class is TextFileSource:
        assert sorted(values) == sorted(content.split("\n"))
    else:
        expected = [json.loads(line) for line in content.split("\n") if line.strip()]
        assert sorted(map(repr, values)) == sorted(map(repr, expected))


lines = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=12)


@FAST
@given(
    st.lists(lines, max_size=30),
    st.booleans(),
    st.integers(1, 4),
    st.integers(1, 40),
    st.lists(st.integers(1, 7), min_size=1, max_size=5),
)
def test_text_snapshot_at_random_points(text_lines, trailing_newline, parallelism, chunk, batch_sizes):
    content = "\n".join(text_lines) + ("\n" if trailing_newline and text_lines else "")
    with tempfile.TemporaryDirectory() as directory, patch.object(files, "READ_CHUNK_BYTES", chunk):
        path = os.path.join(directory, "in.txt")
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(content)
        values = check_every_cut(TextFileSource, path, parallelism, batch_sizes)
    expected = content.split("\n")
    if content.endswith("\n") or not content:
        expected.pop()
    assert sorted(values) == sorted(expected)


@FAST
@given(st.lists(lines, max_size=30), st.integers(1, 4), st.integers(1, 40),
       st.lists(st.tuples(st.integers(1, 5), st.lists(st.integers(0, 4), min_size=5, max_size=5)), max_size=3))
def test_a_rescale_reads_every_line_left_once_whatever_was_read_before(text_lines, parallelism, chunk, steps):
    """Tasks read some batches, then the sources are rescaled (again and again), then read
    to the end: every line is read exactly once."""
    content = "".join(f"{line}\n" for line in text_lines)
    with tempfile.TemporaryDirectory() as directory, patch.object(files, "READ_CHUNK_BYTES", chunk):
        path = os.path.join(directory, "in.txt")
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(content)
        sources, read = [opened(TextFileSource, path, parallelism, i) for i in range(parallelism)], []
        for new_parallelism, batches in steps:
            for source, count in zip(sources, batches):
                for _ in range(count):
                    read += [r.value for r in source.read(2) or []]
            states = [roundtrip(source.snapshot()) for source in sources]
            for source in sources:
                source.close()
            sources = []
            for index in range(new_parallelism):
                source = opened(TextFileSource, path, new_parallelism, index)
                source.restore(TextFileSource(path).rescale(states, index, new_parallelism))
                sources.append(source)
        for source in sources:
            read += read_rest(source, 3)
            source.close()
    assert sorted(read) == sorted(text_lines)


json_lines = st.one_of(
    st.sampled_from(["", " ", "\u00a0", "\u2028 ", "\t"]),  # blank for str.strip, not all for bytes.strip
    st.recursive(
        st.none() | st.integers() | st.text(max_size=5),
        lambda children: st.lists(children, max_size=3),
        max_leaves=4,
    ).map(lambda v: json.dumps(v, ensure_ascii=False)),
)


@FAST
@given(st.lists(json_lines, max_size=30), st.integers(1, 4), st.integers(1, 40),
       st.lists(st.integers(1, 7), min_size=1, max_size=5))
def test_jsonl_snapshot_at_random_points_skips_blank_lines_as_read_does(lines_, parallelism, chunk, batch_sizes):
    content = "\n".join(lines_)
    with tempfile.TemporaryDirectory() as directory, patch.object(files, "READ_CHUNK_BYTES", chunk):
        path = os.path.join(directory, "in.jsonl")
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(content)
        values = check_every_cut(JsonLinesSource, path, parallelism, batch_sizes)
    expected = [json.loads(line) for line in lines_ if line.strip()]
    assert sorted(map(repr, values)) == sorted(map(repr, expected))


def test_restore_refuses_another_file_or_split(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("a\nb\nc\nd\n")
    source = opened(TextFileSource, str(path), 2, 0)
    source.read(1)
    state = source.snapshot()
    assert state["offset"] == 2

    with pytest.raises(ValueError, match="another file or split"):
        opened(TextFileSource, str(path), 3, 0).restore(state)
    with pytest.raises(ValueError, match="another file or split"):
        opened(TextFileSource, str(path), 2, 1).restore(state)
    with pytest.raises(ValueError, match="not the start of a line"):
        opened(TextFileSource, str(path), 2, 0).restore({**state, "offset": 3})
    path.write_text("a\nb\nc\nd\ne\n")
    with pytest.raises(ValueError, match="another file or split"):
        opened(TextFileSource, str(path), 2, 0).restore(state)


def test_restore_at_the_end_reads_nothing(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("a\nb")
    source = opened(TextFileSource, str(path), 1, 0)
    assert read_rest(source) == ["a", "b"]
    state = source.snapshot()
    assert state["offset"] == 3
    restored = opened(TextFileSource, str(path), 1, 0)
    restored.restore(state)
    assert restored.read(10) is None


@pytest.mark.parametrize("parallelism", [1, 3])
def test_collection_source_resumes_at_its_position(parallelism):
    items = list(range(20))
    for index in range(parallelism):
        source = CollectionSource(items)
        source.open(context(parallelism, index))
        first = [r.value for r in source.read(2)]
        restored = CollectionSource(items)
        restored.open(context(parallelism, index))
        restored.restore(roundtrip(source.snapshot()))
        assert first + read_rest(restored) == items[index::parallelism]
    with pytest.raises(ValueError, match="another share"):
        restored = CollectionSource(items)
        restored.open(context(2, 0))
        restored.restore(source.snapshot())


def test_rate_source_replays_the_numbers_after_its_snapshot():
    source = RateSource(1_000_000, count=3000)
    source.open(context(3, 1))
    head = []
    while len(head) < 500:
        head += [r.value for r in source.read(100)]
    state = roundtrip(source.snapshot())
    source.read(100)  # read on past the snapshot, as a failed attempt would
    restored = RateSource(1_000_000, count=3000)
    restored.open(context(3, 1))
    restored.restore(state)
    tail = []
    while (batch := restored.read(1000)) is not None:
        tail += [r.value for r in batch]
    assert head + tail == list(range(1, 3000, 3))
    other = RateSource(1_000_000, count=3000)
    other.open(context(2, 1))
    with pytest.raises(ValueError, match="parallelism changed"):
        other.restore(state)


# --- the transactional sink ----------------------------------------------------------


def records(values):
    return [Record(v, 0) for v in values]


def open_sink(path, epoch=0, app_id=1, parallelism=1, index=0):
    sink = JsonLinesSink(path)
    sink.open(context(parallelism, index, epoch, app_id))
    return sink


def lines_of(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_lines_reach_the_file_only_when_committed(tmp_path, caplog):
    path = str(tmp_path / "out" / "o.jsonl")
    sink = open_sink(path)
    assert JsonLinesSink.transactional
    sink.write(records([1, "ü"]))
    sink.pre_commit(1)
    sink.write(records([2]))
    sink.write(records([3]))
    sink.pre_commit(2)
    sink.write(records([4]))
    assert lines_of(path) == []
    sink.commit(1)
    assert lines_of(path) == [1, "ü"]
    sink.commit(2)
    sink.commit(2)  # a repeated commit changes nothing
    assert lines_of(path) == [1, "ü", 2, 3]
    with caplog.at_level(logging.WARNING):
        sink.close()
    assert "not committed" in caplog.text
    assert lines_of(path) == [1, "ü", 2, 3]  # what was never sealed is not written


def test_a_commit_takes_every_sealed_transaction_up_to_its_checkpoint(tmp_path):
    path = str(tmp_path / "o.jsonl")
    sink = open_sink(path)
    for checkpoint in (1, 2, 3):
        sink.write(records([checkpoint]))
        sink.pre_commit(checkpoint)
    sink.commit(2)  # checkpoint 1's commit was skipped: 2 commits it too
    assert lines_of(path) == [1, 2]
    assert roundtrip(sink.snapshot())["transactions"] == [(3, b"3\n")]
    with pytest.raises(ValueError, match="sealed after"):
        sink.pre_commit(3)
    sink.commit(3)
    sink.close()
    assert lines_of(path) == [1, 2, 3]


STAGES = ["written", "sealed", "completed", "torn commit", "committed"]


def run_with_crashes(path, batches, crashes):
    """Drive a sink as the runtime does, checkpoint c+1 after batch c, crashing (the
    instance is dropped, not closed) at the given (batch, stage) points: each crash
    restarts a new attempt from the last completed checkpoint, whose source replays the
    batches after it. The crashed attempt lives on as a zombie and must fail to commit."""
    crashes = set(crashes)
    epoch, completed = 0, None
    sink = open_sink(path, epoch)
    c = 0
    while c < len(batches):
        crash = next((stage for stage in STAGES if (c, stage) in crashes), None)
        crashes.discard((c, crash))
        sink.write(records(batches[c]))
        if crash != "written":
            sink.pre_commit(c + 1)
            state = pickle.dumps(sink.snapshot())
            if crash != "sealed":
                completed = (c + 1, state)  # every task acknowledged checkpoint c + 1
                if crash == "torn commit":
                    with open(path, "ab") as f:
                        f.write(json.dumps(batches[c]).encode()[:-1])
                elif crash != "completed":
                    sink.commit(c + 1)
        if crash is None:
            c += 1
            continue
        zombie, epoch = sink, epoch + 1
        sink = open_sink(path, epoch)
        c = 0
        if completed is not None:
            sink.restore(pickle.loads(completed[1]))
            c = completed[0]
        content = open(path, "rb").read()
        with pytest.raises(StaleAttemptError, match="was replaced"):
            zombie.commit(len(batches) + 1)
        assert open(path, "rb").read() == content
    sink.pre_commit(len(batches) + 1)  # the final checkpoint, after the end of the input
    sink.commit(len(batches) + 1)
    sink.close()


batch_lists = st.lists(st.lists(st.one_of(st.integers(), st.text(max_size=4)), max_size=4), min_size=1, max_size=6)


@FAST
@given(batch_lists, st.data())
def test_after_crashes_and_restores_the_file_holds_each_line_once_in_order(batches, data):
    points = [(c, stage) for c in range(len(batches)) for stage in STAGES]
    crashes = data.draw(st.lists(st.sampled_from(points), max_size=4, unique=True))
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "o.jsonl")
        with open(path, "w") as f:
            f.write('"output of an earlier run"\n')
        run_with_crashes(path, batches, crashes)
        assert lines_of(path) == [v for batch in batches for v in batch]


def test_a_snapshot_taken_while_a_commit_runs_in_another_thread_restores_the_same_file(tmp_path):
    path = str(tmp_path / "o.jsonl")
    sink = open_sink(path)
    sink.write(records([1]))
    sink.pre_commit(1)
    appended, release = threading.Event(), threading.Event()
    append = sink._append

    def slow_append(committed, chunks):
        size = append(committed, chunks)
        appended.set()
        release.wait(10)
        return size

    sink._append = slow_append
    commit = threading.Thread(target=sink.commit, args=(1,))
    commit.start()
    assert appended.wait(10)
    sink.write(records([2]))
    sink.pre_commit(2)
    state = roundtrip(sink.snapshot())  # line 1 is in the file, its commit not finished
    release.set()
    commit.join()
    assert state["committed"] == 0 and state["transactions"] == [(1, b"1\n"), (2, b"2\n")]
    assert roundtrip(sink.snapshot())["transactions"] == [(2, b"2\n")]
    restored = open_sink(path, epoch=1)
    restored.restore(state)
    assert lines_of(path) == [1, 2]


def test_open_does_not_truncate_and_a_fresh_start_empties_the_file_at_its_first_commit(tmp_path):
    path = str(tmp_path / "o.jsonl")
    with open(path, "w") as f:
        f.write('"old"\n')
    sink = open_sink(path)
    assert lines_of(path) == ["old"]  # open() cannot tell a fresh start from a restore
    sink.pre_commit(1)
    sink.commit(1)
    assert lines_of(path) == []
    sink.write(records(["new"]))
    sink.pre_commit(2)
    sink.commit(2)
    sink.close()
    assert lines_of(path) == ["new"]


def test_restore_keeps_the_committed_lines_and_drops_the_rest(tmp_path):
    path = str(tmp_path / "o.jsonl")
    sink = open_sink(path)
    sink.write(records([1]))
    sink.pre_commit(1)
    sink.commit(1)
    sink.write(records([2]))
    sink.pre_commit(2)
    state = roundtrip(sink.snapshot())
    assert state == {"path": path, "committed": 2, "transactions": [(2, b"2\n")]}
    sink.commit(2)
    sink.write(records([3]))
    sink.pre_commit(3)
    sink.commit(3)  # committed, but checkpoint 3 is not the one restored
    with open(path, "ab") as f:
        f.write(b"garbage")
    restored = open_sink(path, epoch=1)
    restored.restore(state)
    assert lines_of(path) == [1, 2]
    restored.close()


def test_a_zombie_cannot_open_after_a_newer_attempt(tmp_path):
    path = str(tmp_path / "o.jsonl")
    open_sink(path, epoch=2).close()
    with pytest.raises(StaleAttemptError, match="attempt 1 of application 1"):
        open_sink(path, epoch=1)
    open_sink(path, epoch=2).close()  # the same attempt may open again


def test_another_application_takes_the_file_over(tmp_path):
    path = str(tmp_path / "o.jsonl")
    old = open_sink(path, epoch=5, app_id=1)
    new = open_sink(path, epoch=0, app_id=2)
    new.write(records(["new"]))
    new.pre_commit(1)
    new.commit(1)
    old.write(records(["old"]))
    old.pre_commit(7)
    with pytest.raises(StaleAttemptError):
        old.commit(7)
    assert lines_of(path) == ["new"]


def test_restore_refuses_another_tasks_file_or_a_shortened_file(tmp_path):
    path = str(tmp_path / "o.jsonl")
    sink = open_sink(path)
    sink.write(records([1, 2]))
    sink.pre_commit(1)
    sink.commit(1)
    state = roundtrip(sink.snapshot())
    with pytest.raises(ValueError, match="parallelism"):
        open_sink(path, epoch=1, parallelism=2).restore(state)
    with open(path, "w") as f:
        f.write("1\n")
    with pytest.raises(ValueError, match="changed outside gearbus"):
        open_sink(path, epoch=1).restore(state)


def test_parallel_tasks_commit_their_own_files(tmp_path):
    path = str(tmp_path / "o.jsonl")
    for index in range(3):
        sink = open_sink(path, parallelism=3, index=index)
        sink.write(records([index]))
        sink.pre_commit(1)
        sink.commit(1)
        sink.close()
    for index in range(3):
        assert lines_of(str(tmp_path / f"o-{index:05d}.jsonl")) == [index]
        assert os.path.exists(tmp_path / f".o-{index:05d}.jsonl.fence")
    assert not os.path.exists(path)
