"""What one stage of a multi-stage app runs (Samza's jobs of one application).

The planner cuts an app at its intermediate streams into stages
(:func:`gearbus.planner.stages`); each stage runs as an application of its own, with its
own checkpoints and recoveries. :func:`stage_app` builds that application from the whole
plan: the stage's processors, each stream it feeds written by its upstream processor's
tasks (:class:`~gearbus.connectors.intermediate.StreamWriter`), each stream it reads read
by the tasks of the processor it feeds
(:class:`~gearbus.connectors.intermediate.StreamReader`), or, when the stream's
partitions are not a multiple of that processor's tasks (or it has other inputs too), by
a processor of one task per partition that hash-partitions into it over the bus.
"""

from __future__ import annotations

import copy

from gearbus.api.graph import Application, Edge, Graph, GraphError, Processor
from gearbus.api.partitioners import CoLocationPartitioner, HashPartitioner, IntermediateStream
from gearbus.connectors.intermediate import StreamReader, StreamWriter
from gearbus.control.config import AppConfig
from gearbus.planner import chained_edge, edge_branches, intermediate_streams, stages
from gearbus.runtime.chain import ChainSourceTask, ChainTask, StreamWriteOp
from shared.messages import IntermediateStreamSpec


def stage_count(app: Application) -> int:
    """1 without streams: stages() would count an app's unconnected pipelines apart."""
    return len(stages(app)) if intermediate_streams(app) else 1


def stage_app(app: Application, stage: int) -> Application:
    """The application stage ``stage`` of ``app`` runs (see the module); processors keep
    their names, and get ids of their own."""
    cut = stages(app)
    if not 0 <= stage < len(cut):
        raise GraphError(f"app {app.name!r} has {len(cut)} stage(s); there is no stage {stage}")
    members = set(cut[stage])
    graph = app.graph
    streams = intermediate_streams(app)
    max_bytes = AppConfig.parse(app.config).intermediate_stream_max_bytes
    copies: dict[int, Processor] = {}
    for p in graph.processors:
        if p.id in members:
            copies[p.id] = _copy(p)
    new_graph = Graph()
    for p in graph.processors:
        if p.id in members:
            into = [s for e, s in streams if e.downstream is p]
            if into and _reads_itself(graph, p, into):
                copies[p.id] = _reader(copies[p.id], into)
            new_graph.add(copies[p.id])
    for edge in graph.edges:
        up_in, down_in = edge.upstream.id in members, edge.downstream.id in members
        if not (up_in or down_in):
            continue
        bus = [(ops, p) for ops, p in edge_branches(edge.partitioner) if not isinstance(p, IntermediateStream)]
        for ops, stream in ((ops, p) for ops, p in edge_branches(edge.partitioner) if isinstance(p, IntermediateStream)):
            if up_in:
                _write(new_graph, copies[edge.upstream.id], graph, edge, ops,
                       StreamWriter(stream, max_bytes))
            elif copies[edge.downstream.id].data_source is None:
                reader = new_graph.add(Processor(ChainSourceTask, stream.partitions, f"{stream.stream} reader",
                                                 {"ops": [], "steps": [f"{stream.stream} reader"]},
                                                 data_source=StreamReader([stream])))
                new_graph.connect(reader, copies[edge.downstream.id], HashPartitioner(by_key=True))
        if bus and up_in and down_in:
            new_graph.connect(copies[edge.upstream.id], copies[edge.downstream.id], chained_edge(bus))
    return Application(app.name, new_graph, {**app.config, "stage": stage})


def _copy(processor: Processor) -> Processor:
    copied = copy.copy(processor)
    copied.config = dict(processor.config)
    copied.id = -1
    return copied


def _reads_itself(graph: Graph, processor: Processor, into: list[IntermediateStream]) -> bool:
    """Whether ``processor``'s own tasks read its streams: it runs chained steps, reads
    nothing else, and each stream's partitions fall to its tasks without sharing."""
    return (processor.task_class is ChainTask and len(graph.inputs_of(processor)) == len(into)
            and all(s.partitions % processor.parallelism == 0 for s in into))


def _reader(processor: Processor, into: list[IntermediateStream]) -> Processor:
    """``processor`` reading its streams itself: a source step of its own comes first (a
    source processor's first step names its source's state in snapshots)."""
    reading = f"{'+'.join(s.stream for s in into)} reader"
    return Processor(ChainSourceTask, processor.parallelism, processor.name,
                     {**processor.config, "steps": [reading, *processor.config["steps"]], "timestamp_fn": None},
                     data_source=StreamReader(into))


def _write(new_graph: Graph, upstream: Processor, graph: Graph, edge: Edge, ops: list, writer: StreamWriter) -> None:
    """``upstream``'s tasks write a stream at the end of their chain when that is all their
    output; else a writer processor of as many tasks, in the same places, does."""
    stream = writer.target
    write = StreamWriteOp(f"{stream.stream} writer", writer)
    only_output = len(graph.outputs_of(edge.upstream)) == 1 and len(edge_branches(edge.partitioner)) == 1
    if only_output and upstream.task_class in (ChainTask, ChainSourceTask):
        upstream.config["ops"] = [*upstream.config["ops"], *ops, write]
        return
    writer = new_graph.add(Processor(ChainTask, upstream.parallelism, f"{stream.stream} writer",
                                     {"ops": [*ops, write], "steps": [f"{stream.stream} writer"]}))
    new_graph.connect(upstream, writer, CoLocationPartitioner())


def stream_specs(app: Application) -> list[IntermediateStreamSpec]:
    """The app's intermediate streams, each with the stages it joins."""
    stage_of = {p: n for n, members in enumerate(stages(app)) for p in members}
    return [IntermediateStreamSpec(s.stream, s.partitions, s.edge, stage_of[e.upstream.id], stage_of[e.downstream.id])
            for e, s in intermediate_streams(app)]
