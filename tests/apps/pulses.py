"""A task that speaks without input: numbers trickle in at --rate for --count from when
the source task starts; a Pulse task writes how many it has seen every --every-ms of
processing time (its wakeups), and the total at the end."""

from __future__ import annotations

import argparse
import time

from gearbus import DataSource, Pipeline, Record, Task


class Trickle(DataSource):
    """0, 1, 2, ... up to ``count``, each due ``n / rate`` s after the task opened it (not
    after the app started, so a slow start does not make them all due at once)."""

    def __init__(self, rate: float, count: int):
        self.rate, self.count = rate, count

    def open(self, context):
        self.started, self.next = time.monotonic(), 0

    def read(self, max_records):
        if self.next >= self.count:
            return None
        due = min(int((time.monotonic() - self.started) * self.rate) + 1, self.count, self.next + max_records)
        batch = [Record(n, 0) for n in range(self.next, due)]
        self.next = due
        return batch


class Pulse(Task):
    def on_start(self):
        self.every_ms = self.context.config["every_ms"]
        self.seen, self.due = 0, None

    def on_batch(self, records):
        self.seen += len(records)
        if self.due is None:
            self.due = self.context.now_ms() + self.every_ms

    def next_wakeup_ms(self):
        return self.due

    def on_wakeup(self, now_ms):
        self.due = now_ms + self.every_ms
        self.emit({"pulse": self.seen})

    def on_end(self):
        self.emit({"end": self.seen})


def application(args: list[str]) -> Pipeline:
    parser = argparse.ArgumentParser(prog="pulses")
    parser.add_argument("--output", required=True)
    parser.add_argument("--rate", type=float, default=40)
    parser.add_argument("--count", type=int, default=80)
    parser.add_argument("--every-ms", type=int, default=100)
    opts = parser.parse_args(args)
    pipeline = Pipeline("pulses", config={"executors": 1})
    (pipeline.source(Trickle(opts.rate, opts.count), name="numbers")
        .process(Pulse, name="pulse", every_ms=opts.every_ms)
        .write_jsonl(opts.output, name="write"))
    return pipeline
