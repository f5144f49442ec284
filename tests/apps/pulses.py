"""A task that speaks without input: numbers arrive at --rate for --count; a Pulse task
writes how many it has seen every --every-ms of processing time (its wakeups), and the
total at the end."""

from __future__ import annotations

import argparse

from gearbus import Pipeline, Task
from gearbus.connectors.generator import RateSource


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
    parser.add_argument("--count", type=int, default=60)
    parser.add_argument("--every-ms", type=int, default=200)
    opts = parser.parse_args(args)
    pipeline = Pipeline("pulses", config={"executors": 1})
    (pipeline.source(RateSource(opts.rate, opts.count), name="numbers")
        .process(Pulse, name="pulse", every_ms=opts.every_ms)
        .write_jsonl(opts.output, name="write"))
    return pipeline
