"""A test app that never ends by itself: a source emitting a counter, a slow sink."""

from gearbus import Application, DataSource, Graph, Processor, Record, Task
from gearbus.api.task import now_ms


class Counter(DataSource):
    def open(self, context):
        self.n = 0

    def read(self, max_records):
        self.n += 1
        return [Record(self.n, now_ms())] if self.n % 100 else []


class Discard(Task):
    def on_next(self, record):
        pass


def application(args):
    graph = Graph()
    graph.connect(Processor.source(Counter(), name="count"), Processor(Discard, name="discard"))
    return Application("endless", graph, config={"executors": 2})
