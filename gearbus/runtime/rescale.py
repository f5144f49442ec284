"""Rescaling a running app, the rules the runners share before its state machine takes a
request (gearbus/runtime/appmaster_state.py decides the rest: the range, one change at a
time, the checkpoint it goes on from): which processors the steps named hold, and whether
the plan at the new parallelism keeps the graph's rules. Chained steps run in one
processor, so they rescale together (`gearbus plan` shows which)."""

from __future__ import annotations

from collections.abc import Mapping

from gearbus.api.graph import Application, GraphError


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
    return asked
