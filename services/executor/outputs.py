"""The executor's shell around a task's :class:`~gearbus.runtime.sender.Sender`: it
publishes the frames the sender decides over NATS (or hands them to a receiver in the
same executor), each once its channel has credit, and wakes on grants."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gearbus.runtime.frames import Frame, split_message
from gearbus.control.config import AppConfig
from gearbus.runtime.sender import Channel, Outgoing, Sender
from shared import subjects

__all__ = ["Outputs"]


class Outputs:
    """All out edges of one task, on the bus."""

    def __init__(self, nc, app_id: int, processor: int, index: int, epoch: int, edges, config: AppConfig):
        """``edges`` is a list of (partitioner, downstream processor id, downstream parallelism)."""
        self.nc = nc
        self.app_id = app_id
        self.sender = Sender(processor, index, epoch, edges, config)
        self._receivers()
        self.backpressure_s = 0.0

    def _receivers(self) -> None:
        self.subjects = {receiver: subjects.task_inbox(self.app_id, *receiver) for receiver in self.sender.channels}
        self.credit = {receiver: asyncio.Event() for receiver in self.sender.channels}
        self.local: dict[tuple[int, int], Callable[[Frame, int], None]] = {}

    def rewire(self, epoch: int, edges) -> None:
        """Go on in ``epoch`` over these edges (see Sender.rewire); receivers in this
        executor are linked again (:meth:`link_local`)."""
        self.sender.rewire(epoch, edges)
        self._receivers()

    def link_local(self, deliver: dict[tuple[int, int], Callable[[Frame, int], None]]) -> None:
        """Deliver straight into the inboxes of receivers hosted by this executor: frames
        are handed over as objects, skipping msgpack decoding and NATS."""
        self.local = {receiver: deliver[receiver] for receiver in self.sender.channels if receiver in deliver}

    def grant(self, processor: int, index: int, epoch: int, consumed: int, window: int) -> bool:
        """Credit from a receiver; accepted only from a known receiver of this attempt."""
        channel = self.sender.grant(processor, index, epoch, consumed, window)
        if channel is None:
            return False
        self.credit[channel.receiver].set()
        return True

    async def publish(self, outgoing: list[Outgoing]) -> None:
        """Send each frame in order, waiting for its channel's credit first. Frames handed
        over locally were encoded all the same: a value that cannot travel fails at the
        sender, whichever executor its receiver happens to be in."""
        for channel, frame, data in outgoing:
            if not channel.has_credit(frame.seq):
                self.backpressure_s += await self._wait_for_credit(channel, frame.seq)
            local = self.local.get(channel.receiver)
            if local is not None:
                local(frame, len(data))
                continue
            max_message = max(self.nc.max_payload - 256, 1024)
            for message in split_message(data, frame.src_processor, frame.src_index, frame.epoch, max_message):
                await self.nc.publish(self.subjects[channel.receiver], message)

    async def _wait_for_credit(self, channel: Channel, seq: int) -> float:
        """Wait until frame ``seq`` is within the window; return the seconds waited: the
        time this sender was back-pressured."""
        started = time.perf_counter()
        available = self.credit[channel.receiver]
        while not channel.has_credit(seq):
            available.clear()
            await available.wait()
        return time.perf_counter() - started
