"""The sending side of a task: partition records per out edge, batch them into frames
per destination, and publish each frame only when the receiver has granted credit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from gearbus.api.partitioners import Partitioner
from gearbus.api.task import Record
from gearbus.api.watermarks import WATERMARK_MIN
from services.executor.frames import Frame, encode_frame, split_message
from shared import subjects


@dataclass(frozen=True)
class DataPlaneConfig:
    """Knobs of the data plane, read from the application config."""

    batch_records: int = 4096  # records per frame at most
    batch_bytes: int = 512 * 1024  # encoded bytes per frame at most (a lone larger record still goes)
    linger_ms: float = 0.0  # how long a task whose inbox ran dry holds a small batch before sending it
    credit_frames: int = 16  # frames a sender may have in flight to one receiver
    task_metrics: bool = True  # time each batch (the latency histogram); off saves two clock reads a batch

    @classmethod
    def from_config(cls, config: dict) -> DataPlaneConfig:
        values = {k: config[k] for k in cls.__dataclass_fields__ if k in config}
        for key, value in values.items():
            if key == "task_metrics":
                if not isinstance(value, bool):
                    raise ValueError(f"application config task_metrics must be true or false, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"application config {key} must be a non-negative number, got {value!r}")
        made = cls(**values)
        if made.batch_records < 1 or made.credit_frames < 2:
            raise ValueError("application config needs batch_records >= 1 and credit_frames >= 2")
        return made


class Channel:
    """One sender -> receiver pair: FIFO subject, sequence numbers and credit.

    When the receiver lives in the same executor, ``local`` delivers into its inbox and
    frames are handed over as objects, skipping msgpack and NATS.
    """

    __slots__ = ("subject", "limit", "available", "seq", "local", "watermark")

    def __init__(self, subject: str, window: int):
        self.subject = subject
        self.limit = window  # the highest sequence number the receiver lets us send
        self.available = asyncio.Event()
        self.seq = 0
        self.local: Callable[[Frame, int], None] | None = None  # (frame, its encoded size)
        self.watermark = WATERMARK_MIN  # the last watermark sent on this channel

    def grant(self, consumed: int, window: int) -> None:
        """The receiver processed ``consumed`` frames: we may send up to ``consumed`` +
        ``window``. Counts only raise the limit (an old or repeated grant is harmless) and
        cannot exceed what was sent (a confused or hostile grant cannot let a sender flood
        its receiver)."""
        self.limit = max(self.limit, min(consumed, self.seq) + window)
        self.available.set()

    async def acquire(self) -> float:
        """Wait until the next frame is within the window (the caller then sends it); return
        the seconds waited: the time this sender was back-pressured."""
        if self.seq < self.limit:
            return 0.0
        started = time.perf_counter()
        while self.seq >= self.limit:
            self.available.clear()
            await self.available.wait()
        return time.perf_counter() - started


class Outputs:
    """All out edges of one task."""

    def __init__(self, nc, app_id: int, processor: int, index: int, epoch: int, edges, config: DataPlaneConfig):
        """``edges`` is a list of (partitioner, downstream processor id, downstream parallelism)."""
        self.nc = nc
        self.processor = processor
        self.index = index
        self.epoch = epoch
        self.config = config
        self.max_message = max(nc.max_payload - 256, 1024)
        self.ports: list[tuple[Partitioner, list[Channel]]] = []
        self._by_receiver: dict[tuple[int, int], Channel] = {}
        for partitioner, downstream, parallelism in edges:
            channels = []
            for i in range(parallelism):
                channel = Channel(subjects.task_inbox(app_id, downstream, i), config.credit_frames)
                channels.append(channel)
                self._by_receiver[(downstream, i)] = channel
            self.ports.append((partitioner, channels))
        self.records_out = 0
        self.frames_out = 0
        self.bytes_out = 0
        self.backpressure_s = 0.0

    def link_local(self, deliver: dict[tuple[int, int], Callable[[Frame, int], None]]) -> None:
        """Deliver straight into the inboxes of receivers hosted by this executor."""
        for receiver, channel in self._by_receiver.items():
            channel.local = deliver.get(receiver)

    def grant(self, processor: int, index: int, epoch: int, consumed: int) -> bool:
        """Credit from a receiver; accepted only from a known receiver of this attempt."""
        channel = self._by_receiver.get((processor, index))
        if channel is None or epoch != self.epoch:
            return False
        channel.grant(consumed, self.config.credit_frames)
        return True

    async def send(self, records: list[Record], watermark: int) -> None:
        """Partition ``records`` over every out edge and send them, waiting for credit.

        ``watermark`` holds after these records: it rides the last frame to each
        receiver (earlier frames carry the previous one) and goes alone to receivers
        that got none of the records, so every receiver applies it at the same point
        of the stream, whatever the batching.
        """
        for partitioner, channels in self.ports:
            buckets = partitioner.route(records, len(channels), self.index) if records else None
            for i, channel in enumerate(channels):
                if buckets and buckets[i]:
                    await self._send_records(channel, buckets[i], watermark)
                elif watermark > channel.watermark:
                    await self._publish(channel, watermark, False, 0, [])

    async def finish(self, watermark: int) -> None:
        """Send end-of-stream, with the final watermark, to every receiver."""
        for _, channels in self.ports:
            for channel in channels:
                await self._publish(channel, watermark, True, 0, [])

    async def barrier(self, checkpoint_id: int) -> None:
        """Pass checkpoint ``checkpoint_id``'s barrier to every receiver, behind everything sent."""
        for _, channels in self.ports:
            for channel in channels:
                await self._publish(channel, channel.watermark, False, checkpoint_id, [])

    async def _send_records(self, channel: Channel, records: list[Record], watermark: int) -> None:
        step = self.config.batch_records
        for start in range(0, len(records), step):
            last = start + step >= len(records)
            await self._publish(channel, watermark if last else channel.watermark, False, 0,
                                records[start : start + step])

    async def _publish(self, channel: Channel, watermark: int, eos: bool, barrier: int, records: list[Record]) -> None:
        """Send one frame; ``watermark`` holds after its records."""
        seq = channel.seq + 1
        data = encode_frame(self.processor, self.index, self.epoch, seq, watermark, eos, barrier, records)
        if channel.local is not None:
            # Handed over as objects, but encoded all the same: a value that cannot
            # travel fails here, whichever executor its receiver happens to be in.
            self.backpressure_s += await channel.acquire()
            channel.seq, channel.watermark = seq, watermark
            channel.local(Frame(self.processor, self.index, self.epoch, seq, watermark, eos, barrier, list(records)),
                          len(data))
            self.frames_out += 1
            self.bytes_out += len(data)
            self.records_out += len(records)
            return
        if len(data) > self.config.batch_bytes and len(records) > 1:
            half = len(records) // 2
            await self._publish(channel, channel.watermark, False, 0, records[:half])
            await self._publish(channel, watermark, eos, barrier, records[half:])
            return
        self.backpressure_s += await channel.acquire()  # one credit per frame, however many messages carry it
        channel.seq, channel.watermark = seq, watermark
        for message in split_message(data, self.processor, self.index, self.epoch, self.max_message):
            await self.nc.publish(channel.subject, message)
        self.frames_out += 1
        self.bytes_out += len(data)
        self.records_out += len(records)
