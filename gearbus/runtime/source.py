"""A source task's loop, free of I/O: the executor's async loop and the TestRunner's
loop both take one step at a time and carry out its actions.

A step first injects the checkpoint barriers asked for since the last one (a barrier
goes between two batches, never inside one), then reads a batch of at most
``batch_records`` records, unless the task is full (its async calls make room first:
see ``Task.full``). A source that has nothing now, or is full, reads 0 and the driver waits
(at most ``idle_wait_s``, or until a barrier is asked for); one that has ended reads
None, and its last output goes with the final watermark and end-of-stream; otherwise
the source's watermark advances and the batch goes out.
"""

from __future__ import annotations

from typing import NamedTuple

from gearbus.runtime.core import TaskCore


class SourceStep(NamedTuple):
    """What one step did: ``actions`` for the driver; ``count`` records read (0: nothing
    now, None: the source ended)."""

    actions: list
    count: int | None


class SourceLoop:
    """The loop of one source task around its core."""

    def __init__(self, core: TaskCore, batch_records: int):
        self.core = core
        self.task = core.task
        self.batch_records = batch_records
        self.barriers: list[tuple[int, bool]] = []  # checkpoints whose barriers are to be injected, and park
        self.records_read = 0

    def inject(self, checkpoint_id: int, park: bool = False) -> None:
        """Checkpoint ``checkpoint_id`` was triggered: its barrier goes before the next batch
        (``park``: then the source reads nothing until its task resumes)."""
        self.barriers.append((checkpoint_id, park))

    def pending_barriers(self) -> list:
        """Inject the barriers asked for (an ended source still passes them on)."""
        barriers, self.barriers = self.barriers, []
        return [action for checkpoint_id, park in barriers for action in self.core.inject_barrier(checkpoint_id, park)]

    def step(self) -> SourceStep:
        """Pending barriers, then one batch (none while the task is full or parked)."""
        actions = self.pending_barriers()
        if not self.core.accepting or self.core.parked:
            return SourceStep(actions, 0)
        count = self.task.read(self.batch_records)
        if count is None:
            actions += self.core.end_source()
            return SourceStep(actions, count)
        self.records_read += count
        # a read without records may move the watermark too (a stream's watermark-only message)
        actions += self.core.advance_source(self.task.watermark)
        if count:
            actions.append(self.core.flush())  # the batch, when the watermark did not move
        return SourceStep(actions, count)
