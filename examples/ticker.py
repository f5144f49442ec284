"""An unbounded pipeline for fail-over tests and demos: consecutive integers at a steady
rate, a map on another processor, and a JSON Lines sink.

    gearbus run examples/ticker.py --output ticks.jsonl [--rate 100] [--count N]

Writes ``{"n": n, "ts": epoch_ms}`` per number (``ts`` when it was generated), flushed
as it arrives. Runs forever unless ``--count`` is given.
"""

from __future__ import annotations

import argparse

from gearbus import Pipeline
from gearbus.api.task import now_ms
from gearbus.connectors.generator import RateSource


def tick(n: int) -> dict:
    return {"n": n, "ts": now_ms()}


def application(args: list[str]) -> Pipeline:
    parser = argparse.ArgumentParser(prog="ticker")
    parser.add_argument("--output", required=True, help="JSON Lines file to write ticks to")
    parser.add_argument("--rate", type=float, default=100, help="numbers per second (default 100)")
    parser.add_argument("--count", type=int, default=None, help="stop after this many (default: never)")
    opts = parser.parse_args(args)
    if opts.rate <= 0:
        parser.error("--rate must be positive")
    pipeline = Pipeline("ticker", config={"executors": 2})
    (pipeline.source(RateSource(opts.rate, opts.count), name="numbers")
        .map(tick, name="stamp", parallelism=2)
        .write_jsonl(opts.output, name="write"))
    return pipeline
