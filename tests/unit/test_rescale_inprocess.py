"""Rescaling a running app on the test runner: the AppMaster's own state machine checkpoints,
and every task goes on from that checkpoint in a new epoch, the rescaled processors' new
tasks dividing the old ones' state by key group as they restore; the output stays
exactly-once, whenever the rescale comes, in whatever order the frames go."""

from __future__ import annotations

import collections
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gearbus import Pipeline
from gearbus.api.task import NotRescalable
from gearbus.connectors.files import JsonLinesSink
from gearbus.runners.inprocess import SimulatedCrash
from gearbus.runtime.appmaster_state import AnswerRescale
from gearbus.runtime.rescale import RescaleError
from shared.messages import AppState
from tests.support.wordcount import running_count_pipeline

WORDS = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen", "ibis", "jay"]
LINES = [" ".join(WORDS[(i * j) % len(WORDS)] for j in range(1, 1 + i % 6)) for i in range(200)]
COUNTS = collections.Counter(w for line in LINES for w in line.split())
CONFIG = {"batch_records": 5, "credit_frames": 2}


def running_counts(path, counters: int = 2) -> Pipeline:
    """Each word's running count at every occurrence (keyed state), into a two-phase sink."""
    return running_count_pipeline(path, LINES, CONFIG, 2, counters, "count")


def committed(path) -> list[tuple[str, int]]:
    return sorted((row["word"], row["count"]) for row in map(json.loads, path.read_text().splitlines()))


EXPECTED = sorted((w, n) for w, total in COUNTS.items() for n in range(1, total + 1))


@pytest.mark.parametrize("seed", range(4))
def test_a_keyed_count_rescaled_2_to_4_to_1_mid_stream_commits_exactly_what_a_plain_run_does(inprocess, tmp_path,
                                                                                                 seed):
    out = tmp_path / "counts.jsonl"
    engine = inprocess(running_counts(out), seed=seed, checkpoint_every=2)
    engine.run(rescale_after_frames={40: {"count": 4}, 160: {"count": 1}})
    assert committed(out) == EXPECTED
    assert engine.rescales == [AnswerRescale(1), AnswerRescale(2)]
    count = next(p for p in engine.plan.graph.processors if "count" in p.config.get("steps", ()))
    assert count.parallelism == 1 and engine.epoch == 2 and engine.state.restarts == 0
    assert engine.state.outcome.state == AppState.SUCCEEDED
    engine.state.validate()


@pytest.mark.parametrize("seed", range(2))
def test_the_processors_not_rescaled_go_on_in_place_never_restarted(inprocess, tmp_path, seed):
    """The rescale's checkpoint parks every task: the tasks of the processors not rescaled
    are rewired for the new epoch and go on, the same objects holding the same state."""
    out = tmp_path / "counts.jsonl"
    engine = inprocess(running_counts(out), seed=seed, checkpoint_every=2)
    seen, rescale = [], engine.rescale

    def watching(steps):
        seen.append({key: node.task for key, node in engine.nodes.items()})
        rescale(steps)
    engine.rescale = watching
    engine.run(rescale_after_frames={40: {"count": 4}, 160: {"count": 1}})
    assert committed(out) == EXPECTED and engine.rescales == [AnswerRescale(1), AnswerRescale(2)]
    count = next(p.id for p in engine.plan.graph.processors if "count" in p.config.get("steps", ()))
    first, second = seen
    final = {key: node.task for key, node in engine.nodes.items()}
    kept = [key for key in first if key[0] != count]
    assert kept and all(second[key] is first[key] and final[key] is first[key] for key in kept)
    assert not set(second.values()) & {task for key, task in first.items() if key[0] == count}
    assert engine.state.restarts == 0


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(when=st.integers(1, 400), parallelism=st.integers(1, 6), seed=st.integers(0, 1000))
def test_whenever_a_rescale_comes_the_output_is_exactly_once(inprocess, tmp_path_factory, when, parallelism, seed):
    out = tmp_path_factory.mktemp("rescale") / "counts.jsonl"
    engine = inprocess(running_counts(out), seed=seed, checkpoint_every=2)
    engine.run(rescale_after_frames={when: {"count": parallelism}})
    assert committed(out) == EXPECTED
    [answer] = engine.rescales  # done, or refused when it came too late or asked for what runs already
    assert not answer.error or "ended" in answer.error or "nothing to change" in answer.error, answer
    engine.state.validate()


def test_a_rescale_beside_executor_kills_stays_exact(inprocess, tmp_path):
    out = tmp_path / "counts.jsonl"
    engine = inprocess(running_counts(out, counters=3), seed=7, checkpoint_every=2)
    engine.run(rescale_after_frames={50: {"count": 5}}, kill_executor_after_frames=[52, 120])
    assert committed(out) == EXPECTED
    assert engine.state.restarts == 2
    engine.state.validate()


def test_on_disk_the_new_tasks_take_their_key_groups_from_the_old_tasks_local_copies_and_stay_exact(inprocess,
                                                                                                      tmp_path):
    out = tmp_path / "counts.jsonl"
    pipeline = running_count_pipeline(out, LINES, {**CONFIG, "state_backend": "rocksdb"}, 2, 2, "count")
    engine = inprocess(pipeline, seed=3, checkpoint_every=2)
    engine.run(rescale_after_frames={40: {"count": 3}, 160: {"count": 1}}, kill_executor_after_frames=[100])
    assert committed(out) == EXPECTED
    assert engine.rescales == [AnswerRescale(1), AnswerRescale(2)] and engine.state.restarts == 1
    [counting] = [node for node in engine.nodes.values() if node.name.startswith("count")]
    assert counting.task.state_backend.adopted == {"count": 128}  # every group from the three old tasks' copies
    engine.state.validate()


def test_with_local_copies_off_a_rescale_on_disk_reads_the_store_alone_and_stays_exact(inprocess, tmp_path):
    out = tmp_path / "counts.jsonl"
    config = {**CONFIG, "state_backend": "rocksdb", "local_copies": False}
    engine = inprocess(running_count_pipeline(out, LINES, config, 2, 2, "count"), seed=3, checkpoint_every=2)
    engine.run(rescale_after_frames={40: {"count": 3}})
    assert committed(out) == EXPECTED and engine.rescales == [AnswerRescale(1)]
    assert all(not node.task.state_backend.adopted for node in engine.nodes.values()
               if hasattr(node.task, "state_backend"))
    with pytest.raises(ValueError, match="local_copies must be true or false"):
        inprocess(running_count_pipeline(out, LINES, {**CONFIG, "local_copies": "no"}, 2, 2, "count"))


def test_a_rescale_asked_wrongly_is_refused_with_the_reason(inprocess, tmp_path):
    engine = inprocess(running_counts(tmp_path / "counts.jsonl"), seed=1, checkpoint_every=2)
    with pytest.raises(RescaleError, match="no step named 'nope'"):
        engine.run(rescale_after_frames={10: {"nope": 2}})
    engine = inprocess(running_counts(tmp_path / "more.jsonl"), seed=1, checkpoint_every=2)
    with pytest.raises(RescaleError, match="run chained in processor .* rescale together"):
        engine.run(rescale_after_frames={10: {"read": 2, "split": 3}})
    out = tmp_path / "zero.jsonl"
    engine = inprocess(running_counts(out), seed=1, checkpoint_every=2)
    engine.run(rescale_after_frames={10: {"count": 0}, 20: {"count": 2}, 30: {"count": 3}, 31: {"count": 4}})
    assert [answer.error for answer in engine.rescales] == [  # the processor by its name
        "count: parallelism 0 is not between 1 and 128 (the key groups)",
        "already at count: 2: nothing to change",
        "another change is in flight (rescale to count: 3): one at a time", ""]
    assert committed(out) == EXPECTED


@pytest.mark.parametrize("step, what", [("write", "sink JsonLinesSink of step 'write'"),
                                        ("split", "source CollectionSource")])
def test_a_step_whose_state_cannot_be_divided_refuses_the_rescale_before_anything_changes(inprocess, tmp_path, step,
                                                                                         what):
    """The JSON-lines sink holds its sealed transactions by task, the collection source its
    position by task: neither is grouped by key, and neither class says how to divide it."""
    engine = inprocess(running_counts(tmp_path / "counts.jsonl"), seed=2, checkpoint_every=2)
    with pytest.raises(RescaleError, match=f"{what} may hold state .* cannot be divided over another number of tasks"):
        engine.run(rescale_after_frames={60: {step: 3}})
    assert engine.epoch == 0 and engine.state.restarts == 0


class _SealedSink(JsonLinesSink):
    """Says how to divide its state, and then finds it cannot (as a map_async holding
    records in flight cannot)."""

    def rescale(self, states, index, parallelism):
        raise NotRescalable("its sealed transactions belong to their task")


def test_a_rescale_whose_new_tasks_cannot_divide_the_state_is_undone_and_the_app_goes_on(inprocess, tmp_path):
    out = tmp_path / "counts.jsonl"
    p = Pipeline("running", config=CONFIG, parallelism=2)
    (p.from_collection(LINES, name="read").flat_map(str.split, name="split").group_by(str, name="by_word")
        .stateful_map(lambda seen, w: ((seen or 0) + 1, {"word": w, "count": (seen or 0) + 1}), name="count")
        .sink(_SealedSink(str(out)), name="write"))
    engine = inprocess(p, seed=2, checkpoint_every=2)
    engine.run(rescale_after_frames={60: {"write": 3}})
    [answer] = engine.rescales
    assert "rescale to write: 3 undone, back to write: 1" in answer.error, answer.error
    assert "its sealed transactions belong to their task" in answer.error
    assert committed(out) == EXPECTED and engine.state.restarts == 1
    assert next(p for p in engine.plan.graph.processors if p.name == "write").parallelism == 1
    engine.state.validate()


def test_a_checkpoint_taken_after_a_rescale_does_not_resume_the_app_at_its_planned_parallelism(inprocess,
                                                                                              tmp_path):
    out = tmp_path / "counts.jsonl"
    engine = inprocess(running_counts(out), seed=3, checkpoint_every=2)
    with pytest.raises(SimulatedCrash):
        engine.run(rescale_after_frames={30: {"count": 4}}, crash_after_frames=300)
    assert engine.rescales == [AnswerRescale(1)]
    with pytest.raises(RuntimeError, match=r"snapshots of tasks \[\(1, 2\), \(1, 3\)\] it does not run"):
        inprocess(running_counts(out), seed=3, checkpoint_every=2, epoch=2).run(restore=engine.latest_checkpoint())


@pytest.mark.parametrize("seed", range(3))
def test_a_file_source_rescaled_hands_each_split_on_whole_and_every_line_is_read_once(inprocess, tmp_path, seed):
    text, lines = tmp_path / "lines.txt", LINES * 4  # none of the reading tasks ends before the second rescale
    text.write_text("".join(f"{line}\n" for line in lines))
    out = tmp_path / "counts.jsonl"
    p = Pipeline("running", config=CONFIG, parallelism=2)
    (p.read_text(str(text), name="read", parallelism=2).flat_map(str.split, name="split")
        .group_by(lambda w: w, name="by_word", parallelism=2)
        .stateful_map(lambda seen, w: ((seen or 0) + 1, {"word": w, "count": (seen or 0) + 1}), name="count")
        .write_jsonl(str(out), name="write"))
    engine = inprocess(p, seed=seed, checkpoint_every=2)
    engine.run(rescale_after_frames={10: {"read": 3}, 40: {"read": 1}})
    assert engine.rescales == [AnswerRescale(1), AnswerRescale(2)]
    words = collections.Counter(w for line in lines for w in line.split())
    assert committed(out) == sorted((w, n) for w, total in words.items() for n in range(1, total + 1))
    engine.state.validate()
