"""WordCount, as Gearpump's: a Split processor, hash partitioning by word, a Sum processor.

    gearbus run examples/wordcount.py --input text.txt --output counts.jsonl [--parallelism N]

Writes one JSON line ``{"word": w, "count": n}`` per distinct whitespace-separated word
once the input has ended.
"""

from __future__ import annotations

import argparse
import collections
import os

from gearbus import (
    Application,
    CoLocationPartitioner,
    Graph,
    HashPartitioner,
    JsonLinesSink,
    Processor,
    ShufflePartitioner,
    Task,
    TextFileSource,
)


class Split(Task):
    """Splits lines into words and emits ``(word, count)`` per distinct word of each
    input batch: a map-side combine that sends each word once per batch, not once
    per occurrence."""

    def on_batch(self, records):
        counts = collections.Counter()
        for record in records:
            counts.update(record.value.split())
        emit = self.emit
        for word, n in counts.items():
            emit(n, key=word)


class Sum(Task):
    """Adds up the counts of the words hashed to this task; emits totals at the end."""

    def on_start(self):
        self.counts = collections.Counter()

    def on_batch(self, records):
        counts = self.counts
        for record in records:
            counts[record.key] += record.value

    def on_end(self):
        for word, n in self.counts.items():
            self.emit({"word": word, "count": n}, key=word)


def application(args: list[str]) -> Application:
    parser = argparse.ArgumentParser(prog="wordcount")
    parser.add_argument("--input", required=True, help="text file to count")
    parser.add_argument("--output", required=True, help="JSON Lines file to write")
    parser.add_argument("--parallelism", type=int, default=2, help="tasks per stage (default 2)")
    opts = parser.parse_args(args)
    if opts.parallelism < 1:
        parser.error("--parallelism must be at least 1")
    if not os.path.isfile(opts.input):
        parser.error(f"input file {opts.input} does not exist")
    n = opts.parallelism
    graph = Graph()
    source = Processor.source(TextFileSource(os.path.abspath(opts.input)), parallelism=n, name="read")
    split = Processor(Split, parallelism=n, name="split")
    total = Processor(Sum, parallelism=n, name="sum")
    sink = Processor.sink(JsonLinesSink(os.path.abspath(opts.output)), parallelism=1, name="write")
    graph.connect(source, split, CoLocationPartitioner())
    graph.connect(split, total, HashPartitioner())
    graph.connect(total, sink, ShufflePartitioner())
    return Application("wordcount", graph, config={"executors": n})
