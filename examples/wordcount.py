"""WordCount with the DSL: read lines, split them into words, count per word.

    gearbus run [--runner test|local|cluster] examples/wordcount.py --input text.txt --output counts.jsonl
        [--parallelism N] [--combine-keys N] [--stages]

Writes one JSON line ``{"word": w, "count": n}`` per distinct whitespace-separated word
once the input has ended. The planner chains read+split+group_by into one processor with
a map-side combine (each split task sends a word's partial count once per
``--combine-keys`` distinct words, and at the end) and count+format+write into another.
``--stages``: the words reach the counting through an intermediate stream
(``repartition(via="jetstream")``), which makes reading and counting two stages.
"""

from __future__ import annotations

import argparse
import os

from gearbus import Pipeline, submitter_path


def word(w: str) -> str:
    return w


def row(result) -> dict:
    return {"word": result.key, "count": result.value}


def application(args: list[str]) -> Pipeline:
    parser = argparse.ArgumentParser(prog="wordcount")
    parser.add_argument("--input", required=True, help="text file to count")
    parser.add_argument("--output", required=True, help="JSON Lines file to write")
    parser.add_argument("--parallelism", type=int, default=2, help="tasks per stage (default 2)")
    parser.add_argument("--combine-keys", type=int, default=100_000,
                        help="distinct words a split task sums up before sending (default 100000)")
    parser.add_argument("--stages", action="store_true",
                        help="count in a second stage, over an intermediate stream")
    opts = parser.parse_args(args)
    if opts.parallelism < 1 or opts.combine_keys < 1:
        parser.error("--parallelism and --combine-keys must be at least 1")
    if not os.path.isfile(submitter_path(opts.input)):
        parser.error(f"input file {opts.input} does not exist")
    n = opts.parallelism
    pipeline = Pipeline("wordcount", config={"combine_keys": opts.combine_keys, "executors": n}, parallelism=n)
    words = pipeline.read_text(opts.input, parallelism=n, name="read").flat_map(str.split, name="split")
    by_word = words.repartition(word, name="by_word") if opts.stages else words.group_by(word, name="by_word")
    (by_word
        .count(name="count")
        .map(row, name="format")
        .write_jsonl(opts.output, name="write"))
    return pipeline
