"""Graph validation fails early and names the processor."""

import pytest

from gearbus import (Application, CoLocationPartitioner, CollectionSource, Graph, GraphError, Processor,
                     ShufflePartitioner, Task)


class Noop(Task):
    def on_next(self, record):
        pass


def source(name="src", parallelism=1):
    return Processor.source(CollectionSource([1]), parallelism=parallelism, name=name)


def test_processors_are_numbered_in_topological_order():
    graph = Graph()
    a, b = Processor(Noop, name="b"), source("a")
    graph.add(a)
    graph.connect(b, a)
    graph.freeze()
    assert (b.id, a.id) == (0, 1)


def test_duplicate_names_are_refused():
    graph = Graph()
    graph.add(source("x"))
    with pytest.raises(GraphError, match="duplicate processor name 'x'"):
        graph.add(source("x"))


def test_cycles_are_refused():
    graph = Graph()
    s, a, b = source(), Processor(Noop, name="a"), Processor(Noop, name="b")
    graph.connect(s, a)
    graph.connect(a, b)
    graph.connect(b, a)
    with pytest.raises(GraphError, match="cycle"):
        Application("app", graph)


def test_colocation_needs_equal_parallelism():
    graph = Graph()
    graph.connect(source(parallelism=2), Processor(Noop, parallelism=3, name="n"), CoLocationPartitioner())
    with pytest.raises(GraphError, match="equal parallelism, got 2 and 3"):
        graph.freeze()


def test_a_hash_partitioned_processor_has_at_most_one_task_per_key_group():
    graph = Graph()
    graph.connect(source(), Processor(Noop, parallelism=128, name="most"))
    graph.connect(source("other"), Processor(Noop, parallelism=129, name="spread"), ShufflePartitioner())
    graph.freeze()
    graph = Graph()
    graph.connect(source(), Processor(Noop, parallelism=129, name="keyed"))
    with pytest.raises(GraphError, match="'keyed': parallelism 129 is more than its 128 key groups"):
        graph.freeze()


def test_a_processor_without_input_must_be_a_source():
    graph = Graph()
    graph.add(Processor(Noop, name="orphan"))
    with pytest.raises(GraphError, match="'orphan' has no input"):
        graph.freeze()


def test_the_digest_changes_with_the_graph():
    def build(parallelism):
        graph = Graph()
        graph.connect(source(), Processor(Noop, parallelism=parallelism, name="n"))
        return graph.digest()

    assert build(2) == build(2) != build(3)
