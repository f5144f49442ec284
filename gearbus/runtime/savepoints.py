"""Savepoints: a checkpoint's state by step name, so a changed pipeline can take it over.

A task's snapshot is laid out by its processor (a chain of steps, a source with steps, a
sink, a custom task); planning may chain the same steps differently in another version
of the pipeline. A savepoint therefore keeps each stateful step's state on its own,
``{step: {task index: state}}``, and a new plan claims it step by step. Auto-derived
step names are fragile for this: they change when steps are added or reordered.

A step may be claimed at another parallelism: state grouped by key goes to the tasks
owning its key groups, and each step says how to divide the rest (``rescale``).
"""

from __future__ import annotations

import pickle
import threading
from dataclasses import asdict, dataclass
from typing import Any

from gearbus.api.graph import Application, Processor
from gearbus.api.partitioners import KEY_LAYOUT, owned_groups
from gearbus.api.io_tasks import DataSinkTask, DataSourceTask
from gearbus.api.task import NotRescalable, Task, not_rescalable
from gearbus.runtime.chain import ChainSourceTask, ChainTask, Op
from gearbus.runtime.keygroups import Delta, chain_onto, collector_paused
from gearbus.runtime.snapshots import TaskSnapshot


class SavepointMismatch(ValueError):
    """A savepoint's state does not fit the pipeline restored from it."""


@dataclass(frozen=True)
class SavepointRecord:
    """A savepoint's record, beside its states (one object per step and task index, in
    the object store of the app that took it): where it came from, and each stateful
    step's parallelism, which a new plan claims it by."""

    name: str
    app_id: int
    app_name: str
    checkpoint_id: int
    created_ms: int
    steps: dict[str, int]  # step -> parallelism
    layout: int = KEY_LAYOUT  # how keys mapped to the tasks that saved it (gearbus.api.partitioners)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for msgpack."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SavepointRecord:
        """The inverse of :meth:`to_dict`."""
        return cls(name=str(data["name"]), app_id=int(data["app_id"]), app_name=str(data["app_name"]),
                   checkpoint_id=int(data["checkpoint_id"]), created_ms=int(data["created_ms"]),
                   steps={str(step): int(n) for step, n in data["steps"].items()},
                   layout=int(data.get("layout", 1)))


def _ops(processor: Processor) -> list[Op]:
    return list(processor.config.get("ops", ()))


def stateful_steps(processor: Processor) -> list[str]:
    """The steps of a processor whose tasks keep state across a checkpoint."""
    task_class = processor.task_class
    steps = [op.step for op in _ops(processor) if type(op).snapshot is not Op.snapshot] \
        if issubclass(task_class, ChainTask) else []
    if issubclass(task_class, ChainSourceTask):
        return [processor.config["steps"][0], *steps]
    if issubclass(task_class, ChainTask):
        return steps
    if issubclass(task_class, (DataSourceTask, DataSinkTask)) or task_class.snapshot is not Task.snapshot:
        return [processor.name]
    return []


def split_task_state(processor: Processor, state: Any) -> dict[str, Any]:
    """A task's snapshot (``Task.snapshot()``) as ``{step: state}``."""
    task_class = processor.task_class
    if issubclass(task_class, ChainSourceTask):
        return {processor.config["steps"][0]: state["source"], **state["steps"]}
    if issubclass(task_class, ChainTask):
        return dict(state)
    return {} if state is None else {processor.name: state}


def join_task_state(processor: Processor, steps: dict[str, Any]) -> Any:
    """The inverse of :func:`split_task_state`, for a task of ``processor``."""
    task_class = processor.task_class
    if issubclass(task_class, ChainSourceTask):
        source = processor.config["steps"][0]
        return {"source": steps.get(source), "steps": {k: v for k, v in steps.items() if k != source}}
    if issubclass(task_class, ChainTask):
        return dict(steps)
    return steps.get(processor.name)


def whole_snapshot(processor: Processor, chain: list[TaskSnapshot], stop: threading.Event | None = None) -> TaskSnapshot:
    """The whole state a task's chain of snapshots adds up to (oldest first: a whole one,
    then each holding what changed since the one before), in the newest's envelope
    (``stop``: see :class:`gearbus.runtime.keygroups.ChainedGroups`)."""
    if len(chain) == 1:
        return chain[0]
    states: dict[str, list] = {}  # each step's last whole state (or None), then the deltas after it
    for envelope in chain:
        for step, state in split_task_state(processor, envelope.state).items():
            if isinstance(state, Delta):
                states.setdefault(step, [None]).append(state)
            else:
                states[step] = [state]
    steps = {step: chain_onto(whole, deltas, stop) if deltas else whole for step, (whole, *deltas) in states.items()}
    return chain[-1].whole(join_task_state(processor, steps))


def compacted(processor: Processor, chain: list[TaskSnapshot], stop: threading.Event | None = None) -> bytes:
    """What a compaction stores for a task: the whole state its chain adds up to, encoded
    as a snapshot that needs no other. Takes the chain (the list is left empty): what was
    read and built from it is freed before the collector runs again, which would otherwise
    go over every object made meanwhile that is still held (a seventh of a compaction's
    time at 5,000,000 keys). Raises Stopped soon after ``stop`` is set."""
    snapshots = chain[:]
    chain.clear()
    with collector_paused():
        data = whole_snapshot(processor, snapshots, stop).self_contained().encode()
        del snapshots
    return data


def rescaled_state(processor: Processor, step: str, states: list, index: int) -> Any:
    """Step ``step``'s state for task ``index`` of ``processor``, from ``states``: every
    task's state of the step in a savepoint taken with another parallelism. Raises
    SavepointMismatch when the step's state cannot be divided that way."""
    task_class, parallelism = processor.task_class, processor.parallelism
    try:
        if issubclass(task_class, ChainSourceTask) and step == processor.config["steps"][0] or \
                issubclass(task_class, DataSourceTask) and not issubclass(task_class, ChainTask):
            return _rescaled_source(processor, states, index)
        if issubclass(task_class, ChainTask):
            return next(op for op in _ops(processor) if op.step == step).rescale(states, index, parallelism)
        if issubclass(task_class, DataSinkTask):
            return processor.data_sink.rescale(states, index, parallelism)
        not_rescalable(states, f"task {task_class.__name__}")
        return None
    except NotRescalable as exc:
        raise SavepointMismatch(f"the parallelism of step {step!r} changed (saved with {len(states)}, now "
                                f"{processor.parallelism}): {exc}") from None


def _rescaled_source(processor: Processor, states: list, index: int) -> Any:
    """A source task's state (its source's position and its watermark generator's) for
    task ``index``: the positions divided by the source (:meth:`DataSource.rescale`), the
    generator at the lowest of the old tasks' (its watermark never runs ahead of theirs)."""
    present = [state for state in states if state is not None]
    if not present:
        return None
    source = processor.data_source.rescale([state["source"] for state in present], index, processor.parallelism)
    marks = [state["watermarks"] for state in present if state["watermarks"] is not None]
    if any(not isinstance(mark, int) for mark in marks):
        raise NotRescalable(f"the watermark generator {type(processor.watermarks).__name__} keeps a state "
                            "that cannot be divided")
    return {"source": source, "watermarks": min(marks, default=None)}


def savepoint_parts(processor: Processor, chain: list[TaskSnapshot]) -> dict[str, bytes]:
    """What a savepoint keeps of one task: each stateful step's whole state that the task's
    chain of snapshots adds up to, pickled; a step that holds nothing (a sink without
    transactions) as None, so that a pipeline restored from it finds every step it claims."""
    states = split_task_state(processor, whole_snapshot(processor, chain).state)
    return {step: pickle.dumps(states.get(step), pickle.HIGHEST_PROTOCOL)
            for step in dict.fromkeys([*states, *stateful_steps(processor)])}


def restored_from(processor: Processor, old_parallelism: int, index: int) -> list[int]:
    """The old tasks (of ``old_parallelism``) whose snapshots task ``index`` of
    ``processor`` restores its share from after a rescale: those that owned some of its
    key groups, when every stateful step holds its state by owner (``Op.state_by_owner``);
    every one otherwise (a source's positions, a sink's transactions, partials before a
    shuffle: their classes divide what all old tasks held)."""
    task_class, everyone = processor.task_class, list(range(old_parallelism))
    if not issubclass(task_class, ChainTask) or issubclass(task_class, ChainSourceTask):
        return everyone
    if not all(op.state_by_owner for op in _ops(processor) if type(op).snapshot is not Op.snapshot):
        return everyone
    groups = owned_groups(index, processor.parallelism)
    return [old for old in everyone
            if (held := owned_groups(old, old_parallelism)).start < groups.stop and groups.start < held.stop]


def rescaled_snapshot(processor: Processor, taken_at: int, old: dict[int, TaskSnapshot], index: int
                      ) -> TaskSnapshot:
    """Task ``index``'s snapshot at ``processor``'s parallelism (a rescale's new one), from
    ``old``: the whole snapshots of one checkpoint by the tasks of parallelism
    ``taken_at`` that it reads (:func:`restored_from`), by their index. Each step's state
    is divided as a savepoint's is (by key group, read as the task restores it); the
    watermark is the lowest, and the old tasks' local copies go with it. Nothing builds on
    it: the task's next snapshot is whole. Raises SavepointMismatch when a step's state
    cannot be divided."""
    read = list(old.values())
    saved: dict[str, list] = {}
    for at, envelope in old.items():
        for step, state in split_task_state(processor, envelope.state).items():
            saved.setdefault(step, [None] * taken_at)[at] = state
    steps = {step: rescaled_state(processor, step, states, index) for step, states in saved.items()}
    return TaskSnapshot(read[0].checkpoint_id, join_task_state(processor, steps) if steps else None,
                        all(envelope.ended for envelope in read), min(envelope.watermark for envelope in read),
                        copies=tuple(copy for envelope in read for copy in envelope.copies))


def task_states(processor: Processor, saved: dict[str, list], layout: int = KEY_LAYOUT) -> list[Any]:
    """Each task's state of ``processor`` (None: nothing to restore) from the steps it
    claimed, ``saved``: ``{step: [state of each saved task]}``, saved with keys mapped to
    tasks by ``layout``. A step saved with another parallelism is divided over the tasks
    (:func:`rescaled_state`); so is a keyed step saved with another layout (its keys are
    not where they now go), while any other goes to the task of its index."""
    tasks = []
    for index in range(processor.parallelism):
        steps = {step: _task_state(processor, step, states, index, layout) for step, states in saved.items()}
        tasks.append(join_task_state(processor, steps) if steps else None)
    return tasks


def _task_state(processor: Processor, step: str, states: list, index: int, layout: int) -> Any:
    if len(states) != processor.parallelism:
        return rescaled_state(processor, step, states, index)
    if layout != KEY_LAYOUT:
        try:
            return rescaled_state(processor, step, states, index)
        except SavepointMismatch:  # not keyed: by task index, as it was saved
            pass
    return states[index]


def claim(app: Application, saved: dict[str, int], allow_unclaimed: bool) -> dict[str, Processor]:
    """Match the savepoint's steps (``{step: parallelism}``) to the stateful steps of
    ``app``; return which processor claims each saved step (at its parallelism, or another:
    see :func:`rescaled_state`). Raises SavepointMismatch naming the steps when a stateful
    step finds no state or a saved step is claimed by nobody (unless ``allow_unclaimed``:
    such steps start empty, such state is dropped)."""
    claimed: dict[str, Processor] = {}
    missing = []
    for processor in app.graph.processors:
        for step in stateful_steps(processor):
            if step not in saved:
                missing.append(step)
            else:
                claimed[step] = processor
    problems = []
    if missing and not allow_unclaimed:
        problems.append(f"stateful step(s) {', '.join(map(repr, missing))} have no state in the savepoint "
                        "(renamed? name your steps explicitly); pass --allow-unclaimed-state to start them empty")
    unclaimed = sorted(set(saved) - set(claimed) - set(missing))
    if unclaimed and not allow_unclaimed:
        problems.append(f"the savepoint holds state of step(s) {', '.join(map(repr, unclaimed))} that this "
                        "pipeline does not have; pass --allow-unclaimed-state to drop it")
    if problems:
        raise SavepointMismatch("; ".join(problems))
    return claimed
