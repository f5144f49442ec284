"""The TestRunner's engine: the cluster's runtime driven in this process.

Every rule is the cluster's own: each task's :class:`~gearbus.runtime.core.TaskCore`
(sequences, watermarks, end-of-stream, barrier alignment, snapshots), its
:class:`~gearbus.runtime.sender.Sender` (partitioning, batching, credit), the
:class:`~gearbus.runtime.source.SourceLoop` of source tasks, and checkpoints triggered
and completed by the :class:`~gearbus.runtime.checkpoints.CheckpointCoordinator`. This
engine supplies only what a cluster gets from NATS and the OS:

- an in-memory transport: every frame is encoded and decoded by the wire codec; a
  frame within its channel's credit is in flight, the rest wait in order at their
  sender, which meanwhile reads no input (back-pressure, as in an executor);
- a clock: one tick per round of source reads, so ``checkpoint_every`` rounds is the
  coordinator's interval;
- an order: a seeded random choice of which channel delivers next and which source
  reads first (each channel stays FIFO), so one seed always gives one interleaving.

A run can stop at a chosen point as if the process had crashed, and another engine can
resume from the last completed checkpoint: a user's test of exactly-once recovery.
"""

from __future__ import annotations

import collections
import math
import random
import time
from dataclasses import dataclass, replace

from gearbus.api.graph import Application
from gearbus.api.io_tasks import DataSourceTask
from gearbus.api.task import Task, TaskContext
from gearbus.api.watermarks import WATERMARK_MAX
from gearbus.runtime import checkpoints as cp
from gearbus.runtime.chain import failure_report
from gearbus.runtime.core import End, Grant, Snapshot, TaskCore
from gearbus.runtime.frames import FrameReader
from gearbus.runtime.sender import DataPlaneConfig, Outgoing, Sender
from gearbus.runtime.snapshots import TaskSnapshot
from gearbus.runtime.source import SourceLoop
from shared.messages import AppError

KEEP_CHECKPOINTS = 2

TaskKey = tuple[int, int]
Checkpoint = tuple[int, dict[TaskKey, bytes]]
"""A completed checkpoint: its id and each task's encoded :class:`TaskSnapshot`."""


class PipelineFailed(Exception):
    """A pipeline run in-process failed; ``error`` is what ``gearbus status`` would show."""

    def __init__(self, error: AppError):
        super().__init__(f"{error.error_type}: {error.message} ({error.where})")
        self.error = error


class SimulatedCrash(Exception):
    """The run stopped where the caller asked, as if every process had died there."""


@dataclass(eq=False)
class _Node:
    key: TaskKey
    task: Task
    core: TaskCore
    sender: Sender
    source: SourceLoop | None
    waiting: collections.deque  # Outgoing frames beyond their channel's credit, in sending order

    @property
    def name(self) -> str:
        return self.task.context.task_name


class InProcessEngine:
    def __init__(self, app: Application, batch_records: int | None = None, checkpoint_every: int = 0,
                 epoch: int = 0, seed: int = 0):
        """``batch_records``: records per source read and per frame (default: the app's
        ``batch_records``, as the executors read it, so watermarks advance at the same
        points as on the bus). ``checkpoint_every``: trigger a checkpoint every that many
        rounds of source reads (0: only the final checkpoint after the end). ``seed``:
        picks the interleaving."""
        self.app = app
        self.epoch = epoch
        self.checkpoint_every = checkpoint_every
        self.random = random.Random(seed)
        config = DataPlaneConfig.from_config(app.config)
        self.config = config if batch_records is None else replace(config, batch_records=batch_records)
        self.nodes: dict[TaskKey, _Node] = {}
        graph = app.graph
        for p in graph.processors:
            senders = [(e.upstream.id, i) for e in graph.inputs_of(p) for i in range(e.upstream.parallelism)]
            edges = [(e.partitioner, e.downstream.id, e.downstream.parallelism) for e in graph.outputs_of(p)]
            for index in range(p.parallelism):
                task = p.task_class(TaskContext(0, app.name, p, index, 0, epoch=epoch))
                core = TaskCore(task, senders, self.config.credit_frames, epoch)
                source = SourceLoop(core, self.config.batch_records) if isinstance(task, DataSourceTask) else None
                self.nodes[(p.id, index)] = _Node((p.id, index), task, core,
                                                  Sender(p.id, index, epoch, edges, self.config), source,
                                                  collections.deque())
        #: (sender, receiver) -> frames in flight, for every channel, in a fixed order
        self.wire: dict[tuple[TaskKey, TaskKey], collections.deque[Outgoing]] = {
            (node.key, receiver): collections.deque() for node in self.nodes.values()
            for receiver in node.sender.channels}
        self.inboxes: collections.Counter[TaskKey] = collections.Counter()  # frames in flight per receiver
        self.reader = FrameReader()
        self.clock = 0.0
        self.coordinator = self._coordinator(next_id=1)
        #: checkpoint id -> task key -> encoded snapshot, for completed checkpoints
        self.completed: dict[int, dict[TaskKey, bytes]] = {}
        self._taken: dict[int, dict[TaskKey, bytes]] = {}  # the checkpoint in flight's snapshots so far
        self._finished = False
        self._delivered = 0

    def latest_checkpoint(self) -> Checkpoint | None:
        """The last completed checkpoint (id, snapshots by task), or None."""
        if not self.completed:
            return None
        checkpoint_id = max(self.completed)
        return checkpoint_id, self.completed[checkpoint_id]

    def run(self, restore: Checkpoint | None = None, crash_after_frames: int | None = None) -> None:
        """Run until the final checkpoint completed; a failure raises PipelineFailed.

        ``restore``: a checkpoint from :meth:`latest_checkpoint` of an earlier engine.
        ``crash_after_frames``: stop with SimulatedCrash after delivering that many frames.
        """
        started = []
        try:
            for node in self.nodes.values():
                self._guard(node, node.task.on_start)
                started.append(node)
            if restore is not None:
                self._restore(*restore)
            self._coordinate(self.coordinator.start(self.clock))
            self._loop(crash_after_frames)
            unfinished = [n.name for n in self.nodes.values() if not n.core.ended]
            if unfinished:
                raise RuntimeError(f"tasks never ended (a source that never ends?): {', '.join(unfinished)}")
            if not self._finished:
                raise RuntimeError(f"the final checkpoint did not complete (stuck at {self.coordinator.stats()})")
        finally:
            for node in started:
                try:
                    node.task.on_stop()
                except Exception:
                    pass

    # --- driving -----------------------------------------------------------------------

    def _restore(self, checkpoint_id: int, snapshots: dict[TaskKey, bytes]) -> None:
        missing = sorted(set(self.nodes) - set(snapshots))
        if missing:
            raise RuntimeError(f"checkpoint {checkpoint_id} has no snapshot of tasks {missing}")
        self.coordinator = self._coordinator(next_id=checkpoint_id + 1)
        for key, node in self.nodes.items():
            self._guard(node, node.core.restore, TaskSnapshot.decode(snapshots[key]))
        for node in self.nodes.values():
            if node.core.ended:  # it ended before the checkpoint: its receivers hear the end again
                self._send(node, node.sender.finish(WATERMARK_MAX))
                self._coordinate(self.coordinator.task_ended(node.key, self.clock))

    def _loop(self, crash_after_frames: int | None) -> None:
        """Deliver frames while any can go; else a round of source reads; until the final
        checkpoint completed or nothing can move."""
        sources = [node for node in self.nodes.values() if node.source is not None and not node.core.ended]
        while not self._finished:
            ready = [channel for channel, frames in self.wire.items()
                     if frames and not self.nodes[channel[1]].waiting]
            if ready:
                if crash_after_frames is not None and self._delivered >= crash_after_frames:
                    raise SimulatedCrash(f"stopped after {self._delivered} frames")
                self._deliver(*ready[self.random.randrange(len(ready))])
                continue
            readable = [node for node in sources if not node.waiting]
            if not readable:
                return
            self.clock += 1
            self._coordinate(self.coordinator.tick(self.clock))
            self.random.shuffle(readable)
            idle = True
            for node in readable:
                actions, count = self._guard(node, node.source.step)
                if count is None:
                    sources.remove(node)
                self._act(node, actions)
                idle = idle and count == 0
                if any(self.inboxes.values()):
                    break
            if idle:  # every source is waiting for data: sleep, do not spin
                time.sleep(min(n.task.source.idle_wait_s() for n in readable))

    def _deliver(self, sender: TaskKey, receiver: TaskKey) -> None:
        node, outgoing = self.nodes[receiver], self.wire[(sender, receiver)].popleft()
        self.inboxes[receiver] -= 1
        self._delivered += 1
        _, frame = self._guard(node, self.reader.feed, outgoing.data)
        self._act(node, self._guard(node, node.core.receive, sender, frame))
        output = node.task.output
        if output and (len(output) >= self.config.batch_records or not self.inboxes[receiver]):
            self._act(node, [node.core.flush()])  # as an executor does when its inbox ran dry

    def _act(self, node: _Node, actions: list) -> None:
        for action in actions:
            kind = type(action)
            if kind is Grant:
                upstream = self.nodes[action.sender]
                upstream.sender.grant(*node.key, self.epoch, action.consumed)
                self._release(upstream)
                continue
            self._send(node, self._guard(node, node.sender.act, action))
            if kind is End:
                self._coordinate(self.coordinator.task_ended(node.key, self.clock))
            elif kind is Snapshot:
                self._snapshotted(node, action)

    def _send(self, node: _Node, outgoing: list[Outgoing]) -> None:
        node.waiting.extend(outgoing)
        self._release(node)

    def _release(self, node: _Node) -> None:
        """Put on the wire, in order, the waiting frames that have credit."""
        waiting = node.waiting
        while waiting and waiting[0].channel.has_credit(waiting[0].frame.seq):
            outgoing = waiting.popleft()
            self.wire[(node.key, outgoing.channel.receiver)].append(outgoing)
            self.inboxes[outgoing.channel.receiver] += 1

    # --- checkpoints ---------------------------------------------------------------------

    def _coordinator(self, next_id: int) -> cp.CheckpointCoordinator:
        """The AppMaster's coordinator, on this engine's clock; nothing times out in memory."""
        return cp.CheckpointCoordinator(
            self.nodes, [key for key, node in self.nodes.items() if node.source is not None],
            interval_s=self.checkpoint_every, timeout_s=math.inf, keep=KEEP_CHECKPOINTS, max_consecutive_failures=0,
            epoch=self.epoch, next_id=next_id)

    def _snapshotted(self, node: _Node, snapshot: Snapshot) -> None:
        data = self._guard(node, snapshot.state.encode)
        if snapshot.checkpoint_id == self.coordinator.in_flight:
            self._taken.setdefault(snapshot.checkpoint_id, {})[node.key] = data
        self._coordinate(self.coordinator.ack(snapshot.checkpoint_id, self.epoch, node.key, len(data),
                                              snapshot.ended, self.clock))

    def _coordinate(self, actions: list[cp.Action]) -> None:
        """Carry out what the checkpoint coordinator decided."""
        for action in actions:
            kind = type(action)
            if kind is cp.TriggerCheckpoint:
                for key in action.sources:
                    node = self.nodes[key]
                    node.source.inject(action.checkpoint_id)
                    self._act(node, self._guard(node, node.source.pending_barriers))
            elif kind is cp.StoreCheckpoint:
                self.completed[action.meta.checkpoint_id] = self._taken.pop(action.meta.checkpoint_id)
                self._coordinate(self.coordinator.stored(action.meta.checkpoint_id, self.clock))
            elif kind is cp.NotifyComplete:
                for node in self.nodes.values():
                    self._guard(node, node.task.checkpoint_complete, action.checkpoint_id)
                self._finished = self._finished or action.final
            elif kind is cp.PruneCheckpoints:
                for checkpoint_id in action.checkpoint_ids:
                    self.completed.pop(checkpoint_id, None)
            else:  # AbandonCheckpoint, FailApplication: no task declines or times out in-process
                raise RuntimeError(f"checkpoint coordinator: {action}")

    def _guard(self, node: _Node, fn, *args):
        try:
            return fn(*args)
        except PipelineFailed:
            raise
        except Exception as exc:
            raise PipelineFailed(failure_report(exc, node.task.context)) from exc
