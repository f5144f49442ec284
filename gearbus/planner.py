"""The planner: a DSL Pipeline becomes a processor DAG (gearbus.Application), in passes
that each decide one thing and read alone:

1. ``check``: every step can run on the runner, and its settings are valid.
2. ``chain``: each step joins the processor of its input or starts one. Gearpump's merge
   rule, kept: a step joins its input's processor when that input has no other consumer,
   the step has one input, neither is a custom processor, and the edge needs no
   repartitioning.
3. ``connect``: each processor's input edges: hash-partitioned by key into what reads a
   ``group_by`` and into joins, forward (co-located, or round-robin between different
   parallelisms) otherwise.
4. ``place_operators``: each processor's chained operators, one per step.
5. ``key_join_inputs``: each join input keys its records at the end of its processor, or
   in a processor of its own when others read that input too.
6. ``combine_map_side``: a combinable aggregation over the global window gets a map-side
   combine before its hash edge, so keys cross the bus rarely.
7. ``size_streams``: each intermediate stream's name and partition count (Samza's rule).
8. ``run_at_senders``: stateless steps that could not chain run at their input's sender.

``stages`` then cuts the result at its intermediate streams.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gearbus.api.dsl import BasePipeline
from gearbus.api.graph import Application, Edge, Graph, GraphError, Processor
from gearbus.api.partitioners import (
    CoLocationPartitioner,
    HashPartitioner,
    IntermediateStream,
    Partitioner,
    ShufflePartitioner,
)
from gearbus.api.steps import (
    Aggregate,
    Filter,
    FlatMap,
    GroupBy,
    IntervalJoin,
    Join,
    KeyedStep,
    Map,
    MapAsync,
    Merge,
    Process,
    ProcessKeyed,
    Repartition,
    Sink,
    Source,
    StatefulMap,
    Step,
    TableJoin,
    WindowJoin,
    for_step,
)
from gearbus.api.task import DataSink
from gearbus.api.windows import GlobalWindows
from gearbus.control.config import AppConfig
from gearbus.runtime.async_map import AsyncMapOp
from gearbus.runtime.chain import (
    ChainedEdge,
    ChainSourceTask,
    ChainTask,
    CombineOp,
    FilterOp,
    FlatMapOp,
    KeyByOp,
    MapOp,
    Op,
    SinkOp,
    ValueOp,
    WindowAggregateOp,
)
from gearbus.runtime.joins import CoGroup, IntervalJoinOp, JoinInputOp, TableJoinOp, WindowJoinOp
from gearbus.runtime.keyed import KeyedProcessOp, StatefulMapOp
from gearbus.runtime.savepoints import stateful_steps
from gearbus.runtime.windows import WindowOperator

RUNNERS = ("test", "local", "cluster")
HASH_BY_KEY = functools.partial(HashPartitioner, by_key=True)
JOIN_SIDES = ("left", "right")


@dataclass(frozen=True, eq=False, kw_only=True)
class JoinInput(Step):
    """A processor the planner adds to key one input of a join that others read too."""

    kind = "join_input"


@dataclass(eq=False)
class Segment:
    """A processor being assembled: its steps and chained operators."""

    head: Step
    parallelism: int
    steps: list[Step] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    inputs: list[tuple[Segment, Partitioner]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "+".join(s.name for s in self.steps)


@dataclass
class Layout:
    """What the passes share: the pipeline's steps with their readers, and the processors
    so far, in order (a processor's id is its position)."""

    pipeline: BasePipeline
    config: AppConfig = field(init=False)  # the pipeline's, checked: a bad key or value fails the plan
    consumers: dict[Step, list[Step]] = field(init=False)
    segments: list[Segment] = field(default_factory=list)
    segment_of: dict[Step, Segment] = field(default_factory=dict)

    def __post_init__(self):
        self.config = AppConfig.parse(self.pipeline.config)
        self.consumers = {s: [] for s in self.pipeline.steps}
        for s in self.pipeline.steps:
            for i in s.inputs:
                self.consumers[i].append(s)


def plan(pipeline: BasePipeline, runner: str = "cluster", note: bool = True) -> Application:
    """Plan ``pipeline`` for ``runner``; every error names the step it is about. ``note``:
    say which stateful steps have fragile derived names (where the user builds it)."""
    layout = Layout(pipeline)  # the config first: a key the user mistyped, whatever the steps
    check(pipeline, runner)
    chain(layout)
    connect(layout)
    place_operators(layout)
    key_join_inputs(layout)
    combine_map_side(layout, layout.config.combine_keys)
    size_streams(layout)
    run_at_senders(layout.segments)
    app = _application(pipeline, layout.segments)
    stages(app)  # a stream inside one stage fails here, naming it
    if note:
        _note_fragile_state(pipeline, app)
    return app


def check(pipeline: BasePipeline, runner: str) -> None:
    """The pipeline has a source and an end; each step, in order, can run on ``runner`` and
    has valid window settings (the first error found is raised)."""
    if runner not in RUNNERS:
        raise GraphError(f"unknown runner {runner!r}; expected one of {', '.join(RUNNERS)}")
    steps = pipeline.steps
    if not any(isinstance(s, Source) for s in steps):
        raise GraphError(f"pipeline {pipeline.name!r} has no source")
    if not any(isinstance(s, (Sink, Process)) for s in steps):
        raise GraphError(f"pipeline {pipeline.name!r} has no sink: its results would go nowhere")
    for step in steps:
        _check_runner(step, runner)
        if isinstance(step, Aggregate):
            _make_window_operator(step)
        elif isinstance(step, WindowJoin):
            join_operator(step)


def _check_runner(step: Step, runner: str) -> None:
    """A source or sink that only some runners can run says so at plan time."""
    for connector in (getattr(step, key, None) for key in ("data_source", "data_sink", "late_sink")):
        supported = getattr(connector, "runners", None)
        if supported is not None and runner not in supported:
            raise GraphError(
                f"step {step.name!r} ({type(connector).__name__}) cannot run on the {runner} runner; "
                f"it runs on: {', '.join(sorted(supported))}"
            )


def _make_window_operator(step: Aggregate) -> WindowOperator:
    try:
        return WindowOperator(step.assigner, step.aggregator, step.trigger, step.accumulation,
                              step.allowed_lateness_ms, side_output_late=step.late_sink is not None)
    except (TypeError, ValueError) as exc:
        raise GraphError(f"step {step.name!r}: {exc}") from None


def chain(layout: Layout) -> None:
    """Pass 2: each step joins its input's processor or starts one (see the module's rule)."""
    pipeline, segment_of = layout.pipeline, layout.segment_of
    for step in pipeline.steps:
        upstream = segment_of[step.inputs[0]] if step.inputs else None
        if _chains_into(step, upstream, layout.consumers):
            segment = upstream
        else:
            segment = Segment(step, _parallelism(step, upstream, layout))
            layout.segments.append(segment)
        segment.steps.append(step)
        segment_of[step] = segment


def _chains_into(step: Step, upstream: Segment | None, consumers: dict[Step, list[Step]]) -> bool:
    """Whether ``step`` joins its one input's processor ``upstream``: steps that hold
    keyed state, merge, run custom code or read several consumers' input start their own."""
    return (
        upstream is not None
        and not isinstance(step, (Source, Aggregate, KeyedStep, Join, Merge, Process))
        and len(step.inputs) == 1
        and len(consumers[step.inputs[0]]) == 1
        and not isinstance(upstream.head, Process)
        and (isinstance(step, GroupBy) or step.parallelism in (None, upstream.parallelism))
    )


def _parallelism(step: Step, upstream: Segment | None, layout: Layout) -> int:
    """A new processor's parallelism: the step's own, else a source's 1, a keyed step's the
    pipeline's, a merge's the largest of its inputs', any other its input's."""
    if step.parallelism is not None:
        return step.parallelism
    if isinstance(step, Source):
        return 1
    if isinstance(step, (Aggregate, KeyedStep, Join)):
        return layout.pipeline.parallelism
    if isinstance(step, Merge):
        return max(layout.segment_of[i].parallelism for i in step.inputs)
    return upstream.parallelism


def connect(layout: Layout) -> None:
    """Pass 3: each processor's input edges, from its first step's inputs. What reads a
    group_by, and a join, gets its records hash-partitioned by key (through an
    intermediate stream for a ``repartition`` via jetstream, or for every such edge when
    the config says ``intermediate_streams: all``); anything else forward: each record
    stays in its task when the parallelisms match, round-robin otherwise."""
    every_shuffle = layout.config.intermediate_streams == "all"
    for segment in layout.segments:
        for side, input_step in enumerate(segment.head.inputs):
            upstream = layout.segment_of[input_step]
            if isinstance(segment.head, Join) or isinstance(input_step, GroupBy):
                via = input_step.via if isinstance(input_step, Repartition) else "jetstream" if every_shuffle else "bus"
                edge = _join_side(segment.head, side) if isinstance(segment.head, Join) else input_step.name
                partitioner = HASH_BY_KEY() if via == "bus" else IntermediateStream(
                    edge, getattr(input_step, "partitions", None) or 0)
            elif upstream.parallelism == segment.parallelism:
                partitioner = CoLocationPartitioner()
            else:
                partitioner = ShufflePartitioner()
            segment.inputs.append((upstream, partitioner))


def place_operators(layout: Layout) -> None:
    """Pass 4: each processor's operators, one per step that has one (a source reads, a
    merge unites and a custom processor runs its own Task)."""
    for segment in layout.segments:
        segment.ops = [op for op in map(_operator, segment.steps) if op is not None]


def key_join_inputs(layout: Layout) -> None:
    """Pass 5: each input of a join keys its records for the hash edge into the join: at
    the end of the input's own processor, unless others read that input too (a self-join,
    say) or it is a custom processor; then in a processor of its own, placed after the
    join's."""
    for join_segment in [s for s in layout.segments if isinstance(s.head, Join)]:
        join = join_segment.head
        after = layout.segments.index(join_segment) + 1
        for side, (input_step, key_fn) in enumerate(zip(join.inputs, join.keys)):
            upstream = layout.segment_of[input_step]
            key_op = JoinInputOp(join.name, side, key_fn)
            if len(layout.consumers[input_step]) == 1 and not isinstance(upstream.head, Process):
                upstream.ops.append(key_op)
                continue
            keying = Segment(JoinInput(name=_join_side(join, side), inputs=(input_step,)),
                              upstream.parallelism)
            keying.steps.append(keying.head)
            keying.inputs.append((upstream, CoLocationPartitioner()))
            keying.ops.append(key_op)
            layout.segments.insert(after, keying)
            after += 1
            join_segment.inputs[side] = (keying, join_segment.inputs[side][1])


def _join_side(join: Join, side: int) -> str:
    """The name of one input of ``join``: ``<join>.left`` or ``<join>.right``."""
    return f"{join.name}.{JOIN_SIDES[side]}"


def combine_map_side(layout: Layout, combine_keys: int) -> None:
    """Pass 6: an aggregation whose aggregator combines, over the global window, with no
    early trigger and no late sink (late records must be seen one by one), and the only
    reader of its group_by, gets a map-side combine: a CombineOp takes over the group_by's
    keying and the value steps chained before it, and the aggregation merges partials."""
    for segment in layout.segments:
        step = segment.head
        if not isinstance(step, Aggregate):
            continue
        grouped = step.inputs[0]
        if not (len(layout.consumers[grouped]) == 1 and getattr(step.aggregator, "combinable", False)
                and isinstance(step.assigner, GlobalWindows) and step.trigger is None and step.late_sink is None):
            continue
        key_segment = layout.segment_of[grouped]
        key_op = key_segment.ops.pop()
        value_ops: list[ValueOp] = []
        while key_segment.ops and type(key_segment.ops[-1]) in (MapOp, FlatMapOp, FilterOp):
            value_ops.insert(0, key_segment.ops.pop())
        key_segment.ops.append(CombineOp(grouped.name, key_op.fn, step.name, step.aggregator, combine_keys, value_ops))
        segment.ops[0] = _aggregate_operator(step, partial_input=True)


def size_streams(layout: Layout) -> None:
    """Pass 7: each intermediate stream's name (after the app and the edge) and partition
    count, by Samza's rule: the count asked for (``repartition(partitions=)``, else the
    config's ``intermediate_stream_partitions``), else the larger of the parallelisms on
    its two sides; the streams into one join share the largest of their counts, so both
    sides of a key land in partitions of the same number."""
    default = layout.config.intermediate_stream_partitions
    for segment in layout.segments:
        streams = [p for _, p in segment.inputs if isinstance(p, IntermediateStream)]
        for upstream, partitioner in segment.inputs:
            if isinstance(partitioner, IntermediateStream):
                partitioner.stream = stream_name(layout.pipeline.name, partitioner.edge)
                partitioner.partitions = (partitioner.partitions or default
                                          or max(upstream.parallelism, segment.parallelism))
        if isinstance(segment.head, Join) and streams:
            for partitioner in streams:
                partitioner.partitions = max(p.partitions for p in streams)


def stream_name(app: str, edge: str) -> str:
    """The JetStream stream of an app's edge: ``gearbus_<app>_<edge>``, each character
    that a stream name or subject token cannot hold as ``_``."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"gearbus_{app}_{edge}")


def _application(pipeline: BasePipeline, segments: list[Segment]) -> Application:
    graph = Graph()
    processors = {}
    for segment in segments:
        processors[segment] = _processor(segment)
        graph.add(processors[segment])
    for segment in segments:
        for upstream, partitioner in segment.inputs:
            graph.connect(processors[upstream], processors[segment], partitioner)
    return Application(pipeline.name, graph, dict(pipeline.config))


def edge_branches(partitioner: Partitioner) -> list[tuple[list[Op], Partitioner]]:
    """An edge's (ops run at the sender, partitioner) pairs."""
    return partitioner.branches if isinstance(partitioner, ChainedEdge) else [([], partitioner)]


def chained_edge(branches: list[tuple[list[Op], Partitioner]]) -> Partitioner:
    """One edge of these branches: the partitioner itself when it runs nothing at the sender."""
    return branches[0][1] if len(branches) == 1 and not branches[0][0] else ChainedEdge(branches)


def run_at_senders(segments: list[Segment]) -> None:
    """Pass 8: stateless steps that could not chain into their input's processor (several read
    that input, as when one stream is split by kind) run at that input's sender instead.
    A processor of nothing but such steps, read once and with one input of its own
    parallelism that keeps each record in its task, goes away: its input's sender runs its
    steps and routes for its reader. Any other processor with such an input hands its
    leading filters to that sender, so what they drop never crosses the bus."""
    while True:
        stage = next((s for s in segments if _stateless_stage(s, segments)), None)
        if stage is None:
            break
        (upstream, into), = stage.inputs
        reader, index = next((r, i) for r in segments for i, (u, _) in enumerate(r.inputs) if u is stage)
        out = reader.inputs[index][1]
        branches = [(ops + stage.ops + more, partitioner)
                    for ops, _ in edge_branches(into) for more, partitioner in edge_branches(out)]
        shared = next((i for i, (u, _) in enumerate(reader.inputs) if u is upstream), None)
        if shared is None:
            reader.inputs[index] = (upstream, chained_edge(branches))
        else:  # the reader reads that input already: one edge with both branches
            reader.inputs[shared] = (upstream, chained_edge(edge_branches(reader.inputs[shared][1]) + branches))
            del reader.inputs[index]
        segments.remove(stage)
    for segment in segments:
        if not isinstance(segment.head, Filter) or not _forward_input(segment):
            continue
        filters = []
        while segment.ops and type(segment.ops[0]) is FilterOp:
            filters.append(segment.ops.pop(0))
        upstream, into = segment.inputs[0]
        segment.inputs[0] = (upstream, chained_edge([(ops + filters, p) for ops, p in edge_branches(into)]))


STATELESS_OPS = (MapOp, FilterOp, FlatMapOp, KeyByOp, JoinInputOp)


def _stateless_stage(segment: Segment, segments: list[Segment]) -> bool:
    """Whether ``segment``'s steps can all run at its input's sender (see run_at_senders):
    read once, over one branch (its steps must run once per record, not once per branch)."""
    if isinstance(segment.head, (Source, Process)) or not _forward_input(segment):
        return False
    reads = [partitioner for r in segments for u, partitioner in r.inputs if u is segment]
    return (len(reads) == 1 and len(edge_branches(reads[0])) == 1
            and all(type(op) in STATELESS_OPS for op in segment.ops))


def _forward_input(segment: Segment) -> bool:
    """One input, of the segment's parallelism, each of whose records stays in its task:
    what its steps do there, they may do at that input's sender (the parallelism asked
    for a step is kept)."""
    if len(segment.inputs) != 1:
        return False
    upstream, into = segment.inputs[0]
    return (upstream.parallelism == segment.parallelism
            and all(type(p) is CoLocationPartitioner for _, p in edge_branches(into)))


_NOTED: set[tuple[str, tuple[str, ...]]] = set()  # what this process said already (it may plan an app again)


def fragile_state_steps(pipeline: BasePipeline, app: Application) -> list[Step]:
    """The stateful steps whose state a changed pipeline would give to another step or
    lose: savepoints and ``replace`` match state by step name, and a derived name depends
    on the other steps only where it shares its base (``count``, ``count_1``: adding or
    removing one renames the others; a derived ``count_1`` beside a step named ``count``).
    A derived name alone of its base is kept by every change but adding one more. A sink
    that keeps no state (not transactional: its snapshot is DataSink's) has none to lose."""
    stateful = {step for p in app.graph.processors for step in stateful_steps(p)}
    families: dict[str, list[Step]] = {}
    for step in pipeline.steps:
        if step.derived_from:
            families.setdefault(step.derived_from, []).append(step)
    return [s for family in families.values() for s in family
            if s.name in stateful and not _stateless_sink(s) and (len(family) > 1 or s.name != s.derived_from)]


def _stateless_sink(step: Step) -> bool:
    return isinstance(step, Sink) and type(step.data_sink).snapshot is DataSink.snapshot


def _note_fragile_state(pipeline: BasePipeline, app: Application) -> None:
    """One line on stderr, once per pipeline in a process: not an error, advice."""
    fragile = fragile_state_steps(pipeline, app)
    said = (pipeline.name, tuple(s.name for s in fragile))
    if not fragile or said in _NOTED:
        return
    _NOTED.add(said)
    steps = ", ".join(f"{s.name} ({s.defined_at})" if s.defined_at else s.name for s in fragile)
    print(f"gearbus: note: pipeline {pipeline.name!r}: the state of {steps} is kept under derived names, which "
          "change when a step deriving the same name is added or removed; give them name=... to keep it across "
          "a savepoint or a replace", file=sys.stderr)


def _aggregate_operator(step: Aggregate, partial_input: bool) -> WindowAggregateOp:
    """``partial_input``: its input is a map-side combine's partial aggregates."""
    return WindowAggregateOp(step.name, functools.partial(_make_window_operator, step), partial_input, step.late_sink)


def keyed_operator(step: KeyedStep) -> Op:
    """The operator of a keyed-state step (the Spark runner drives it too)."""
    if isinstance(step, StatefulMap):
        return StatefulMapOp(step.name, step.fn, step.ttl_ms)
    return KeyedProcessOp(step.name, step.function, step.ttl_ms)


def join_operator(step: Join) -> Op:
    """The operator of a join step (the Spark runner drives it too); bad window settings
    fail here, naming the step."""
    if isinstance(step, WindowJoin):
        make = functools.partial(WindowOperator, step.window, CoGroup())
        try:
            make()
        except (TypeError, ValueError) as exc:
            raise GraphError(f"step {step.name!r}: {exc}") from None
        return WindowJoinOp(step.name, make, step.how)
    if isinstance(step, IntervalJoin):
        return IntervalJoinOp(step.name, step.lower_ms, step.upper_ms)
    return TableJoinOp(step.name, step.as_of, step.ttl_ms, step.how, step.table_value)


_OPERATORS: dict[type[Step], Callable[[Any], Op]] = {
    Map: lambda s: MapOp(s.name, s.fn),
    MapAsync: lambda s: AsyncMapOp(s.name, s.fn, s.concurrency, s.ordered, s.timeout_ms, s.on_timeout),
    FlatMap: lambda s: FlatMapOp(s.name, s.fn),
    Filter: lambda s: FilterOp(s.name, s.fn),
    GroupBy: lambda s: KeyByOp(s.name, s.key_fn),
    Sink: lambda s: SinkOp(s.name, s.data_sink),
    Aggregate: functools.partial(_aggregate_operator, partial_input=False),
    StatefulMap: keyed_operator,
    ProcessKeyed: keyed_operator,
    WindowJoin: join_operator,
    IntervalJoin: join_operator,
    TableJoin: join_operator,
}


def _operator(step: Step) -> Op | None:
    """The chained operator of ``step``; sources, merges, custom processors and join
    inputs have none (their processor does their part)."""
    make = for_step(_OPERATORS, step)
    return make(step) if make is not None else None


def _processor(segment: Segment) -> Processor:
    head = segment.head
    if isinstance(head, Process):
        return Processor(head.task_class, segment.parallelism, head.name, head.config)
    config = {"ops": segment.ops, "steps": [s.name for s in segment.steps]}
    if isinstance(head, Source):
        config["timestamp_fn"] = head.timestamp_fn
        return Processor(ChainSourceTask, segment.parallelism, segment.name, config,
                         data_source=head.data_source, watermarks=head.watermarks)
    return Processor(ChainTask, segment.parallelism, segment.name, config)


def stages(app: Application) -> list[list[int]]:
    """The app's stages: its processors (ids) joined by bus edges, cut at intermediate
    streams, in the order of their first processor (one stage without streams). A stream
    whose two sides are joined over the bus too would not separate them: GraphError."""
    graph = app.graph
    parent = {p.id: p.id for p in graph.processors}

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i] = parent[parent[i]]
        return i

    for edge in graph.edges:
        through = {isinstance(p, IntermediateStream) for _, p in edge_branches(edge.partitioner)}
        if through == {True, False}:
            raise GraphError(f"processor {edge.downstream.name!r} reads {edge.upstream.name!r} both through an "
                             "intermediate stream and over the bus")
        if not through.pop():
            parent[root(edge.upstream.id)] = root(edge.downstream.id)
    for edge, stream in intermediate_streams(app):
        if root(edge.upstream.id) == root(edge.downstream.id):
            raise GraphError(f"intermediate stream {stream.stream!r}: {edge.upstream.name!r} and "
                             f"{edge.downstream.name!r} are joined over the bus as well, so it would not separate "
                             "two stages; make the other path an intermediate stream too, or use via='bus'")
    members: dict[int, list[int]] = {}
    for p in graph.processors:
        members.setdefault(root(p.id), []).append(p.id)
    return sorted(members.values())


def intermediate_streams(app: Application) -> list[tuple[Edge, IntermediateStream]]:
    """The app's intermediate streams, each with the edge it carries."""
    return [(edge, p) for edge in app.graph.edges for _, p in edge_branches(edge.partitioner)
            if isinstance(p, IntermediateStream)]


def describe(app: Application) -> dict:
    """The plan as JSON-able data (Samza's JobGraph JSON): processors with their steps,
    parallelism, task and the files they read and write, and the edges with their
    partitioners."""
    graph = app.graph
    processors = []
    for p in graph.processors:
        ops, files = p.config.get("ops", []), processor_files(p)
        processors.append({
            "id": p.id,
            "name": p.name,
            "parallelism": p.parallelism,
            "task": p.task_class.__qualname__,
            "steps": p.config.get("steps", [p.name]),
            "operators": [name for op in ops for name in _operator_names(op)],
            "combine": any(isinstance(op, CombineOp) for op in ops),
            **_join_description(graph, p),
            **({"files": files} if files else {}),
        })
    edges = [
        {"from": e.upstream.id, "to": e.downstream.id, "partitioner": e.partitioner.describe()}
        for e in graph.edges
    ]
    plan = {"name": app.name, "processors": processors, "edges": edges, "config": _jsonable(app.config)}
    streams = intermediate_streams(app)
    if streams:
        cut = stages(app)
        stage_of = {p: n for n, members in enumerate(cut) for p in members}
        for processor in processors:
            processor["stage"] = stage_of[processor["id"]]
        plan["stages"] = [{"stage": n, "processors": members} for n, members in enumerate(cut)]
        plan["streams"] = [{"name": s.stream, "subjects": s.subjects, "partitions": s.partitions, "edge": s.edge,
                            "from": e.upstream.id, "to": e.downstream.id, "from_stage": stage_of[e.upstream.id],
                            "to_stage": stage_of[e.downstream.id]} for e, s in streams]
    return plan


def processor_files(processor: Processor) -> dict[str, str]:
    """The files a processor's steps read or write (its connectors that have a ``path``), by
    step: the absolute paths every runner opens, whatever directory runs them."""
    steps = processor.config.get("steps") or [processor.name]
    connectors = [(steps[0], processor.data_source), (processor.name, processor.data_sink)]
    for op in processor.config.get("ops", []):
        connectors += [(sink.step, sink.data_sink) for sink in (op, getattr(op, "late", None))
                       if isinstance(sink, SinkOp)]
    return {step: connector.path for step, connector in connectors if isinstance(getattr(connector, "path", None), str)}


def _join_description(graph, processor: Processor) -> dict:
    """For a processor that starts with a join: which processors key its two sides, and
    that both reach its tasks hash-partitioned by the join key (co-partitioned)."""
    ops = processor.config.get("ops", [])
    if not ops or not isinstance(ops[0], (WindowJoinOp, IntervalJoinOp, TableJoinOp)):
        return {}
    sides = {}
    for edge in graph.inputs_of(processor):  # a side keyed in its processor, or at its sender
        at_sender = [op for branch, _ in edge_branches(edge.partitioner) for op in branch]
        for op in edge.upstream.config.get("ops", []) + at_sender:
            if isinstance(op, JoinInputOp) and op.step == ops[0].step:
                sides[JOIN_SIDES[op.side]] = edge.upstream.id
    return {"join": {"step": ops[0].step, "operator": type(ops[0]).__name__, **sides,
                     "co_partitioned": f"both sides hash-partitioned by the join key into {processor.parallelism} tasks"}}


def _operator_names(op: Op) -> list[str]:
    """An operator's name; a combine lists the value steps fused into it first."""
    return [type(v).__name__ for v in getattr(op, "value_ops", [])] + [type(op).__name__]


def _jsonable(config: dict) -> dict:
    return {k: v for k, v in config.items() if isinstance(v, (str, int, float, bool, type(None)))}
