"""The stages benchmark's pipeline: a keyed running count, over the bus in one stage or
through an intermediate stream in two (bench/stages.py runs both).

    gearbus run bench/stages_app.py --via jetstream --rate 5000 --count 100000 --output DIR

A generator (2 tasks) makes events ``(key, generated at)`` over ``--keys`` keys; they are
repartitioned by key (``--via bus``: a hash shuffle; ``jetstream``: an intermediate
stream, so two stages) into a running count per key (2 tasks), whose sink writes per
event the milliseconds from generation to the sink, per write its time and size, and per
task the time of its first and last write and the earliest generation time it saw. With
``--pause-file``, the counting waits while that file exists.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from gearbus import DataSink, Pipeline
from gearbus.connectors.generator import RateSource


class Event:
    """``(key, generated at)`` of event n, over ``keys`` keys."""

    def __init__(self, keys: int):
        self.keys = keys

    def __call__(self, n: int) -> tuple[str, float]:
        return f"k{n % self.keys}", time.time()


def key(event: tuple[str, float]) -> str:
    return event[0]


class RunningCount:
    """The count so far of the event's key; while ``pause_file`` exists (looked for every
    0.1 s), it waits: the stage stands still as behind a slow call, its processes alive."""

    def __init__(self, pause_file: str = ""):
        self.pause_file = pause_file
        self.look_at = 0.0

    def __call__(self, count, event):
        if self.pause_file and time.monotonic() >= self.look_at:
            while os.path.exists(self.pause_file):
                time.sleep(0.05)
            self.look_at = time.monotonic() + 0.1
        count = (count or 0) + 1
        return count, (event[0], count, event[1])


class LatencySink(DataSink):
    def __init__(self, directory: str):
        self.directory = directory

    def open(self, context):
        self.name = os.path.join(self.directory, f"sink-{context.index}")
        self.file = open(self.name + ".txt", "w")
        self.batches = open(self.name + ".batches", "w")  # per write: its time and its events
        self.first = self.last = 0.0
        self.born = float("inf")  # the earliest generation time of an event it wrote
        self.records = 0

    def write(self, records):
        now = time.time()
        self.first = self.first or now
        self.last = now
        self.records += len(records)
        self.born = min(self.born, min(r.value[2] for r in records))
        self.file.write("".join(f"{(now - r.value[2]) * 1000:.3f}\n" for r in records))
        self.batches.write(f"{now} {len(records)}\n")

    def close(self):
        self.file.close()
        self.batches.close()
        with open(self.name + ".json", "w") as f:
            json.dump({"first": self.first, "last": self.last, "born": self.born, "records": self.records}, f)


def application(args: list[str]) -> Pipeline:
    parser = argparse.ArgumentParser(prog="stages_app")
    parser.add_argument("--via", choices=("bus", "jetstream"), default="jetstream")
    parser.add_argument("--rate", type=float, default=5_000)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--output", required=True, help="directory for the sink's files")
    parser.add_argument("--pause-file", default="", help="the counting waits while this file exists")
    opts = parser.parse_args(args)
    os.makedirs(opts.output, exist_ok=True)
    pipeline = Pipeline(f"stages-{opts.via}", parallelism=2, config={"checkpoint_interval_ms": 1000})
    (pipeline.source(RateSource(opts.rate, opts.count, Event(opts.keys)), parallelism=2, name="events")
        .repartition(key, via=opts.via, name="by_key")
        .stateful_map(RunningCount(opts.pause_file), name="counts")
        .sink(LatencySink(opts.output), name="measure", parallelism=2))
    return pipeline
