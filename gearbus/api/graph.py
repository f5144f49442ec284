"""The low-level application model (Gearpump's): a DAG of Processors joined by
partitioners, wrapped in an Application."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gearbus.api.io_tasks import DataSinkTask, DataSourceTask
from gearbus.api.partitioners import MAX_PARALLELISM, HashPartitioner, Partitioner
from gearbus.api.task import DataSink, DataSource, Task
from gearbus.api.watermarks import WatermarkGenerator


class GraphError(ValueError):
    """The application graph is not valid; the message names the processor."""


class Processor:
    """A stage of the DAG: a task class run as ``parallelism`` tasks.

    Use :meth:`source` / :meth:`sink` for processors backed by a DataSource / DataSink.
    """

    def __init__(
        self,
        task_class: type[Task],
        parallelism: int = 1,
        name: str | None = None,
        config: dict[str, Any] | None = None,
        *,
        data_source: DataSource | None = None,
        data_sink: DataSink | None = None,
        watermarks: WatermarkGenerator | None = None,
    ):
        if not (isinstance(task_class, type) and issubclass(task_class, Task)):
            raise GraphError(f"processor {name or task_class!r}: task_class must be a gearbus Task subclass")
        if not isinstance(parallelism, int) or parallelism < 1:
            raise GraphError(f"processor {name or task_class.__name__}: parallelism must be an integer >= 1")
        self.task_class = task_class
        self.parallelism = parallelism
        self.name = name or task_class.__name__
        self.config = dict(config or {})
        self.data_source = data_source
        self.data_sink = data_sink
        self.watermarks = watermarks
        self.id = -1  # set by Graph.freeze(): topological position

    @classmethod
    def source(cls, data_source: DataSource, parallelism: int = 1, name: str | None = None,
               watermarks: WatermarkGenerator | None = None, **config):
        """A source processor; ``watermarks`` defaults to in-order event time
        (BoundedOutOfOrderness(0))."""
        return cls(DataSourceTask, parallelism, name or type(data_source).__name__, config, data_source=data_source,
                   watermarks=watermarks)

    @classmethod
    def sink(cls, data_sink: DataSink, parallelism: int = 1, name: str | None = None, **config):
        return cls(DataSinkTask, parallelism, name or type(data_sink).__name__, config, data_sink=data_sink)

    @property
    def is_source(self) -> bool:
        return self.data_source is not None

    def __repr__(self) -> str:
        return f"Processor({self.name!r}, parallelism={self.parallelism})"


@dataclass
class Edge:
    upstream: Processor
    downstream: Processor
    partitioner: Partitioner


class Graph:
    """Processors and the partitioned edges between them."""

    def __init__(self):
        self.processors: list[Processor] = []
        self.edges: list[Edge] = []
        self._frozen = False

    def add(self, processor: Processor) -> Processor:
        if self._frozen:
            raise GraphError("the graph is frozen; build a new one")
        if any(p is processor for p in self.processors):
            return processor
        if any(p.name == processor.name for p in self.processors):
            raise GraphError(f"duplicate processor name {processor.name!r}: every processor needs a unique name")
        self.processors.append(processor)
        return processor

    def connect(self, upstream: Processor, downstream: Processor, partitioner: Partitioner | None = None) -> Processor:
        """Add an edge ``upstream -> downstream`` (hash partitioned by default)."""
        self.add(upstream)
        self.add(downstream)
        partitioner = partitioner or HashPartitioner()
        if not isinstance(partitioner, Partitioner):
            raise GraphError(f"edge {upstream.name} -> {downstream.name}: {partitioner!r} is not a Partitioner")
        if downstream.is_source:
            raise GraphError(f"processor {downstream.name!r} is a source and cannot have inputs")
        self.edges.append(Edge(upstream, downstream, partitioner))
        return downstream

    def freeze(self) -> Graph:
        """Validate the DAG and number processors in topological order."""
        if self._frozen:
            return self
        if not self.processors:
            raise GraphError("the graph has no processors")
        inputs = {id(p): [] for p in self.processors}
        outputs = {id(p): [] for p in self.processors}
        for edge in self.edges:
            inputs[id(edge.downstream)].append(edge)
            outputs[id(edge.upstream)].append(edge)
            if edge.partitioner.requires_equal_parallelism and edge.upstream.parallelism != edge.downstream.parallelism:
                raise GraphError(
                    f"edge {edge.upstream.name} -> {edge.downstream.name}: {edge.partitioner.describe()} needs "
                    f"equal parallelism, got {edge.upstream.parallelism} and {edge.downstream.parallelism}"
                )
            if isinstance(edge.partitioner, HashPartitioner) and edge.downstream.parallelism > MAX_PARALLELISM:
                raise GraphError(
                    f"processor {edge.downstream.name!r}: parallelism {edge.downstream.parallelism} is more than its "
                    f"{MAX_PARALLELISM} key groups; a hash-partitioned processor can have at most {MAX_PARALLELISM} tasks"
                )
        for p in self.processors:
            if not p.is_source and not inputs[id(p)]:
                raise GraphError(f"processor {p.name!r} has no input and is not a source")
        order, state = [], {}

        def visit(p: Processor, path: list[str]) -> None:
            mark = state.get(id(p))
            if mark == "done":
                return
            if mark == "visiting":
                raise GraphError(f"the graph has a cycle: {' -> '.join(path + [p.name])}")
            state[id(p)] = "visiting"
            for edge in inputs[id(p)]:
                visit(edge.upstream, path + [p.name])
            state[id(p)] = "done"
            order.append(p)

        for p in self.processors:
            visit(p, [])
        for pid, p in enumerate(order):
            p.id = pid
        self.processors = order
        self._frozen = True
        return self

    def inputs_of(self, processor: Processor) -> list[Edge]:
        return [e for e in self.edges if e.downstream is processor]

    def outputs_of(self, processor: Processor) -> list[Edge]:
        return [e for e in self.edges if e.upstream is processor]

    def describe(self) -> dict:
        """A JSON-able description: what the AppMaster and executors must agree on."""
        self.freeze()
        return {
            "processors": [
                {"id": p.id, "name": p.name, "parallelism": p.parallelism, "task": p.task_class.__qualname__}
                for p in self.processors
            ],
            "edges": [
                {"from": e.upstream.id, "to": e.downstream.id, "partitioner": e.partitioner.describe()}
                for e in self.edges
            ],
        }

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.describe(), sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Application:
    """A named graph plus application config: the keys of
    :class:`gearbus.control.config.AppConfig` (docs/operations.md lists them), checked
    when the app is built to run and when it is submitted."""

    name: str
    graph: Graph
    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.graph, Graph):
            raise GraphError(f"application {self.name!r}: graph must be a gearbus Graph")
        self.graph.freeze()

    def with_parallelism(self, parallelism: Mapping[int, int]) -> Application:
        """This application with some processors (by id) at another parallelism: a rescaled
        plan (same processors, ids and edges). Raises GraphError when that breaks a rule of
        the graph (an edge that needs equal parallelism, more tasks than key groups)."""
        if not parallelism:
            return self
        graph, copies = Graph(), {}
        for processor in self.graph.processors:
            copies[id(processor)] = copied = copy.copy(processor)
            copied.parallelism = parallelism.get(processor.id, processor.parallelism)
            graph.add(copied)
        for edge in self.graph.edges:
            graph.connect(copies[id(edge.upstream)], copies[id(edge.downstream)], edge.partitioner)
        return Application(self.name, graph, self.config)
