"""Inputs for the wordcount example and the independent count its output is checked against."""

from __future__ import annotations

import collections
import json
import random

from gearbus import Pipeline

CORPUS_LINES = 20_000


def sample_lines(count: int, seed: int = 3) -> list[str]:
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(500)] + ["naïve", "日本語", "😀", "ünïcödé", "a-b", "x"]
    return [" ".join(rng.choices(vocabulary, k=rng.randint(0, 12))) for _ in range(count)]


def write_corpus(path) -> collections.Counter:
    """CORPUS_LINES lines of five words each, over a 500-word vocabulary; returns the word counts."""
    words = collections.Counter()
    with open(path, "w", encoding="utf-8") as f:
        for n in range(CORPUS_LINES):
            line = [f"w{(n * 7 + k) % 500}" for k in range(5)]
            words.update(line)
            f.write(" ".join(line) + "\n")
    return words


def read_counts(path) -> dict[str, int]:
    counts = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            assert row["word"] not in counts, f"word {row['word']!r} written twice"
            counts[row["word"]] = row["count"]
    return counts


def expected_counts(path) -> dict[str, int]:
    with open(path, encoding="utf-8") as f:
        return dict(collections.Counter(f.read().split()))


def running_count_pipeline(path, lines: list[str], config: dict, parallelism: int, counters: int | None,
                           step: str) -> Pipeline:
    """Each word's running count, emitted at every occurrence (``stateful_map``, step
    ``step``), into a JSON-lines file (a two-phase sink: exactly-once across recoveries)."""
    p = Pipeline("running", config=config, parallelism=parallelism)
    (p.from_collection(lines, name="read", parallelism=parallelism).flat_map(str.split, name="split")
        .group_by(_word, name="by_word", parallelism=counters)
        .stateful_map(lambda seen, w: ((seen or 0) + 1, {"word": w, "count": (seen or 0) + 1}), name=step)
        .write_jsonl(str(path), name="write"))
    return p


def _word(w: str) -> str:
    return w
