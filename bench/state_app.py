"""bench/state.py's pipeline: a keyed running count over KEYS distinct keys, fed as fast
as the source goes (or at RATE events/s), its output discarded.

    --keys KEYS [--rate 1e9] [--parallelism 2] [--counters N]

Event n's key is ``n * 7919 % KEYS`` (every key once per KEYS events, spread over the key
groups); the count per key is held by ``stateful_map``.
"""

from __future__ import annotations

import argparse

from gearbus import DataSink, Pipeline
from gearbus.connectors.generator import RateSource


class Discard(DataSink):
    """Takes the counts and keeps nothing."""

    def write(self, records) -> None:
        pass


def application(args: list[str]) -> Pipeline:
    parser = argparse.ArgumentParser(prog="state_app")
    parser.add_argument("--keys", type=int, required=True)
    parser.add_argument("--rate", type=float, default=1e9)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--counters", type=int, default=None, help="the counting step's tasks (default: --parallelism)")
    opts = parser.parse_args(args)
    keys = opts.keys
    pipeline = Pipeline("state-bench", parallelism=opts.parallelism, config={"executors": opts.parallelism})
    (pipeline.source(RateSource(opts.rate, value_fn=lambda n: n * 7919 % keys), name="numbers")
        .group_by(lambda key: key, name="by_key", parallelism=opts.counters)
        .stateful_map(lambda count, key: ((count or 0) + 1, None), name="count")
        .sink(Discard(), name="discard"))
    return pipeline
