"""Rescaling a running app, the rules the runners share before its state machine takes a
request (gearbus/runtime/appmaster_state.py decides the rest: the range, one change at a
time, the checkpoint it goes on from): which processors the steps named hold, whether
the plan at the new parallelism keeps the graph's rules, and whether their state can be
divided (the new tasks divide it as they restore, after the app has moved on: what cannot
be is refused before). Chained steps run in one processor, so they rescale together
(`gearbus plan` shows which)."""

from __future__ import annotations

from collections.abc import Mapping

from gearbus.api.graph import Application, GraphError, Processor
from gearbus.api.io_tasks import DataSinkTask, DataSourceTask
from gearbus.api.task import DataSink, DataSource, Task
from gearbus.runtime.chain import ChainTask, Op


class RescaleError(ValueError):
    """The request names no step, or cannot be carried out as asked: the message says why."""


def processors_of(plan: Application, steps: Mapping[str, int]) -> dict[int, int]:
    """``{processor id: parallelism}`` for ``{step: parallelism}`` against the running
    ``plan`` (a processor's name, as ``gearbus plan`` and the dashboard show it, names it
    too). Raises RescaleError naming unknown steps, steps of one processor asked at
    different parallelisms, and a graph rule the new plan breaks (an edge that needs equal
    parallelism on both sides)."""
    if not steps:
        raise RescaleError("name at least one step and its parallelism, STEP=N")
    holding = {name: processor for processor in plan.graph.processors  # its steps, and its own name
               for name in [*processor.config.get("steps", []), processor.name]}
    unknown = [step for step in steps if step not in holding]
    if unknown:
        raise RescaleError(f"no step named {', '.join(map(repr, unknown))}; the steps: {', '.join(holding)}")
    asked: dict[int, int] = {}
    for step, parallelism in steps.items():
        if not isinstance(parallelism, int) or isinstance(parallelism, bool):
            raise RescaleError(f"step {step!r}: the parallelism must be an integer, got {parallelism!r}")
        processor = holding[step]
        if asked.setdefault(processor.id, parallelism) != parallelism:
            chained = [s for s, p in holding.items() if p is processor]
            raise RescaleError(f"steps {', '.join(map(repr, chained))} run chained in processor {processor.name!r} "
                               f"and rescale together: ask one parallelism for them")
    try:
        plan.with_parallelism({p: n for p, n in asked.items() if n >= 1})
    except GraphError as exc:
        raise RescaleError(str(exc)) from None
    processors = plan.graph.processors
    undivided = [what for p, n in asked.items() if n != processors[p].parallelism
                 for what in undividable(processors[p])]
    if undivided:
        raise RescaleError(f"{', '.join(undivided)} may hold state that is not grouped by key, and whose class does "
                           "not say how to divide it: it cannot be divided over another number of tasks")
    return asked


def undividable(processor: Processor) -> list[str]:
    """What in ``processor`` keeps state (its class snapshots) that its class does not
    divide over another number of tasks (no ``rescale``): a step, a source, a sink, a task."""
    task_class, found = processor.task_class, []
    if processor.data_source is not None and _undivided(processor.data_source, DataSource):
        found.append(f"source {type(processor.data_source).__name__}")
    if issubclass(task_class, ChainTask):
        for op in processor.config.get("ops", ()):
            if _undivided(op, Op):
                found.append(f"step {op.step!r}")
            found += [f"sink {type(sink).__name__} of step {op.step!r}" for sink in op.data_sinks()
                      if _undivided(sink, DataSink)]
    elif issubclass(task_class, DataSinkTask):
        found += [f"sink {type(processor.data_sink).__name__}"] if _undivided(processor.data_sink, DataSink) else []
    elif not issubclass(task_class, DataSourceTask) and task_class.snapshot is not Task.snapshot:
        found.append(f"task {task_class.__name__}")
    return found


def _undivided(holder, base: type) -> bool:
    return type(holder).snapshot is not base.snapshot and type(holder).rescale is base.rescale
