"""A test application shipped as a package: its task lives in a submodule."""

from gearbus import Application, CollectionSource, Graph, JsonLinesSink, Processor

from .stages import Square


def application(args):
    graph = Graph()
    numbers = Processor.source(CollectionSource(range(int(args[1]))), parallelism=2, name="numbers")
    square = Processor(Square, parallelism=2, name="square")
    graph.connect(numbers, square)
    graph.connect(square, Processor.sink(JsonLinesSink(args[0]), name="write"))
    return Application("squares", graph)
