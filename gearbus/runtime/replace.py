"""Replacing the code of one processor of a running app (Gearpump's dynamic DAG, with the
state it lacked), the rules every runner shares: whether a new version of the app may
replace the processor holding a step (the graph keeps its shape outside that processor),
which state the new code takes over (steps of the same name and kind) and which it drops,
and the plan the app runs once some processors run code of later versions. The state
machine (gearbus/runtime/appmaster_state.py) decides when: at a checkpoint, one change at
a time, rolled back if the new code fails before its first checkpoint."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from gearbus.api.graph import Application, Graph, Processor
from gearbus.api.partitioners import Partitioner
from gearbus.runtime.chain import ChainedEdge, ChainSourceTask, ChainTask
from gearbus.runtime.savepoints import join_task_state, split_task_state, stateful_steps
from gearbus.runtime.snapshots import TaskSnapshot


class ReplaceError(ValueError):
    """The replacement cannot be made as asked: the message says why; the app runs on."""


@dataclass(frozen=True)
class Replacement:
    """What replacing the processor holding ``step`` means: its id (kept), its name in the
    new version, the steps whose state the new code does not take over, and whether both
    versions keep the same state (stateful steps of the same names and kinds: either
    restores what the other stored)."""
    processor: int
    name: str
    dropped_state: tuple[str, ...]
    same_state: bool


def holding(plan: Application, step: str) -> Processor | None:
    """The processor of ``plan`` holding ``step`` (one of its steps, or its own name)."""
    return next((p for p in plan.graph.processors if step in (*p.config.get("steps", []), p.name)), None)


def step_kinds(processor: Processor) -> dict[str, str]:
    """Each stateful step of ``processor`` and the kind of state it keeps (its operator's,
    a source's connector's, a low-level task's class): state moves only to a step of the
    same name and kind."""
    task_class = processor.task_class
    if not issubclass(task_class, ChainTask):
        return {step: task_class.__qualname__ for step in stateful_steps(processor)}
    kinds = {op.step: type(op).__name__ for op in processor.config.get("ops", ())}
    if issubclass(task_class, ChainSourceTask):
        kinds[processor.config["steps"][0]] = f"source {type(processor.data_source).__name__}"
    return {step: kinds[step] for step in stateful_steps(processor)}


def check_replacement(running: Application, new: Application, step: str, drop_state: bool) -> Replacement:
    """Check that ``new`` (planned at any parallelism) may replace the processor of the
    ``running`` plan holding ``step``: the same processors (ids, names, tasks) and edges
    outside it, the same kind of task in it, and no state dropped unless ``drop_state``.
    Raises ReplaceError saying what differs."""
    old = holding(running, step)
    if old is None:
        steps = [s for p in running.graph.processors for s in (*p.config.get("steps", []), p.name)]
        raise ReplaceError(f"no step named {step!r} in the running app; its steps: {', '.join(dict.fromkeys(steps))}")
    replacement = holding(new, step)
    if replacement is None:
        raise ReplaceError(f"the new version has no step named {step!r}: it must keep the step it replaces")
    if replacement.id != old.id:
        raise ReplaceError(f"step {step!r} runs in processor {replacement.id} of the new version, not {old.id}: "
                           "the graph must keep its shape outside the replaced processor")
    differences = _shape_differences(running, new, old.id)
    if differences:
        raise ReplaceError("the new version's graph differs outside processor "
                           f"{old.name!r}: {'; '.join(differences)}")
    if replacement.task_class is not old.task_class and \
            replacement.task_class.__qualname__ != old.task_class.__qualname__:
        raise ReplaceError(f"processor {old.name!r} runs {old.task_class.__qualname__} tasks; the new version's "
                           f"runs {replacement.task_class.__qualname__}: a replacement keeps the kind of task")
    if old.is_source and old.config.get("steps", [None])[0] != replacement.config.get("steps", [None])[0]:
        raise ReplaceError(f"the source step {old.config['steps'][0]!r} must keep its name (it holds the read offsets)")
    before, after = step_kinds(old), step_kinds(replacement)
    dropped = tuple(s for s, kind in before.items() if after.get(s) != kind)
    if dropped and not drop_state:
        why = [f"{s!r} ({before[s]}" + (f", now {after[s]})" if s in after else ", gone)") for s in dropped]
        raise ReplaceError(f"the new code would drop the state of step(s) {', '.join(why)}: keep their names and "
                           "kinds, or pass --drop-state to start them empty")
    return Replacement(old.id, replacement.name, dropped, before == after)


def _shape_differences(running: Application, new: Application, replaced: int) -> list[str]:
    old_processors, new_processors = running.graph.processors, new.graph.processors
    if len(old_processors) != len(new_processors):
        return [f"{len(new_processors)} processors instead of {len(old_processors)}"]
    differences = [f"processor {o.id} is {n.name!r} ({n.task_class.__qualname__}), was {o.name!r} "
                   f"({o.task_class.__qualname__})"
                   for o, n in zip(old_processors, new_processors)
                   if o.id != replaced and (o.name, o.task_class.__qualname__) != (n.name, n.task_class.__qualname__)]
    old_edges, new_edges = _edges(running), _edges(new)
    if set(old_edges) != set(new_edges):
        return differences + [f"edges {sorted(new_edges)} instead of {sorted(old_edges)}"]
    for (a, b), (described, routing) in old_edges.items():
        new_described, new_routing = new_edges[(a, b)]
        if b == replaced and new_routing != routing:  # the steps run at its senders are the new code's
            differences.append(f"edge {a}->{b} routes by {', '.join(new_routing)}, was {', '.join(routing)}")
        elif b != replaced and new_described != described:
            differences.append(f"edge {a}->{b} is partitioned {new_described}, was {described}")
    return differences


def _edges(app: Application) -> dict[tuple[int, int], tuple[str, tuple[str, ...]]]:
    """Each edge's partitioner as described, and the kinds of partitioner it routes by."""
    return {(e.upstream.id, e.downstream.id): (e.partitioner.describe(), _routing(e.partitioner))
            for e in app.graph.edges}


def _routing(partitioner: Partitioner) -> tuple[str, ...]:
    branches = partitioner.branches if isinstance(partitioner, ChainedEdge) else [((), partitioner)]
    return tuple(type(p).__name__ for _, p in branches)


def compose(base: Application, versions: Mapping[int, Application]) -> Application:
    """The plan an app runs once processors (by id) run another version's code: each such
    processor, and the edges into it (what runs at their senders is its steps' code), from
    that version; everything else, and every parallelism, from ``base``."""
    if not versions:
        return base
    graph, copies = Graph(), {}
    for processor in base.graph.processors:
        source = versions[processor.id].graph.processors[processor.id] if processor.id in versions else processor
        copies[processor.id] = copied = copy.copy(source)
        copied.parallelism = processor.parallelism
        graph.add(copied)
    for edge in base.graph.edges:
        into = edge.downstream.id
        partitioner = edge.partitioner if into not in versions else next(
            e.partitioner for e in versions[into].graph.edges if (e.upstream.id, e.downstream.id) == (edge.upstream.id,
                                                                                                        into))
        graph.connect(copies[edge.upstream.id], copies[into], partitioner)
    return Application(base.name, graph, base.config)


def carried_over(processor: Processor, snapshot: TaskSnapshot, dropped: list[str] | tuple[str, ...]) -> TaskSnapshot:
    """A task's whole snapshot without the ``dropped`` steps' state, for a task of the new
    code (``processor``): a snapshot nothing builds on, so the task's next one is whole
    and holds only the steps it has."""
    state = snapshot.state
    if state is not None:
        state = join_task_state(processor, {step: value for step, value in split_task_state(processor, state).items()
                                            if step not in dropped})
    return dataclasses.replace(snapshot, state=state, epoch=None, base=None, depth=0, root=0)
