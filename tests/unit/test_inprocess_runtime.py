"""The in-process engine drives the cluster's runtime under seeded interleavings: every
interleaving gives the same result, one seed always gives one interleaving, a run
crashed anywhere resumes from its last checkpoint with exactly the output of a clean run,
and a run that loses executors rolls back by itself, through the AppMaster's own state
machine, within its restart budget."""

import collections
import json

import pytest

from gearbus import Pipeline
from gearbus.api.task import DataSink
from gearbus.connectors.files import CollectSink
from gearbus.runners.inprocess import PipelineFailed, SimulatedCrash
from gearbus.runtime.appmaster_state import Phase
from shared.messages import AppState
from tests.support.rescale import rescaled
from tests.support.wordcount import running_count_pipeline

WORDS = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu"]
LINES = [" ".join(WORDS[(i * j) % len(WORDS)] for j in range(1, 1 + i % 5)) for i in range(120)]
COUNTS = collections.Counter(w for line in LINES for w in line.split())
#: small frames and a small credit window, so senders wait for credit and frames interleave
CONFIG = {"batch_records": 5, "credit_frames": 2}


def word(w: str) -> str:
    return w


def row(result) -> dict:
    return {"word": result.key, "count": result.value}


def wordcount(sink) -> Pipeline:
    p = Pipeline("wordcount", config=CONFIG, parallelism=3)
    (p.from_collection(LINES, name="read", parallelism=3).flat_map(str.split, name="split")
        .group_by(word, name="by_word").count(name="count").map(row, name="format").sink(sink, name="write"))
    return p


@pytest.mark.parametrize("seed", range(20))
def test_wordcount_gives_the_same_counts_under_every_interleaving(inprocess, seed):
    out = []
    inprocess(wordcount(CollectSink(out)), seed=seed).run()
    assert collections.Counter({r["word"]: r["count"] for r in out}) == COUNTS
    assert len(out) == len(COUNTS)


def arrival_order(inprocess, seed: int) -> list:
    out = []
    p = Pipeline("arrivals", config=CONFIG, parallelism=3)
    (p.from_collection(range(60), name="read", parallelism=3).map(lambda n: n * 10, name="times_ten")
        .sink(CollectSink(out), name="write"))
    inprocess(p, seed=seed).run()
    return out


def test_one_seed_one_interleaving_and_seeds_differ(inprocess):
    orders = [arrival_order(inprocess, seed) for seed in range(5)]
    assert orders[0] == arrival_order(inprocess, 0)
    assert all(sorted(order) == [n * 10 for n in range(60)] for order in orders)
    assert len({tuple(order) for order in orders}) > 1


def committed_counts(path) -> collections.Counter:
    counts = collections.Counter()
    for line in path.read_text().splitlines():
        row = json.loads(line)
        counts[row["word"]] += row["count"]
    return counts


def jsonl_wordcount(path, config: dict | None = None, counters: int | None = None, **source) -> Pipeline:
    """The wordcount into a JSON-lines file: a two-phase sink, exactly-once across recoveries.
    ``counters``: the counting step's parallelism (the source's, 3, by default)."""
    p = Pipeline("wordcount", config={**CONFIG, **(config or {})}, parallelism=3)
    (p.from_collection(LINES, name="read", parallelism=3, **source).flat_map(str.split, name="split")
        .group_by(word, name="by_word", parallelism=counters).count(name="count").map(row, name="format")
        .write_jsonl(str(path), name="write"))
    return p


def running_counts(path, counters: int | None = None) -> Pipeline:
    """Each word's running count, emitted at every occurrence (``stateful_map``)."""
    return running_count_pipeline(path, LINES, CONFIG, 3, counters, "running")


def combined_counts(path, counters: int | None = None) -> Pipeline:
    """The wordcount, its map-side combine sending on every two keys: the counts are held
    by the counting step, not upstream."""
    return jsonl_wordcount(path, {"combine_keys": 2}, counters)


def split_upstream(path, counters: int | None = None) -> Pipeline:
    """The wordcount with one reading task, the split and its map-side combine in 3 tasks
    (or ``counters``): the partial counts held upstream of the shuffle divide, and several
    old tasks' partials of one word merge."""
    p = Pipeline("upstream", config=CONFIG, parallelism=3)
    (p.from_collection(LINES, name="read", parallelism=1).flat_map(str.split, name="split", parallelism=counters)
        .group_by(word, name="by_word").count(name="count").map(row, name="format")
        .write_jsonl(str(path), name="write"))
    return p


@pytest.mark.parametrize("counters", [1, 2, 5])
@pytest.mark.parametrize("build", [combined_counts, running_counts, split_upstream])
def test_keyed_state_divides_over_another_parallelism_by_key_group(inprocess, tmp_path, build, counters):
    """Crashed with the counting step in 3 tasks, resumed with it in ``counters``: each
    task restores the state of its key groups (as from a savepoint), and the output is exact."""
    out = tmp_path / "counts.jsonl"
    first = inprocess(build(out), seed=1, checkpoint_every=2)
    with pytest.raises(SimulatedCrash):
        first.run(crash_after_frames=120)
    checkpoint = first.latest_checkpoint()
    assert checkpoint is not None
    again = inprocess(build(out, counters=counters), seed=2, checkpoint_every=2, epoch=1)
    again.run(restore=rescaled(checkpoint, first.app, again.app))
    if build is not running_counts:
        assert committed_counts(out) == COUNTS
    else:
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert sorted((r["word"], r["count"]) for r in rows) == sorted((w, n) for w, c in COUNTS.items()
                                                                       for n in range(1, c + 1))


@pytest.mark.parametrize("before, after", [("memory", "rocksdb"), ("rocksdb", "memory")])
def test_a_checkpoint_of_one_state_backend_restores_with_the_other(inprocess, tmp_path, before, after):
    """Both backends snapshot alike: crashed with the running counts in one, resumed in
    the other (and in 2 tasks instead of 3), the counts go on exactly."""
    out = tmp_path / "counts.jsonl"
    crashed, resumed = running_counts(out), running_counts(out, counters=2)
    crashed.config["state_backend"], resumed.config["state_backend"] = before, after
    first = inprocess(crashed, seed=1, checkpoint_every=2)
    with pytest.raises(SimulatedCrash):
        first.run(crash_after_frames=120)
    checkpoint = first.latest_checkpoint()
    again = inprocess(resumed, seed=2, checkpoint_every=2, epoch=1)
    again.run(restore=rescaled(checkpoint, first.app, again.app))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["word"], r["count"]) for r in rows) == sorted((w, n) for w, c in COUNTS.items()
                                                                   for n in range(1, c + 1))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("crash_after_frames", [3, 40, 120])
def test_a_crashed_run_resumes_from_its_last_checkpoint_with_exact_output(inprocess, tmp_path, seed,
                                                                         crash_after_frames):
    out = tmp_path / "counts.jsonl"
    p = jsonl_wordcount(out)
    first = inprocess(p, seed=seed, checkpoint_every=2)
    with pytest.raises(SimulatedCrash):
        first.run(crash_after_frames=crash_after_frames)
    checkpoint = first.latest_checkpoint()
    if crash_after_frames == 120:
        assert checkpoint is not None, "the crash came after a completed checkpoint"
    inprocess(p, seed=seed + 100, checkpoint_every=2, epoch=1).run(restore=checkpoint)
    assert committed_counts(out) == COUNTS


@pytest.mark.parametrize("seed", range(6))
def test_a_killed_executor_rolls_the_app_back_to_its_last_checkpoint_with_exact_output(inprocess, tmp_path, seed):
    out = tmp_path / "counts.jsonl"
    engine = inprocess(jsonl_wordcount(out), seed=seed, checkpoint_every=2)
    engine.run(kill_executor_after_frames=[25, 90])
    assert committed_counts(out) == COUNTS
    assert engine.state.phase is Phase.ENDING and engine.state.outcome.state == AppState.SUCCEEDED
    assert (engine.epoch, engine.state.restarts, engine.stored_epoch) == (2, 2, (2, 2))  # two rollbacks
    assert len(engine.state.live_executors()) == 2 and {task.core.epoch for task in engine.nodes.values()} == {2}
    engine.state.validate()


def test_one_seed_one_recovery(inprocess, tmp_path):
    files = [tmp_path / "first.jsonl", tmp_path / "second.jsonl"]
    for out in files:  # event times from the data: ingestion times would move watermarks differently
        inprocess(jsonl_wordcount(out, timestamp_fn=len), seed=4, checkpoint_every=2).run(
            kill_executor_after_frames=[25, 90])
    assert files[0].read_text() == files[1].read_text()


def test_a_kill_before_any_checkpoint_restarts_the_app_from_the_beginning(inprocess, tmp_path):
    out = tmp_path / "counts.jsonl"
    engine = inprocess(jsonl_wordcount(out), seed=3)  # only the final checkpoint
    engine.run(kill_executor_after_frames=[30])
    assert committed_counts(out) == COUNTS
    assert engine.epoch == 1


def test_a_run_that_keeps_losing_executors_fails_past_its_restart_budget(inprocess, tmp_path):
    out = tmp_path / "counts.jsonl"
    engine = inprocess(jsonl_wordcount(out, {"max_restarts": 1}), seed=1, checkpoint_every=2)
    with pytest.raises(PipelineFailed) as failed:
        engine.run(kill_executor_after_frames=[25, 60])
    assert failed.value.error.error_type == "RestartBudgetExhausted"
    assert "executor" in failed.value.error.message and "gave up after 1 restarts" in failed.value.error.message
    assert engine.state.outcome.state == AppState.FAILED and engine.state.restarts == 2
    assert all(not node.started for node in engine.nodes.values())
    assert sum(committed_counts(out).values()) < sum(COUNTS.values())  # the final checkpoint never completed


class FlakyCommits(DataSink):
    """A two-phase sink into a shared list whose first ``failures`` commits fail (as a
    lost connection would); commits repeated after a rollback are idempotent."""

    transactional = True
    failures = 0

    def __init__(self, committed: dict):
        self.committed = committed  # (task index, checkpoint id) -> its values, shared by every task

    def __deepcopy__(self, memo):
        return FlakyCommits(self.committed)  # one per task, all into the shared dict

    def open(self, context):
        self.index, self.pending, self.sealed = context.index, [], {}

    def write(self, records):
        self.pending.extend(r.value for r in records)

    def pre_commit(self, checkpoint_id):
        self.sealed[checkpoint_id], self.pending = self.pending, []

    def commit(self, checkpoint_id):
        if FlakyCommits.failures:
            FlakyCommits.failures -= 1
            raise ConnectionError("the sink's server went away")
        for sealed in [c for c in self.sealed if c <= checkpoint_id]:
            self.committed[(self.index, sealed)] = self.sealed.pop(sealed)

    def snapshot(self):
        return dict(self.sealed)

    def restore(self, state):
        self.sealed = dict(state)
        self.commit(max(self.sealed, default=0))


def test_a_failed_commit_rolls_the_app_back_as_on_the_cluster_and_the_output_is_exact(inprocess):
    """A commit that raises fails its task recoverably (the executor's task lifecycle): the
    app rolls back to its last checkpoint and commits again."""
    committed: dict = {}
    FlakyCommits.failures = 2
    p = Pipeline("flaky", config=CONFIG, parallelism=3)
    (p.from_collection(LINES, name="read", parallelism=3).flat_map(str.split, name="split")
        .group_by(word, name="by_word").count(name="count").map(row, name="format")
        .sink(FlakyCommits(committed), name="write", parallelism=3))
    engine = inprocess(p, seed=1, checkpoint_every=2)
    engine.run()
    assert FlakyCommits.failures == 0 and engine.state.restarts >= 1
    for machine in engine.executors.values():  # no commit of the replaced attempt reached the new one
        machine.validate()
    counts = collections.Counter()
    for values in committed.values():
        for value in values:
            counts[value["word"]] += value["count"]
    assert counts == COUNTS
