"""The sending side of a task, free of I/O: every rule of what goes to which receiver.

Output is partitioned per out edge, cut into frames per receiver (at most
``batch_records`` records and, unless a single record is larger, ``batch_bytes``
encoded bytes), numbered per receiver, and each frame carries the watermark that holds
after its records. Control goes in band behind the records: watermarks, barriers,
end-of-stream. Credit is counted per receiver: a frame may go once its sequence number
is within what the receiver granted.

The sender decides and returns :class:`Outgoing` frames in the order they must go; the
driver carries them out: the executor publishes them over NATS (or hands them to a task
in the same process) and waits for credit, the TestRunner queues them in memory.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, NamedTuple

from gearbus.api.partitioners import Partitioner
from gearbus.api.task import Record
from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from gearbus.runtime.core import NO_BARRIER, End, Flush, Frame, Snapshot
from gearbus.runtime.frames import encode_frame
from gearbus.runtime.task_key import TaskKey
from shared.values import ValueTypeError

if TYPE_CHECKING:
    from gearbus.control.config import AppConfig


def senders_of(graph, processor) -> list[TaskKey]:
    """The tasks that send to each task of ``processor`` in ``graph`` (a plan's)."""
    return [(edge.upstream.id, i) for edge in graph.inputs_of(processor) for i in range(edge.upstream.parallelism)]


def edges_of(graph, processor) -> list[tuple[Partitioner, int, int]]:
    """Each out edge of ``processor`` in ``graph`` as a :class:`Sender` takes it."""
    return [(e.partitioner, e.downstream.id, e.downstream.parallelism) for e in graph.outputs_of(processor)]


class Channel:
    """One sender -> receiver pair: its sequence numbers, last watermark and credit."""

    __slots__ = ("receiver", "seq", "limit", "watermark", "consumed", "ended", "probed")

    def __init__(self, receiver: TaskKey, window: int):
        self.receiver = receiver
        self.seq = 0  # the last sequence number given to a frame
        self.limit = window  # the highest sequence number the receiver lets us send
        self.watermark = WATERMARK_MIN  # the last watermark given to a frame
        self.consumed = 0  # the frames the receiver said it processed
        self.ended = False  # end-of-stream was sent
        self.probed = 0  # ``seq`` when :meth:`Sender.probes` last looked

    def grant(self, consumed: int, window: int) -> None:
        """The receiver processed ``consumed`` frames: we may send up to ``consumed`` +
        ``window``. Counts only raise the limit (an old or repeated grant is harmless) and
        cannot exceed what was sent (a confused or hostile grant cannot let a sender flood
        its receiver)."""
        self.consumed = max(self.consumed, min(consumed, self.seq))
        self.limit = max(self.limit, self.consumed + window)

    def has_credit(self, seq: int) -> bool:
        """Whether frame ``seq`` of this channel is within the window."""
        return seq <= self.limit


class Outgoing(NamedTuple):
    """A frame to send on ``channel`` once it has credit, and its encoded form."""

    channel: Channel
    frame: Frame
    data: bytes


class Sender:
    """All out edges of one task: actions of its :class:`~gearbus.runtime.core.TaskCore`
    in, frames out."""

    def __init__(self, processor: int, index: int, epoch: int,
                 edges: list[tuple[Partitioner, int, int]], config: AppConfig):
        """``edges``: (partitioner, downstream processor id, downstream parallelism) each."""
        self.processor = processor
        self.index = index
        self.epoch = epoch
        self.config = config
        # A partitioner of its own, as every task runs its own copy of its steps: a
        # round-robin's position, the steps a ChainedEdge runs here.
        self._wire([(copy.deepcopy(partitioner), downstream, n) for partitioner, downstream, n in edges])
        self.records_out = 0
        self.frames_out = 0
        self.bytes_out = 0

    def _wire(self, edges: list[tuple[Partitioner, int, int]]) -> None:
        self.ports: list[tuple[Partitioner, list[Channel]]] = []
        self.channels: dict[TaskKey, Channel] = {}
        for partitioner, downstream, parallelism in edges:
            port = [Channel((downstream, i), self.config.credit_frames) for i in range(parallelism)]
            self.channels.update((channel.receiver, channel) for channel in port)
            self.ports.append((partitioner, port))

    def rewire(self, epoch: int, edges: list[tuple[Partitioner, int, int]]) -> None:
        """Go on in ``epoch`` over these edges (a downstream processor was rescaled): every
        channel starts anew; each edge keeps its partitioner (and what its steps hold)."""
        if [downstream for _, downstream, _ in edges] != [port[0].receiver[0] for _, port in self.ports]:
            raise ValueError(f"task {self.processor}.{self.index} rewired to other downstream processors")
        self.epoch = epoch
        self._wire([(partitioner, downstream, n) for (partitioner, _), (_, downstream, n) in zip(self.ports, edges)])

    def act(self, action: Flush | End | Snapshot) -> list[Outgoing]:
        """The frames a core's sending action asks for (a Snapshot's barrier follows its output)."""
        kind = type(action)
        if kind is Flush:
            return self.send(action.records, action.watermark)
        if kind is End:
            return self.send(action.records, WATERMARK_MAX) + self.finish(WATERMARK_MAX)
        if kind is Snapshot:
            return self.send(action.records, action.watermark) + self.barrier(action.checkpoint_id, action.park)
        raise TypeError(f"not a sending action: {action!r}")

    def grant(self, processor: int, index: int, epoch: int, consumed: int, window: int) -> Channel | None:
        """Credit from a receiver: its channel, or None from an unknown receiver or attempt.
        The receiver's (debloated) window, never past ``credit_frames``."""
        channel = self.channels.get((processor, index))
        if channel is None or epoch != self.epoch:
            return None
        channel.grant(consumed, max(1, min(window, self.config.credit_frames)))
        return channel

    def send(self, records: list[Record], watermark: int) -> list[Outgoing]:
        """Partition ``records`` over every out edge into frames.

        ``watermark`` holds after these records: it rides the last frame to each
        receiver (earlier frames carry the previous one) and goes alone to receivers
        that got none of the records, so every receiver applies it at the same point
        of the stream, whatever the batching.
        """
        out: list[Outgoing] = []
        step = self.config.batch_records
        for partitioner, channels in self.ports:
            buckets = partitioner.route(records, len(channels), self.index) if records else None
            try:
                for i, channel in enumerate(channels):
                    bucket = buckets[i] if buckets else None
                    if bucket:
                        for start in range(0, len(bucket), step):
                            last = start + step >= len(bucket)
                            self._frame(out, channel, watermark if last else channel.watermark, False, NO_BARRIER,
                                        bucket[start : start + step])
                    elif watermark > channel.watermark:
                        self._frame(out, channel, watermark, False, NO_BARRIER, [])
            except ValueTypeError as exc:  # steps run at this edge made the value, not the task's own
                exc.emitted_by = partitioner.emitting_steps()
                raise
        return out

    def finish(self, watermark: int) -> list[Outgoing]:
        """End-of-stream, with the final watermark, to every receiver."""
        out: list[Outgoing] = []
        for channel in self.channels.values():
            self._frame(out, channel, watermark, True, NO_BARRIER, [])
        return out

    def barrier(self, checkpoint_id: int, park: bool = False) -> list[Outgoing]:
        """Checkpoint ``checkpoint_id``'s barrier to every receiver, behind everything sent
        (``park``: they park after their snapshot, as this task did)."""
        out: list[Outgoing] = []
        for channel in self.channels.values():
            self._frame(out, channel, channel.watermark, False, checkpoint_id, [], park)
        return out

    def probes(self) -> list[Outgoing]:
        """An empty frame (the same watermark) on each channel that has frames its receiver
        has not processed and sent nothing since the previous call, within credit.

        A frame lost with a NATS server shows as a gap only when a later frame arrives: lost
        last, behind it an idle source or a barrier, it would leave a checkpoint waiting for
        its timeout. Called every second or so while the task runs, this makes the gap show:
        the receiver takes the empty frame (nothing was lost) or fails, and the app recovers."""
        out: list[Outgoing] = []
        for channel in self.channels.values():
            if (channel.consumed < channel.seq == channel.probed and not channel.ended
                    and channel.has_credit(channel.seq + 1)):
                self._frame(out, channel, channel.watermark, False, NO_BARRIER, [])
            channel.probed = channel.seq
        return out

    def _frame(self, out: list[Outgoing], channel: Channel, watermark: int, eos: bool, barrier: int,
               records: list[Record], park: bool = False) -> None:
        """Number and encode one frame (``watermark`` holds after its records); one over
        ``batch_bytes`` is halved, the first half carrying the previous watermark."""
        seq = channel.seq + 1
        data = encode_frame(self.processor, self.index, self.epoch, seq, watermark, eos, barrier, records, park)
        if len(data) > self.config.batch_bytes and len(records) > 1:
            half = len(records) // 2
            self._frame(out, channel, channel.watermark, False, NO_BARRIER, records[:half])
            self._frame(out, channel, watermark, eos, barrier, records[half:])
            return
        channel.seq, channel.watermark = seq, watermark
        channel.ended = channel.ended or eos
        out.append(Outgoing(channel, Frame(self.processor, self.index, self.epoch, seq, watermark, eos, barrier,
                                           records, park), data))
        self.frames_out += 1
        self.bytes_out += len(data)
        self.records_out += len(records)
