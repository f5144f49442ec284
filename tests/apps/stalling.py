"""A test app whose merge stalls: one source keeps sending, the other sent one record
at event time 0 and went idle, so the merged watermark cannot move."""

import time

from gearbus import DataSource, Pipeline, Record, Task
from gearbus.api.task import now_ms


class Ticks(DataSource):
    def open(self, context):
        self.last = 0.0

    def read(self, max_records):
        if time.monotonic() - self.last < 0.01:
            return []
        self.last = time.monotonic()
        return [Record("tick", now_ms())]


class Once(DataSource):
    def open(self, context):
        self.sent = False

    def read(self, max_records):
        if self.sent:
            return []
        self.sent = True
        return [Record("once", 0)]


class Discard(Task):
    def on_next(self, record):
        pass


def zero(value):
    return 0


def application(args):
    pipeline = Pipeline("stalling", config={"stall_timeout_s": 1, "executors": 2})
    busy = pipeline.source(Ticks(), name="busy")
    idle = pipeline.source(Once(), name="idle", timestamp_fn=zero)
    busy.merge(idle, name="merge").process(Discard, name="discard")
    return pipeline
