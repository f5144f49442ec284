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
    """Splits lines into words and emits ``(word, count)`` pairs keyed by word.

    A map-side combine: counts are summed locally and sent when the buffer holds
    ``combine_keys`` distinct words, and once more when the input ends, so each word
    crosses the bus once per flush rather than once per occurrence. Memory stays
    bounded by ``combine_keys``.
    """

    def on_start(self):
        self.counts = collections.Counter()
        self.limit = self.context.config.get("combine_keys", 100_000)

    def on_batch(self, records):
        counts = self.counts
        for record in records:
            counts.update(record.value.split())
        if len(counts) >= self.limit:
            self.on_end()

    def on_end(self):
        self.emit_keyed(self.counts.items())
        self.counts = collections.Counter()


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
    parser.add_argument("--combine-keys", type=int, default=100_000,
                        help="distinct words a split task sums up before sending (default 100000)")
    opts = parser.parse_args(args)
    if opts.parallelism < 1 or opts.combine_keys < 1:
        parser.error("--parallelism and --combine-keys must be at least 1")
    if not os.path.isfile(opts.input):
        parser.error(f"input file {opts.input} does not exist")
    n = opts.parallelism
    graph = Graph()
    source = Processor.source(TextFileSource(os.path.abspath(opts.input)), parallelism=n, name="read")
    split = Processor(Split, parallelism=n, name="split", config={"combine_keys": opts.combine_keys})
    total = Processor(Sum, parallelism=n, name="sum")
    sink = Processor.sink(JsonLinesSink(os.path.abspath(opts.output)), parallelism=1, name="write")
    graph.connect(source, split, CoLocationPartitioner())
    graph.connect(split, total, HashPartitioner())
    graph.connect(total, sink, ShufflePartitioner())
    return Application("wordcount", graph, config={"executors": n})
