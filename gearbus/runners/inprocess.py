"""The TestRunner's engine: a processor DAG run in this process, deterministically.

It follows the executors' data-plane rules exactly — records then watermark per
message, a task's watermark is the minimum over its inputs, a task sees a watermark
before its output is sent with it, end-of-stream carries the final watermark — and
sends every value through the wire codec, so what passes here behaves the same on
the bus. Only the interleaving differs: here it is a fixed FIFO order.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

from gearbus.api.graph import Application
from gearbus.api.task import Record, Task, TaskContext, new_record
from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from gearbus.chain import failure_report
from gearbus.runtime_tasks import DataSourceTask
from shared import values
from shared.messages import AppError

DEFAULT_BATCH_RECORDS = 4096


class PipelineFailed(Exception):
    """A pipeline run in-process failed; ``error`` is what ``gearbus status`` would show."""

    def __init__(self, error: AppError):
        super().__init__(f"{error.error_type}: {error.message} ({error.where})")
        self.error = error


@dataclass(eq=False)
class _Node:
    task: Task
    processor_id: int
    index: int
    outputs: list  # [(partitioner, [receiver _Node])]
    senders: dict  # (processor, index) -> last watermark heard
    open_inputs: int
    watermark: int = WATERMARK_MIN
    sent: dict | None = None  # receiver node -> last watermark sent to it
    finished: bool = False

    @property
    def name(self) -> str:
        return self.task.context.task_name


class InProcessEngine:
    def __init__(self, app: Application, batch_records: int = DEFAULT_BATCH_RECORDS):
        self.app = app
        self.batch_records = batch_records
        self.queue: collections.deque = collections.deque()
        self.nodes: dict[tuple[int, int], _Node] = {}
        graph = app.graph
        for p in graph.processors:
            senders = {(e.upstream.id, i): WATERMARK_MIN for e in graph.inputs_of(p) for i in range(e.upstream.parallelism)}
            for index in range(p.parallelism):
                task = p.task_class(TaskContext(0, app.name, p, index, 0))
                self.nodes[(p.id, index)] = _Node(task, p.id, index, [], dict(senders), len(senders), sent={})
        for p in graph.processors:
            for edge in graph.outputs_of(p):
                receivers = [self.nodes[(edge.downstream.id, i)] for i in range(edge.downstream.parallelism)]
                for index in range(p.parallelism):
                    self.nodes[(p.id, index)].outputs.append((edge.partitioner, receivers))

    def run(self) -> None:
        """Run until every task has finished; a failure raises PipelineFailed."""
        started = []
        try:
            for node in self.nodes.values():
                self._guard(node, node.task.on_start)
                started.append(node)
            sources = [n for n in self.nodes.values() if isinstance(n.task, DataSourceTask)]
            while sources or self.queue:
                if self.queue:
                    self._deliver(*self.queue.popleft())
                    continue
                idle = True
                for node in list(sources):
                    count = self._guard(node, node.task.read, self.batch_records)
                    if count is None:
                        sources.remove(node)
                        self._advance(node, WATERMARK_MAX)
                        self._finish(node)
                    elif count:
                        self._advance(node, node.task.watermark)
                        self._flush(node)
                    idle = idle and count == 0
                    if self.queue:
                        break
                if idle and sources:  # every source is waiting for data: sleep, do not spin
                    time.sleep(min(n.task.source.idle_wait_s() for n in sources))
            unfinished = [n.name for n in self.nodes.values() if not n.finished]
            if unfinished:
                raise RuntimeError(f"tasks never ended (a source that never ends?): {', '.join(unfinished)}")
        finally:
            for node in started:
                try:
                    node.task.on_stop()
                except Exception:
                    pass

    def _guard(self, node: _Node, fn, *args):
        try:
            return fn(*args)
        except PipelineFailed:
            raise
        except Exception as exc:
            raise PipelineFailed(failure_report(exc, node.task.context)) from exc

    def _deliver(self, receiver: _Node, sender: tuple[int, int], records: list[Record], watermark: int, eos: bool):
        task = receiver.task
        if records:
            task.current_time = records[-1].timestamp
            self._guard(receiver, task.on_batch, records)
        if watermark != receiver.senders[sender]:
            receiver.senders[sender] = watermark
            self._advance(receiver, min(receiver.senders.values()))
        if len(task.output) >= self.batch_records:
            self._flush(receiver)
        if eos:
            receiver.open_inputs -= 1
            if receiver.open_inputs == 0:
                self._finish(receiver)

    def _advance(self, node: _Node, watermark: int) -> None:
        if watermark <= node.watermark:
            return
        node.watermark = watermark
        self._guard(node, node.task.on_watermark, watermark)
        if watermark < WATERMARK_MAX:  # the final watermark goes out after on_end's output
            self._flush(node)

    def _flush(self, node: _Node, eos: bool = False) -> None:
        output, node.task.output = node.task.output, []
        for partitioner, receivers in node.outputs:
            buckets = self._guard(node, partitioner.route, output, len(receivers), node.index) if output else None
            for i, receiver in enumerate(receivers):
                bucket = buckets[i] if buckets else []
                if bucket or eos or node.watermark > node.sent.get(receiver, WATERMARK_MIN):
                    node.sent[receiver] = node.watermark
                    self.queue.append((receiver, (node.processor_id, node.index), self._over_the_wire(node, bucket),
                                       node.watermark, eos))

    def _over_the_wire(self, node: _Node, records: list[Record]) -> list[Record]:
        """What the receiver would decode: values and keys through the wire codec."""
        if not records:
            return records
        encoded = self._guard(node, values.pack, [[r[0] for r in records], [r[1] for r in records],
                                                  [r[2] for r in records]])
        vals, stamps, keys = values.unpack(encoded)
        return [new_record(Record, r) for r in zip(vals, stamps, keys)]

    def _finish(self, node: _Node) -> None:
        self._guard(node, node.task.on_end)
        node.watermark = WATERMARK_MAX
        self._flush(node, eos=True)
        node.finished = True
