"""The TestRunner's engine: a processor DAG run in this process, deterministically.

Each task is driven through the same :class:`~gearbus.runtime.core.TaskCore` the
executors use — sequences, watermarks, end-of-stream, barrier alignment, snapshots —
and every value goes through the wire codec, so what passes here behaves the same on
the bus. Only the interleaving differs: here it is a fixed FIFO order, and frames are
handed over without credit.

Checkpoints work as on the bus: barriers are injected at the sources (every
``checkpoint_every`` rounds of source reads, and once after every task ended), a
checkpoint completes when every task snapshotted it, and then sinks commit. A run can
stop at a chosen point as if the process had crashed, and another engine can resume
from the last completed checkpoint: a user's test of exactly-once recovery.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

from gearbus.api.graph import Application
from gearbus.api.task import Record, Task, TaskContext, new_record
from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from gearbus.runtime.chain import failure_report
from gearbus.runtime.core import NO_BARRIER, End, Flush, Frame, Snapshot, TaskCore
from gearbus.runtime.snapshots import TaskSnapshot
from gearbus.runtime.tasks import DataSourceTask
from shared import values
from shared.messages import AppError

DEFAULT_BATCH_RECORDS = 4096


class PipelineFailed(Exception):
    """A pipeline run in-process failed; ``error`` is what ``gearbus status`` would show."""

    def __init__(self, error: AppError):
        super().__init__(f"{error.error_type}: {error.message} ({error.where})")
        self.error = error


class SimulatedCrash(Exception):
    """The run stopped where the caller asked, as if every process had died there."""


@dataclass(eq=False)
class _Node:
    task: Task
    core: TaskCore
    processor_id: int
    index: int
    outputs: list  # [(partitioner, [receiver _Node])]
    seq: dict = field(default_factory=dict)  # receiver node -> last sequence number sent
    sent: dict = field(default_factory=dict)  # receiver node -> last watermark sent to it

    @property
    def key(self) -> tuple[int, int]:
        return self.processor_id, self.index

    @property
    def name(self) -> str:
        return self.task.context.task_name


class InProcessEngine:
    def __init__(self, app: Application, batch_records: int = DEFAULT_BATCH_RECORDS, checkpoint_every: int = 0,
                 epoch: int = 0):
        """``checkpoint_every``: inject a checkpoint's barriers every that many rounds of
        source reads (0: only the final checkpoint after the end)."""
        self.app = app
        self.batch_records = batch_records
        self.checkpoint_every = checkpoint_every
        self.queue: collections.deque = collections.deque()
        self.nodes: dict[tuple[int, int], _Node] = {}
        #: checkpoint id -> task key -> encoded TaskSnapshot, for complete checkpoints
        self.completed: dict[int, dict[tuple[int, int], bytes]] = {}
        self._pending: dict[int, dict[tuple[int, int], bytes]] = {}
        self._next_checkpoint = 1
        self._delivered = 0
        graph = app.graph
        for p in graph.processors:
            senders = [(e.upstream.id, i) for e in graph.inputs_of(p) for i in range(e.upstream.parallelism)]
            for index in range(p.parallelism):
                task = p.task_class(TaskContext(0, app.name, p, index, 0, epoch=epoch))
                self.nodes[(p.id, index)] = _Node(task, TaskCore(task, senders, 2, epoch), p.id, index, [])
        for p in graph.processors:
            for edge in graph.outputs_of(p):
                receivers = [self.nodes[(edge.downstream.id, i)] for i in range(edge.downstream.parallelism)]
                for index in range(p.parallelism):
                    self.nodes[(p.id, index)].outputs.append((edge.partitioner, receivers))

    def latest_checkpoint(self) -> tuple[int, dict[tuple[int, int], bytes]] | None:
        """The last completed checkpoint (id, snapshots by task), or None."""
        if not self.completed:
            return None
        checkpoint_id = max(self.completed)
        return checkpoint_id, self.completed[checkpoint_id]

    def run(self, restore: tuple[int, dict[tuple[int, int], bytes]] | None = None,
            crash_after_frames: int | None = None) -> None:
        """Run until every task has finished; a failure raises PipelineFailed.

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
            self._loop(crash_after_frames)
            if any(not n.core.ended for n in self.nodes.values()):
                unfinished = [n.name for n in self.nodes.values() if not n.core.ended]
                raise RuntimeError(f"tasks never ended (a source that never ends?): {', '.join(unfinished)}")
            final = self._next_checkpoint
            self._inject(final)
            self._drain(crash_after_frames)
            if final not in self.completed:
                raise RuntimeError(f"the final checkpoint {final} did not complete")
        finally:
            for node in started:
                try:
                    node.task.on_stop()
                except Exception:
                    pass

    # --- driving -----------------------------------------------------------------------

    def _restore(self, checkpoint_id: int, snapshots: dict[tuple[int, int], bytes]) -> None:
        missing = sorted(set(self.nodes) - set(snapshots))
        if missing:
            raise RuntimeError(f"checkpoint {checkpoint_id} has no snapshot of tasks {missing}")
        for key, node in self.nodes.items():
            self._guard(node, node.core.restore, TaskSnapshot.decode(snapshots[key]))
        self._next_checkpoint = checkpoint_id + 1
        for node in self.nodes.values():
            if node.core.ended:  # it ended before the checkpoint: its receivers hear the end again
                self._flush(node, WATERMARK_MAX, eos=True)

    def _loop(self, crash_after_frames: int | None) -> None:
        sources = [n for n in self.nodes.values() if isinstance(n.task, DataSourceTask) and not n.core.ended]
        rounds = 0
        while sources or self.queue:
            if self.queue:
                self._deliver_one(crash_after_frames)
                continue
            rounds += 1
            if self.checkpoint_every and rounds % self.checkpoint_every == 0 and not self._pending:
                self._inject(self._next_checkpoint)
                continue
            idle = True
            for node in list(sources):
                count = self._guard(node, node.task.read, self.batch_records)
                if count is None:
                    sources.remove(node)
                    self._act(node, self._guard(node, node.core.end_source))
                elif count:
                    self._act(node, self._guard(node, node.core.advance_source, node.task.watermark))
                    self._flush(node, node.core.watermark)
                idle = idle and count == 0
                if self.queue:
                    break
            if idle and sources:  # every source is waiting for data: sleep, do not spin
                time.sleep(min(n.task.source.idle_wait_s() for n in sources))

    def _drain(self, crash_after_frames: int | None) -> None:
        while self.queue:
            self._deliver_one(crash_after_frames)

    def _deliver_one(self, crash_after_frames: int | None) -> None:
        if crash_after_frames is not None and self._delivered >= crash_after_frames:
            raise SimulatedCrash(f"stopped after {self._delivered} frames")
        receiver, frame = self.queue.popleft()
        self._delivered += 1
        actions = self._guard(receiver, receiver.core.receive, (frame.src_processor, frame.src_index), frame)
        self._act(receiver, actions)
        if len(receiver.task.output) >= self.batch_records:
            self._flush(receiver, receiver.core.watermark)

    def _inject(self, checkpoint_id: int) -> None:
        self._next_checkpoint = checkpoint_id + 1
        self._pending[checkpoint_id] = {}
        for node in self.nodes.values():
            if isinstance(node.task, DataSourceTask):
                self._act(node, self._guard(node, node.core.inject_barrier, checkpoint_id))

    def _act(self, node: _Node, actions: list) -> None:
        for action in actions:
            kind = type(action)
            if kind is Flush:
                self._send_output(node, action.records, action.watermark)
            elif kind is End:
                self._send_output(node, action.records, WATERMARK_MAX, eos=True)
            elif kind is Snapshot:
                self._send_output(node, action.records, action.watermark)
                self._send_barrier(node, action.checkpoint_id)
                self._snapshotted(node, action)

    def _snapshotted(self, node: _Node, snapshot: Snapshot) -> None:
        taken = self._pending.get(snapshot.checkpoint_id)
        if taken is None:
            return
        taken[node.key] = self._guard(node, snapshot.state.encode)
        if len(taken) == len(self.nodes):
            del self._pending[snapshot.checkpoint_id]
            self.completed[snapshot.checkpoint_id] = taken
            for each in self.nodes.values():
                self._guard(each, each.task.checkpoint_complete, snapshot.checkpoint_id)

    def _guard(self, node: _Node, fn, *args):
        try:
            return fn(*args)
        except PipelineFailed:
            raise
        except Exception as exc:
            raise PipelineFailed(failure_report(exc, node.task.context)) from exc

    def _flush(self, node: _Node, watermark: int, eos: bool = False) -> None:
        """Send the task's output so far, then ``watermark`` (and end-of-stream)."""
        output, node.task.output = node.task.output, []
        self._send_output(node, output, watermark, eos)

    def _send_output(self, node: _Node, output: list[Record], watermark: int, eos: bool = False) -> None:
        """Send ``output``, then ``watermark`` (and end-of-stream) to every receiver."""
        for partitioner, receivers in node.outputs:
            buckets = self._guard(node, partitioner.route, output, len(receivers), node.index) if output else None
            for i, receiver in enumerate(receivers):
                bucket = buckets[i] if buckets else []
                if bucket or eos or watermark > node.sent.get(receiver, WATERMARK_MIN):
                    node.sent[receiver] = max(watermark, node.sent.get(receiver, WATERMARK_MIN))
                    self._send(node, receiver, self._over_the_wire(node, bucket), node.sent[receiver], eos,
                               NO_BARRIER)

    def _send_barrier(self, node: _Node, checkpoint_id: int) -> None:
        for _, receivers in node.outputs:
            for receiver in receivers:
                self._send(node, receiver, [], node.sent.get(receiver, WATERMARK_MIN), False, checkpoint_id)

    def _send(self, node: _Node, receiver: _Node, records: list[Record], watermark: int, eos: bool,
              barrier: int) -> None:
        seq = node.seq[receiver] = node.seq.get(receiver, 0) + 1
        self.queue.append((receiver, Frame(node.processor_id, node.index, node.core.epoch, seq, watermark, eos,
                                           barrier, records)))

    def _over_the_wire(self, node: _Node, records: list[Record]) -> list[Record]:
        """What the receiver would decode: values and keys through the wire codec."""
        if not records:
            return records
        encoded = self._guard(node, values.pack, [[r[0] for r in records], [r[1] for r in records],
                                                  [r[2] for r in records]])
        vals, stamps, keys = values.unpack(encoded)
        return [new_record(Record, r) for r in zip(vals, stamps, keys)]
