"""The latency benchmark's pipeline: a generator, a forwarding task on a second
executor and a sink on a third, so every event makes two hops over NATS.

    gearbus run bench/latency_app.py --rate 10000 --count 100000 --output DIR

Each event's value is the wall-clock time it was generated; the sink writes, per event,
the milliseconds from generation to the sink (one file per sink task).
"""

from __future__ import annotations

import argparse
import os
import time

from gearbus import DataSink, Pipeline, Task
from gearbus.connectors.generator import RateSource


def generated_at(n: int) -> float:
    return time.time()


class Forward(Task):
    def on_batch(self, records):
        self.output.extend(records)


class LatencySink(DataSink):
    def __init__(self, directory: str):
        self.directory = directory

    def open(self, context):
        self.file = open(os.path.join(self.directory, f"latency-{context.index}.txt"), "w")

    def write(self, records):
        now = time.time()
        self.file.write("".join(f"{(now - r.value) * 1000:.3f}\n" for r in records))

    def close(self):
        self.file.close()


def application(args: list[str]) -> Pipeline:
    parser = argparse.ArgumentParser(prog="latency_app")
    parser.add_argument("--rate", type=float, default=10_000)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--output", required=True, help="directory for the latency files")
    opts = parser.parse_args(args)
    os.makedirs(opts.output, exist_ok=True)
    pipeline = Pipeline("latency", config={"executors": 3, "task_placement": "round_robin"})
    (pipeline.source(RateSource(opts.rate, opts.count, generated_at), name="generate")
        .process(Forward, name="forward")
        .sink(LatencySink(opts.output), name="measure"))
    return pipeline
