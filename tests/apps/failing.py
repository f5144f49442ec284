"""A test app whose task raises on a particular record."""

from gearbus import Application, CollectionSource, Graph, Processor, Task


class Picky(Task):
    def on_next(self, record):
        if record.value == 42:
            raise ValueError(f"cannot handle record {record.value}")


def application(args):
    graph = Graph()
    graph.connect(Processor.source(CollectionSource(range(100)), name="numbers"), Processor(Picky, name="picky"))
    return Application("failing", graph)
