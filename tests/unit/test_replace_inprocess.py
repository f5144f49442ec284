"""Replacing a processor's code in a running app on the test runner: the AppMaster's own
state machine takes a checkpoint that parks the tasks, and the app goes on from it in a new
epoch, the replaced processor's tasks with the new code and the state of the steps it
keeps, the others in place; new code that
fails before its first checkpoint is rolled back. The output stays exactly-once, whenever
the replacement comes, in whatever order the frames go."""

from __future__ import annotations

import collections
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gearbus import Pipeline
from gearbus.planner import plan
from gearbus.runtime.appmaster_state import AnswerReplace
from gearbus.runtime.replace import ReplaceError
from shared.messages import AppState

WORDS = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen", "ibis", "jay"]
LINES = [" ".join(WORDS[(i * j) % len(WORDS)] for j in range(1, 1 + i % 6)) for i in range(200)]
COUNTS = collections.Counter(w for line in LINES for w in line.split())
EXPECTED = sorted((w, n) for w, total in COUNTS.items() for n in range(1, total + 1))


def _word(w: str) -> str:
    return w


def counting(path, version: int = 1, step: str = "count") -> Pipeline:
    """Each word's running count at every occurrence; version 2 marks its rows, version 3
    fails on its first record."""
    def count(seen, w):
        if version == 3:
            raise RuntimeError("version 3 cannot count")
        row = {"word": w, "count": (seen or 0) + 1}
        return (seen or 0) + 1, {**row, "version": 2} if version == 2 else row

    p = Pipeline("running", config={"batch_records": 5, "credit_frames": 2}, parallelism=2)
    (p.from_collection(LINES, name="read", parallelism=2).flat_map(str.split, name="split")
        .group_by(_word, name="by_word").stateful_map(count, name=step)
        .map(dict, name="format").write_jsonl(str(path), name="write"))
    return p


def rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def switched_once(committed: list[dict]) -> bool:
    """Each word's rows before the switch came from the old code, after it from the new."""
    by_word = collections.defaultdict(list)
    for row in committed:
        by_word[row["word"]].append((row["count"], row.get("version", 1)))
    return all([v for _, v in sorted(counts)] == sorted(v for _, v in counts) for counts in by_word.values())


@pytest.mark.parametrize("seed", range(3))
def test_a_replaced_step_goes_on_with_its_state_in_the_new_code_exactly_once(inprocess, tmp_path, seed):
    out = tmp_path / "counts.jsonl"
    engine = inprocess(counting(out), seed=seed, checkpoint_every=2)
    before, replace = {}, engine.replace

    def watching(*change):
        before.update((key, node.task) for key, node in engine.nodes.items())
        replace(*change)
    engine.replace = watching
    engine.run(replace_after_frames={60: ("count", plan(counting(out, version=2), "test"))})
    committed = rows(out)
    assert sorted((r["word"], r["count"]) for r in committed) == EXPECTED
    assert engine.replaces == [AnswerReplace(1)]
    versions = collections.Counter(r.get("version", 1) for r in committed)
    assert versions[1] and versions[2], versions
    assert switched_once(committed)
    counter = next(p.id for p in engine.plan.graph.processors if "count" in p.config.get("steps", ()))
    assert engine.state.versions == {counter: 2} and engine.state.outcome.state == AppState.SUCCEEDED
    after = {key: node.task for key, node in engine.nodes.items()}  # the other processors went on in place
    assert all((after[key] is task) == (key[0] != counter) for key, task in before.items())
    engine.state.validate()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(when=st.integers(1, 400), seed=st.integers(0, 1000))
def test_whenever_a_replacement_comes_the_output_is_exactly_once(inprocess, tmp_path_factory, when, seed):
    out = tmp_path_factory.mktemp("replace") / "counts.jsonl"
    engine = inprocess(counting(out), seed=seed, checkpoint_every=2)
    engine.run(replace_after_frames={when: ("count", plan(counting(out, version=2), "test"))})
    committed = rows(out)
    assert sorted((r["word"], r["count"]) for r in committed) == EXPECTED
    assert switched_once(committed)
    [answer] = engine.replaces  # done, or too late: the tasks had ended
    assert not answer.error or "ended" in answer.error, answer
    engine.state.validate()


def test_new_code_failing_on_its_first_records_is_rolled_back_and_the_app_goes_on(inprocess, tmp_path):
    out = tmp_path / "counts.jsonl"
    engine = inprocess(counting(out), seed=3, checkpoint_every=2)
    engine.run(replace_after_frames={60: ("count", plan(counting(out, version=3), "test"))})
    assert sorted((r["word"], r["count"]) for r in rows(out)) == EXPECTED
    [answer] = engine.replaces
    assert "version 2 rolled back to version 1" in answer.error and "version 3 cannot count" in answer.error
    assert engine.state.versions == {} and engine.state.outcome.state == AppState.SUCCEEDED
    engine.state.validate()


def test_state_the_new_code_would_drop_needs_drop_state_and_then_starts_empty(inprocess, tmp_path):
    out = tmp_path / "counts.jsonl"
    engine = inprocess(counting(out), seed=1, checkpoint_every=2)
    with pytest.raises(ReplaceError, match=r"drop the state of step\(s\) 'count' \(StatefulMapOp, gone\).*--drop-state"):
        engine.run(replace_after_frames={60: ("format", plan(counting(out, step="tally"), "test"))})
    out = tmp_path / "dropped.jsonl"
    engine = inprocess(counting(out), seed=1, checkpoint_every=2)
    engine.run(replace_after_frames={60: ("format", plan(counting(out, step="tally"), "test"), True)})
    assert engine.replaces == [AnswerReplace(1)]
    committed = sorted((r["word"], r["count"]) for r in rows(out))
    restarted = collections.Counter(word for word, count in committed if count == 1)
    assert sum(restarted.values()) > len(COUNTS), restarted  # words seen before the switch counted from 1 again
    assert len(committed) == len(EXPECTED)
    engine.state.validate()


def test_a_graph_that_differs_outside_the_processor_is_refused(inprocess, tmp_path):
    out = tmp_path / "counts.jsonl"
    other = Pipeline("running", parallelism=2)
    (other.from_collection(LINES, name="read", parallelism=2).flat_map(str.split, name="split")
        .map(str.upper, name="shout").group_by(_word, name="by_word").stateful_map(lambda s, w: (s, w), name="count")
        .map(dict, name="format").write_jsonl(str(out), name="write"))
    engine = inprocess(counting(out), seed=1, checkpoint_every=2)
    with pytest.raises(ReplaceError, match="differs outside processor 'count\\+format'.*read\\+split"):
        engine.run(replace_after_frames={60: ("count", plan(other, "test"))})


TIMED = [(t, WORDS[(t * 7) % len(WORDS)]) for t in range(1, 801)]
AT_MS = 400


def timed_counting(path, version: int = 1) -> Pipeline:
    """Each word's running count at every occurrence, stamped with its event time (the
    first of each item); version 2 marks its rows."""
    def count(seen, item):
        row = {"word": item[1], "count": (seen or 0) + 1, "t": item[0]}
        return (seen or 0) + 1, {**row, "version": 2} if version == 2 else row

    p = Pipeline("timed", config={"batch_records": 5, "credit_frames": 2}, parallelism=2)
    (p.from_collection(TIMED, name="read", parallelism=2, timestamp_fn=lambda item: item[0])
        .group_by(lambda item: item[1], name="by_word").stateful_map(count, name="count")
        .write_jsonl(str(path), name="write"))
    return p


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(when=st.integers(1, 60), seed=st.integers(0, 1000))
def test_with_an_event_time_records_before_it_go_to_the_old_code_and_the_rest_to_the_new(inprocess, tmp_path_factory,
                                                                                        when, seed):
    out = tmp_path_factory.mktemp("at") / "counts.jsonl"
    engine = inprocess(timed_counting(out), seed=seed, checkpoint_every=2)
    engine.run(replace_after_frames={when: ("count", plan(timed_counting(out, version=2), "test"), False, AT_MS)})
    committed = rows(out)
    expected = collections.Counter(word for _, word in TIMED)
    assert sorted((r["word"], r["count"]) for r in committed) == \
        sorted((w, n) for w, total in expected.items() for n in range(1, total + 1))
    [answer] = engine.replaces
    if answer.error:  # asked once the watermark had passed the time: refused, all by the old code
        assert "behind the watermark" in answer.error, answer
        assert all("version" not in r for r in committed)
    else:
        assert all(r.get("version", 1) == (2 if r["t"] >= AT_MS else 1) for r in committed)
    engine.state.validate()
