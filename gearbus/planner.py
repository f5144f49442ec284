"""The planner: a DSL Pipeline becomes a processor DAG (gearbus.Application).

Gearpump's merge rule, kept: a step joins the processor of its input when that input
has no other consumer, the step has one input, neither is a custom processor, and the
edge needs no repartitioning. ``group_by`` computes keys at the end of the upstream
processor and becomes a hash edge; a combinable aggregation over the global window gets
a map-side combine before that edge, so keys cross the bus rarely.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field

from gearbus.api.dsl import BasePipeline, Step
from gearbus.api.graph import Application, Graph, GraphError, Processor
from gearbus.api.partitioners import CoLocationPartitioner, HashPartitioner, Partitioner, ShufflePartitioner
from gearbus.api.windows import GlobalWindows
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

DEFAULT_COMBINE_KEYS = 100_000
RUNNERS = ("test", "local", "cluster")


@dataclass(eq=False)
class _Segment:
    """A processor being assembled: its steps and chained operators."""

    head: Step
    parallelism: int
    steps: list[Step] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    inputs: list[tuple[_Segment, Partitioner]] = field(default_factory=list)
    processor: Processor | None = None

    @property
    def name(self) -> str:
        return "+".join(s.name for s in self.steps)


def _check_runner(step: Step, runner: str) -> None:
    """A source or sink that only some runners can run says so at plan time."""
    for key in ("data_source", "data_sink", "late_sink"):
        connector = step.params.get(key)
        supported = getattr(connector, "runners", None)
        if supported is not None and runner not in supported:
            raise GraphError(
                f"step {step.name!r} ({type(connector).__name__}) cannot run on the {runner} runner; "
                f"it runs on: {', '.join(sorted(supported))}"
            )


def _make_window_operator(step: Step) -> WindowOperator:
    p = step.params
    try:
        return WindowOperator(p["assigner"], p["aggregator"], p["trigger"], p["accumulation"],
                              p["allowed_lateness_ms"], side_output_late=p["late_sink"] is not None)
    except (TypeError, ValueError) as exc:
        raise GraphError(f"step {step.name!r}: {exc}") from None


def plan(pipeline: BasePipeline, runner: str = "cluster") -> Application:
    """Plan ``pipeline`` for ``runner``; every error names the step it is about."""
    if runner not in RUNNERS:
        raise GraphError(f"unknown runner {runner!r}; expected one of {', '.join(RUNNERS)}")
    steps = pipeline.steps
    if not any(s.kind == "source" for s in steps):
        raise GraphError(f"pipeline {pipeline.name!r} has no source")
    if not any(s.kind in ("sink", "process") for s in steps):
        raise GraphError(f"pipeline {pipeline.name!r} has no sink: its results would go nowhere")
    consumers: dict[Step, list[Step]] = {s: [] for s in steps}
    for s in steps:
        for i in s.inputs:
            consumers[i].append(s)
    combine_keys = int(pipeline.config.get("combine_keys", DEFAULT_COMBINE_KEYS))
    segment_of: dict[Step, _Segment] = {}
    segments: list[_Segment] = []

    def new_segment(step: Step, parallelism: int) -> _Segment:
        segment = _Segment(step, parallelism)
        segments.append(segment)
        return segment

    def forward(upstream: _Segment, parallelism: int) -> Partitioner:
        return CoLocationPartitioner() if upstream.parallelism == parallelism else ShufflePartitioner()

    def join_input(join: Step, side: int, input_step: Step, key_fn) -> _Segment:
        """The processor that keys one input of ``join`` for the hash edge into it: the
        input's own, unless others read that input too (a self-join, say); then a new one."""
        upstream = segment_of[input_step]
        key_op = JoinInputOp(join.name, side, key_fn)
        if len(consumers[input_step]) == 1 and upstream.head.kind != "process":
            upstream.ops.append(key_op)
            return upstream
        keying = new_segment(Step("join_input", f"{join.name}.{('left', 'right')[side]}", [input_step]),
                             upstream.parallelism)
        keying.steps.append(keying.head)
        keying.inputs.append((upstream, forward(upstream, upstream.parallelism)))
        keying.ops.append(key_op)
        return keying

    for step in steps:
        _check_runner(step, runner)
        upstream = segment_of.get(step.inputs[0]) if step.inputs else None
        chainable = (
            upstream is not None
            and len(step.inputs) == 1
            and len(consumers[step.inputs[0]]) == 1
            and upstream.head.kind != "process"
            and (step.kind == "group_by" or step.parallelism in (None, upstream.parallelism))
        )
        if step.kind == "source":
            segment = new_segment(step, step.parallelism or 1)
        elif step.kind == "aggregate":
            grouped = step.inputs[0]
            key_segment = segment_of[grouped]
            segment = new_segment(step, step.parallelism or pipeline.parallelism)
            params = step.params
            combinable = (
                len(consumers[grouped]) == 1
                and getattr(params["aggregator"], "combinable", False)
                and isinstance(params["assigner"], GlobalWindows)
                and params["trigger"] is None
                and params["late_sink"] is None  # late records must be seen one by one
            )
            if combinable:  # the combine takes over group_by's keying and the value steps before it
                key_op = key_segment.ops.pop()
                value_ops: list[ValueOp] = []
                while key_segment.ops and type(key_segment.ops[-1]) in (MapOp, FlatMapOp, FilterOp):
                    value_ops.insert(0, key_segment.ops.pop())
                key_segment.ops.append(CombineOp(grouped.name, key_op.fn, step.name, params["aggregator"],
                                                 combine_keys, value_ops))
            segment.inputs.append((key_segment, HashPartitioner(by_key=True)))
            _make_window_operator(step)  # invalid window settings fail now, naming the step
            segment.ops.append(WindowAggregateOp(step.name, functools.partial(_make_window_operator, step),
                                                 combinable, params["late_sink"]))
        elif step.kind == "keyed":
            segment = new_segment(step, step.parallelism or pipeline.parallelism)
            segment.inputs.append((segment_of[step.inputs[0]], HashPartitioner(by_key=True)))
            segment.ops.append(keyed_operator(step))
        elif step.kind == "join":
            segment = new_segment(step, step.parallelism or pipeline.parallelism)
            for side, (input_step, key_fn) in enumerate(zip(step.inputs, step.params["keys"])):
                segment.inputs.append((join_input(step, side, input_step, key_fn), HashPartitioner(by_key=True)))
            segment.ops.append(join_operator(step))
        elif step.kind in ("merge", "process") or not chainable:
            parallelism = step.parallelism or (
                max(segment_of[i].parallelism for i in step.inputs) if step.kind == "merge" else upstream.parallelism
            )
            segment = new_segment(step, parallelism)
            for i in step.inputs:  # a keyed process gets its keys' records through a hash edge
                segment.inputs.append((segment_of[i], HashPartitioner(by_key=True) if i.kind == "group_by"
                                       else forward(segment_of[i], parallelism)))
        else:
            segment = upstream
        segment.steps.append(step)
        segment_of[step] = segment
        op = _operator(step)
        if op is not None:
            segment.ops.append(op)

    _run_at_senders(segments)
    graph = Graph()
    for segment in segments:
        segment.processor = _processor(segment)
        graph.add(segment.processor)
    for segment in segments:
        for upstream, partitioner in segment.inputs:
            graph.connect(upstream.processor, segment.processor, partitioner)
    app = Application(pipeline.name, graph, dict(pipeline.config))
    _warn_unnamed_state(pipeline, app)
    return app


def _branches(partitioner: Partitioner) -> list[tuple[list[Op], Partitioner]]:
    """An edge's (ops run at the sender, partitioner) pairs."""
    return partitioner.branches if isinstance(partitioner, ChainedEdge) else [([], partitioner)]


def _edge(branches: list[tuple[list[Op], Partitioner]]) -> Partitioner:
    return branches[0][1] if len(branches) == 1 and not branches[0][0] else ChainedEdge(branches)


def _run_at_senders(segments: list[_Segment]) -> None:
    """Stateless steps that could not chain into their input's processor (several read
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
                    for ops, _ in _branches(into) for more, partitioner in _branches(out)]
        shared = next((i for i, (u, _) in enumerate(reader.inputs) if u is upstream), None)
        if shared is None:
            reader.inputs[index] = (upstream, _edge(branches))
        else:  # the reader reads that input already: one edge with both branches
            reader.inputs[shared] = (upstream, _edge(_branches(reader.inputs[shared][1]) + branches))
            del reader.inputs[index]
        segments.remove(stage)
    for segment in segments:
        if segment.head.kind != "filter" or not _forward_input(segment):
            continue
        filters = []
        while segment.ops and type(segment.ops[0]) is FilterOp:
            filters.append(segment.ops.pop(0))
        upstream, into = segment.inputs[0]
        segment.inputs[0] = (upstream, _edge([(ops + filters, p) for ops, p in _branches(into)]))


STATELESS_OPS = (MapOp, FilterOp, FlatMapOp, KeyByOp, JoinInputOp)


def _stateless_stage(segment: _Segment, segments: list[_Segment]) -> bool:
    """Whether ``segment``'s steps can all run at its input's sender (see _run_at_senders):
    read once, over one branch (its steps must run once per record, not once per branch)."""
    if segment.head.kind in ("source", "process") or not _forward_input(segment):
        return False
    reads = [partitioner for r in segments for u, partitioner in r.inputs if u is segment]
    return (len(reads) == 1 and len(_branches(reads[0])) == 1
            and all(type(op) in STATELESS_OPS for op in segment.ops))


def _forward_input(segment: _Segment) -> bool:
    """One input, of the segment's parallelism, each of whose records stays in its task:
    what its steps do there, they may do at that input's sender (the parallelism asked
    for a step is kept)."""
    if len(segment.inputs) != 1:
        return False
    upstream, into = segment.inputs[0]
    return (upstream.parallelism == segment.parallelism
            and all(type(p) is CoLocationPartitioner for _, p in _branches(into)))


class UnnamedStatefulStep(UserWarning):
    """A stateful step has a derived name, which a changed pipeline may not keep."""


def _warn_unnamed_state(pipeline: BasePipeline, app: Application) -> None:
    stateful = {step for p in app.graph.processors for step in stateful_steps(p)}
    unnamed = sorted(s.name for s in pipeline.steps if not s.named and s.name in stateful)
    if unnamed:
        warnings.warn(f"pipeline {pipeline.name!r}: stateful step(s) {', '.join(map(repr, unnamed))} have derived "
                      "names; savepoints match state by step name and derived names change when the pipeline "
                      "does: give them name=...", UnnamedStatefulStep, stacklevel=3)


def _operator(step: Step) -> Op | None:
    kind = step.kind
    if kind == "map":
        return MapOp(step.name, step.fn)
    if kind == "map_async":
        p = step.params
        return AsyncMapOp(step.name, step.fn, p["concurrency"], p["ordered"], p["timeout_ms"], p["on_timeout"])
    if kind == "flat_map":
        return FlatMapOp(step.name, step.fn)
    if kind == "filter":
        return FilterOp(step.name, step.fn)
    if kind == "group_by":
        return KeyByOp(step.name, step.fn)
    if kind == "sink":
        return SinkOp(step.name, step.params["data_sink"])
    return None  # sources, merges, custom processors and aggregates are placed by plan()


def keyed_operator(step: Step) -> Op:
    """The operator of a ``keyed`` step (the Spark runner drives it too)."""
    if step.params["variant"] == "stateful_map":
        return StatefulMapOp(step.name, step.fn, step.params["ttl_ms"])
    return KeyedProcessOp(step.name, step.params["function"], step.params["ttl_ms"])


def join_operator(step: Step) -> Op:
    """The operator of a ``join`` step (the Spark runner drives it too); bad window settings
    fail here, naming the step."""
    p = step.params
    if p["variant"] == "window":
        make = functools.partial(WindowOperator, p["window"], CoGroup())
        try:
            make()
        except (TypeError, ValueError) as exc:
            raise GraphError(f"step {step.name!r}: {exc}") from None
        return WindowJoinOp(step.name, make, p["how"])
    if p["variant"] == "interval":
        return IntervalJoinOp(step.name, p["lower_ms"], p["upper_ms"])
    return TableJoinOp(step.name, p["as_of"], p["ttl_ms"], p["how"], p["table_value"])


def _processor(segment: _Segment) -> Processor:
    head = segment.head
    names = [s.name for s in segment.steps]
    if head.kind == "process":
        return Processor(head.params["task_class"], segment.parallelism, head.name, head.params["config"])
    config = {"ops": segment.ops, "steps": names}
    if head.kind == "source":
        config["timestamp_fn"] = head.fn
        return Processor(ChainSourceTask, segment.parallelism, segment.name, config,
                         data_source=head.params["data_source"], watermarks=head.params["watermarks"])
    return Processor(ChainTask, segment.parallelism, segment.name, config)


def describe(app: Application) -> dict:
    """The plan as JSON-able data (Samza's JobGraph JSON): processors with their steps,
    parallelism and task, and the edges with their partitioners."""
    graph = app.graph
    processors = []
    for p in graph.processors:
        ops = p.config.get("ops", [])
        processors.append({
            "id": p.id,
            "name": p.name,
            "parallelism": p.parallelism,
            "task": p.task_class.__qualname__,
            "steps": p.config.get("steps", [p.name]),
            "operators": [name for op in ops for name in _operator_names(op)],
            "combine": any(isinstance(op, CombineOp) for op in ops),
            **_join_description(graph, p),
        })
    edges = [
        {"from": e.upstream.id, "to": e.downstream.id, "partitioner": e.partitioner.describe()}
        for e in graph.edges
    ]
    return {"name": app.name, "processors": processors, "edges": edges, "config": _jsonable(app.config)}


def _join_description(graph, processor: Processor) -> dict:
    """For a processor that starts with a join: which processors key its two sides, and
    that both reach its tasks hash-partitioned by the join key (co-partitioned)."""
    ops = processor.config.get("ops", [])
    if not ops or not isinstance(ops[0], (WindowJoinOp, IntervalJoinOp, TableJoinOp)):
        return {}
    sides = {}
    for edge in graph.inputs_of(processor):  # a side keyed in its processor, or at its sender
        at_sender = [op for branch, _ in _branches(edge.partitioner) for op in branch]
        for op in edge.upstream.config.get("ops", []) + at_sender:
            if isinstance(op, JoinInputOp) and op.step == ops[0].step:
                sides[("left", "right")[op.side]] = edge.upstream.id
    return {"join": {"step": ops[0].step, "operator": type(ops[0]).__name__, **sides,
                     "co_partitioned": f"both sides hash-partitioned by the join key into {processor.parallelism} tasks"}}


def _operator_names(op: Op) -> list[str]:
    """An operator's name; a combine lists the value steps fused into it first."""
    return [type(v).__name__ for v in getattr(op, "value_ops", [])] + [type(op).__name__]


def _jsonable(config: dict) -> dict:
    return {k: v for k, v in config.items() if isinstance(v, (str, int, float, bool, type(None)))}
