"""The in-process engine drives the cluster's runtime under seeded interleavings: every
interleaving gives the same result, one seed always gives one interleaving, and a run
crashed anywhere resumes from its last checkpoint with exactly the output of a clean run."""

import collections
import json

import pytest

from gearbus import Pipeline
from gearbus.connectors.files import CollectSink
from gearbus.runners.inprocess import SimulatedCrash

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


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("crash_after_frames", [3, 40, 120])
def test_a_crashed_run_resumes_from_its_last_checkpoint_with_exact_output(inprocess, tmp_path, seed,
                                                                         crash_after_frames):
    out = tmp_path / "counts.jsonl"
    p = Pipeline("wordcount", config=CONFIG, parallelism=3)
    (p.from_collection(LINES, name="read", parallelism=3).flat_map(str.split, name="split")
        .group_by(word, name="by_word").count(name="count").map(row, name="format").write_jsonl(str(out), name="write"))
    first = inprocess(p, seed=seed, checkpoint_every=2)
    with pytest.raises(SimulatedCrash):
        first.run(crash_after_frames=crash_after_frames)
    checkpoint = first.latest_checkpoint()
    if crash_after_frames == 120:
        assert checkpoint is not None, "the crash came after a completed checkpoint"
    inprocess(p, seed=seed + 100, checkpoint_every=2, epoch=1).run(restore=checkpoint)
    assert committed_counts(out) == COUNTS
