"""A checkpoint divided over another parallelism, as the AppMaster divides a savepoint:
each stateful step's whole state by task, handed to the new plan's tasks step by step."""

from __future__ import annotations

from gearbus.api.graph import Application
from gearbus.runtime.savepoints import split_task_state, stateful_steps, task_states
from gearbus.runtime.snapshots import TaskSnapshot


def rescaled(checkpoint: tuple[int, dict], old: Application, new: Application) -> tuple[int, dict]:
    """``checkpoint`` (an in-process engine's ``latest_checkpoint()`` of ``old``) as one
    that ``new``'s tasks restore from."""
    checkpoint_id, snapshots = checkpoint
    saved: dict[str, list] = {}
    for processor in old.graph.processors:
        for index in range(processor.parallelism):
            state = TaskSnapshot.decode(snapshots[(processor.id, index)]).state
            for step, step_state in split_task_state(processor, state).items():
                saved.setdefault(step, []).append(step_state)
    seeded = {}
    for processor in new.graph.processors:
        mine = {step: saved[step] for step in stateful_steps(processor)}
        for index, state in enumerate(task_states(processor, mine)):
            seeded[(processor.id, index)] = TaskSnapshot.seeded(checkpoint_id, state).encode()
    return checkpoint_id, seeded
