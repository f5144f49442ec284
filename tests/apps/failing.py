"""A test app whose task raises on a particular record (args: [FAIL_AT [COUNT]], default 42 of 100)."""

from gearbus import Application, CollectionSource, Graph, Processor, Task


class Picky(Task):
    def on_next(self, record):
        if record.value == self.context.processor.config["fail_at"]:
            raise ValueError(f"cannot handle record {record.value}")


def application(args):
    fail_at = int(args[0]) if args else 42
    count = int(args[1]) if len(args) > 1 else 100
    graph = Graph()
    graph.connect(Processor.source(CollectionSource(range(count)), name="numbers"),
                  Processor(Picky, name="picky", config={"fail_at": fail_at}))
    return Application("failing", graph)
