"""The one JetStream pull reader: the bus's JetStream source and the Spark data source
both read a stream through it.

A :class:`PullReader` reads a stream's messages on some subjects, in stream-sequence
order, from a start sequence on, up to an optional last one, through an ephemeral ordered
pull consumer (deliver by start sequence, no acks, in memory). It keeps pull requests
open on one inbox for at most the free room of a bounded buffer, so memory stays bounded
and the stream is read no faster than the caller drains it; a message is in the buffer
as soon as it arrives. Each delivery's sequence, consumer sequence, time stamp and pending
count come from its reply subject (:func:`parse_ack_reply`), so no per-message API call
is made. A gap in the consumer sequence, a silent request (no idle heartbeat) or a lost
consumer start a new consumer right after the last sequence read, as ordered consumers
do, so each message is read once, in order.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import math
import threading
import time
from operator import itemgetter

import nats

from gearbus.connectors.jetstream import JetStreamError, api, stream_info

log = logging.getLogger(__name__)

BUFFER_BYTES = 32 << 20         # buffered bytes (exceeded by at most one message's max payload per request)
PULL_EXPIRES_S = 30.0           # a pull request lingers this long on a caught-up stream
HEARTBEAT_S = 2.0               # the server's idle heartbeat on an open pull request
CONSUMER_INACTIVE_S = 300.0     # the server drops a reader's consumer this long after the reader went away
CHECK_INTERVAL_S = 1.0          # how often the reader looks for silence when nothing wakes it
RESET_RETRIES = 10              # consecutive consumer resets without a message before the reader fails

#: Statuses that end a pull request in the normal course of things.
_REQUEST_ENDS = ("Request Timeout", "Batch Completed", "Message Size Exceeds MaxBytes", "No Messages")


def parse_ack_reply(reply: str) -> tuple[int, int, int, int]:
    """(stream seq, consumer seq, time stamp ns, pending) from a JetStream delivery's reply subject:
    ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`` or the v2 form
    with domain and account hash before the stream (and a random token at the end)."""
    t = reply.split(".")
    if len(t) == 9:
        return int(t[5]), int(t[6]), int(t[7]), int(t[8])
    return int(t[7]), int(t[8]), int(t[9]), int(t[10])


class PullReader:
    """Reads ``stream`` on ``subjects`` (filters; none: every subject) after sequence ``after``,
    up to sequence ``last`` (inclusive; None: no end), into :attr:`buffer` as
    ``(seq, subject, data, time stamp ns)``, at most ``max_records`` and about ``max_bytes``
    of them. Pull requests ask for at most ``batch`` messages each, at most ``in_flight``
    batches' worth outstanding at a time, once ``min_pull`` messages fit. Another request
    goes out as soon as a batch's worth has arrived, not when a request ends: the server
    serves its open requests in turn, so they end together, and the stream would stand
    idle between rounds.

    ``follow``: with ``last``, whether to wait for the stream to grow up to ``last`` (a live
    source); else the reader ends once it has everything the stream holds (a replayed range).

    :meth:`run` reads on the caller's event loop until the end (or fails, then :attr:`error`
    says why); :meth:`take` hands buffered messages over, from any thread.
    """

    def __init__(self, nc, stream: str, subjects: list[str], after: int, last: int | None, *, name: str,
                 max_records: int, max_bytes: int = BUFFER_BYTES, batch: int | None = None, in_flight: int = 1,
                 min_pull: int | None = None, follow: bool = True, stream_last: int = 0):
        self.nc, self.stream, self.subjects, self.name = nc, stream, list(subjects), name
        self.last, self.follow, self.stream_last = last, follow, stream_last
        self.max_records, self.max_bytes = max_records, max_bytes
        self.batch = batch or max_records
        self.in_flight = in_flight
        self._window = in_flight * self.batch  # messages asked for at most
        self._refill_at = self._window - self.batch  # outstanding messages when another batch fits
        self.min_pull = min_pull or max(1, max_records // 2)
        self.lock = threading.Lock()           # guards the buffer and its tallies (take() runs on other threads)
        self.buffer: collections.deque = collections.deque()
        self.buffered: collections.Counter = collections.Counter()  # subject -> messages in the buffer
        self.buffered_bytes = 0
        self.fetched = after                   # the last sequence put into the buffer
        self.complete = False                  # the buffer holds everything the stream has (as of late)
        self.ended = False                     # nothing more will come
        self.error: BaseException | None = None
        self._consumer: str | None = None
        self._sub = None
        self._inbox = ""
        self._requests = 0                     # pull requests made (each has its own reply subject)
        self._open: set[str] = set()           # reply subjects of the open pull requests
        self._outstanding = 0                  # messages asked for and not yet received
        self._cseq = 0                         # the consumer sequence of the last message
        self._trouble: str | None = None       # why the consumer must be replaced
        self._heard = time.monotonic()         # the last message or heartbeat
        self._wake = asyncio.Event()           # room in the buffer, a request done, or trouble
        self._arrived = asyncio.Event()        # :meth:`wait_for`'s count reached, or the end
        self._wanted = math.inf
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        if last is not None and after >= last:
            self.complete = self.ended = True

    # --- the caller's side ------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """Everything was read and taken."""
        with self.lock:
            return self.ended and not self.buffer

    def take(self, max_records: int) -> list[tuple]:
        """Up to ``max_records`` buffered messages, oldest first (from any thread)."""
        with self.lock:
            buffer = self.buffer
            if max_records >= len(buffer):
                items = list(buffer)
                buffer.clear()
            else:
                popleft = buffer.popleft
                items = [popleft() for _ in range(max_records)]
            self.buffered.subtract(collections.Counter(map(itemgetter(1), items)))
            self.buffered_bytes -= sum(map(len, map(itemgetter(2), items)))
            free = self.max_records - len(buffer) - self._outstanding
        if items and free >= self.min_pull and self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)
        return items

    async def wait_for(self, count: int) -> None:
        """Until ``count`` messages are buffered, or the reader ended or failed."""
        while len(self.buffer) < count and not self.ended and self.error is None:
            self._wanted = count
            self._arrived.clear()
            await self._arrived.wait()

    async def open(self) -> None:
        """Create the first consumer now, so what is wrong with the stream fails the caller at once."""
        if not self.ended:
            await self._new_consumer()

    async def close(self) -> None:
        """Stop reading and remove the consumer (the connection stays the caller's)."""
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._drop_consumer()

    # --- reading ----------------------------------------------------------------------

    async def run(self) -> None:
        """Keep pull requests open while the buffer has room; start a new consumer when the
        current one skipped messages, went silent or failed; give up (:attr:`error`) after
        RESET_RETRIES attempts in a row that delivered nothing."""
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        failures = 0
        try:
            while not self.ended:
                if self._cseq:  # the consumer delivered: past trouble is over
                    failures = 0
                if self._outstanding > 0 and time.monotonic() - self._heard > 3 * HEARTBEAT_S:
                    self._trouble = f"consumer {self._consumer} went silent"
                if self._trouble:
                    failures += 1
                    if failures > RESET_RETRIES:
                        raise JetStreamError(f"{self.name}: gave up after {RESET_RETRIES} attempts: {self._trouble}")
                    log.warning("%s: %s; reading again after sequence %d", self.name, self._trouble, self.fetched)
                    await asyncio.sleep(min(0.05 * 2 ** failures, 5.0) if failures > 1 else 0)
                try:
                    if self._trouble or self._consumer is None:
                        await self._new_consumer()
                    await self._pull()
                    if self.follow and self.complete and self.last is not None:
                        await self._look_for_the_last()
                except (JetStreamError, nats.errors.Error) as exc:
                    self._trouble = f"{type(exc).__name__}: {exc}"
                    continue
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), CHECK_INTERVAL_S)
                except TimeoutError:
                    pass
            await self._drop_consumer()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("%s: reading failed: %s", self.name, exc, exc_info=exc)
            self.error = exc
        finally:
            self._arrived.set()

    async def _new_consumer(self) -> None:
        """A consumer (and inbox) that delivers the subjects after the last sequence read."""
        await self._drop_consumer()
        self._open.clear()
        self._outstanding, self._cseq, self._trouble = 0, 0, None
        inbox = None

        async def deliver(msg) -> None:
            if self._sub is inbox and not self._trouble:  # nothing from a consumer given up
                self._on_message(msg)

        self._inbox = self.nc.new_inbox()  # request n gets its statuses on <inbox>.n
        inbox = self._sub = await self.nc.subscribe(self._inbox + ".*", cb=deliver, pending_msgs_limit=1_000_000,
                                                    pending_bytes_limit=1 << 30)
        config = {"deliver_policy": "by_start_sequence", "opt_start_seq": self.fetched + 1, "ack_policy": "none",
                  "replay_policy": "instant", "mem_storage": True, "num_replicas": 1,
                  "inactive_threshold": int(CONSUMER_INACTIVE_S * 1e9)}
        if len(self.subjects) == 1:
            config["filter_subject"] = self.subjects[0]
        elif self.subjects:
            config["filter_subjects"] = self.subjects
        info = await api(self.nc, f"$JS.API.CONSUMER.CREATE.{self.stream}", {"stream_name": self.stream,
                                                                             "config": config})
        self._consumer = info["name"]
        self._heard = time.monotonic()
        with self.lock:
            self._set_complete(int(info.get("num_pending", 0)) == 0)

    async def _look_for_the_last(self) -> None:
        """Learn whether the stream has reached ``last``; once it has, whether the subjects
        are read up to it, which only the consumer, asked after the stream was seen at
        ``last``, can say. ``complete`` is as of when the server counted a delivery's pending
        messages, which may be before the stream reached ``last``: messages may have been
        stored for the subjects since, before ``last`` on another subject. And a delivery is
        handled in its subscription's turn, so one the server sent before it answered about
        the stream may be handled after: its "none pending" ended the reader without the
        messages stored after it (both lost the tail of a live stream)."""
        if self.stream_last < self.last:
            self.stream_last = (await stream_info(self.nc, self.stream))["state"]["last_seq"]
            if self.stream_last < self.last:
                return
        info = await api(self.nc, f"$JS.API.CONSUMER.INFO.{self.stream}.{self._consumer}")
        # every delivery handled: counted in the consumer's own sequence, as a stream sequence
        # may be past the last one read (a consumer made after a restart starts beyond what
        # its subjects hold)
        delivered = info.get("delivered", {}).get("consumer_seq", 0)
        with self.lock:
            self.complete = int(info.get("num_pending", 0)) == 0 and delivered <= self._cseq
            if self.complete:
                self._end()

    def _set_complete(self, complete: bool) -> None:
        """Whether the buffer holds all the stream has for the subjects (under the lock): the
        end of a replayed range; a reader following the stream up to ``last`` asks its
        consumer first (:meth:`_look_for_the_last`), at once if the stream was at ``last``."""
        self.complete = complete
        if complete and not self.follow:
            self._end()
        elif complete and self.last is not None and self.stream_last >= self.last:
            self._wake.set()

    def _end(self) -> None:
        self.ended = True
        self._wake.set()
        self._arrived.set()

    async def _drop_consumer(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            try:
                await sub.unsubscribe()
            except Exception as exc:  # the connection may be gone; the consumer expires anyway
                log.debug("%s: unsubscribing: %s", self.name, exc)
        if self._consumer is not None:
            name, self._consumer = self._consumer, None
            try:
                await api(self.nc, f"$JS.API.CONSUMER.DELETE.{self.stream}.{name}", timeout=2.0)
            except Exception as exc:  # gone already, or it expires on its own
                log.debug("%s: deleting consumer %s: %s", self.name, name, exc)

    async def _pull(self) -> None:
        """Ask for as many messages as the buffer has room for (once ``min_pull`` fit), no more
        than up to ``last``."""
        with self.lock:
            room = self.max_records - len(self.buffer) - self._outstanding
            free_bytes = self.max_bytes - self.buffered_bytes
        remaining = self.last - self.fetched - self._outstanding if self.last is not None else room
        free, threshold = min(room, remaining), min(self.min_pull, remaining)
        max_bytes = max(free_bytes // self.in_flight, self.nc.max_payload)
        while free > 0 and free >= threshold and free_bytes > 0 and self._outstanding + min(self.batch, free) <= self._window:
            n = min(self.batch, free)
            self._requests += 1
            reply = f"{self._inbox}.{self._requests}"
            self._open.add(reply)
            self._outstanding += n
            free -= n
            self._heard = time.monotonic()
            request = {"batch": n, "max_bytes": max_bytes, "expires": int(PULL_EXPIRES_S * 1e9),
                       "idle_heartbeat": int(HEARTBEAT_S * 1e9)}
            await self.nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self._consumer}",
                                  json.dumps(request).encode(), reply=reply)

    def _on_message(self, msg) -> None:
        if not msg.reply:
            self._on_status(msg)
            return
        seq, cseq, ns, pending = parse_ack_reply(msg.reply)
        self._heard = time.monotonic()
        if cseq != self._cseq + 1:
            self._trouble = f"consumer {self._consumer} skipped from {self._cseq} to {cseq}"
            self._wake.set()
            return
        self._cseq = cseq
        self._outstanding -= 1
        if self._outstanding <= 0:  # every open request is served
            self._outstanding = 0
            self._open.clear()
            self._wake.set()
        elif self._outstanding == self._refill_at:  # another batch fits
            self._wake.set()
        if seq <= self.fetched:
            return
        subject, data, buffer = msg.subject, msg.data, self.buffer
        with self.lock:
            if self.last is not None and seq > self.last:
                self.complete = True
                self._end()
                return
            buffer.append((seq, subject, data, ns))
            self.buffered[subject] += 1
            self.buffered_bytes += len(data)
            self.fetched = seq
            if seq == self.last:
                self.complete = True
                self._end()
            elif pending:
                self.complete = False
            else:
                self._set_complete(True)
            if len(buffer) >= self._wanted:
                self._wanted = math.inf  # wakes the waiter once; it asks again
                self._arrived.set()

    def _on_status(self, msg) -> None:
        """A heartbeat, or the end of an open pull request (expired, complete or refused)."""
        self._heard = time.monotonic()
        headers = msg.headers or {}
        status = headers.get("Status")
        if status == "100" or msg.subject not in self._open:  # a heartbeat, or about a request already done
            return
        self._open.discard(msg.subject)
        left = headers.get("Nats-Pending-Messages")
        if not self._open:
            self._outstanding = 0
        elif left:
            self._outstanding = max(0, self._outstanding - int(left))
        if headers.get("Description") not in _REQUEST_ENDS:
            self._trouble = (f"consumer {self._consumer}: pull request ended with {status} "
                             + " ".join(str(headers.get("Description", "")).split()))
        self._wake.set()
