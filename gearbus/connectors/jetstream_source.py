"""Pipelines read NATS: a JetStream stream (replayable, so exactly-once with checkpoints)
and a core-NATS subject (at-most-once).

Both keep their NATS connection on a thread of their own (:class:`LoopThread`): ``read``
is synchronous and runs on the executor's event loop, so it only takes what a background
reader has already put into a bounded buffer.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import datetime
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from gearbus.api.task import DataSource, NotRescalable, Record, TaskContext, new_record, now_ms
from gearbus.api.watermarks import WATERMARK_MIN
from gearbus.connectors.jetstream import (API_TIMEOUT, JetStreamError, api, close_thread, connect, on_connection,
                                        server_list, servers_for, stream_info)
from gearbus.connectors.jetstream_reader import CONSUMER_INACTIVE_S, PullReader
from gearbus.connectors.jetstream_subjects import owned_subjects, position_and_skip, read_to
from shared.loop_thread import LoopThread

log = logging.getLogger(__name__)

BUFFER_RECORDS = 8_192          # messages a source task holds ahead of the pipeline
PROBE_INTERVAL_S = 1.0          # while behind: how often to ask which quiet partitions got new messages
PROBE_CONCURRENCY = 64
IDLE_TIMEOUT_MS = 1_000         # a live partition with nothing new stops holding the watermark after this
LIVE_WAIT_S = 0.02              # idle_wait_s when caught up with the stream
BEHIND_WAIT_S = 0.002           # ... and when more is on its way
NO_SUBJECT_WAIT_S = 0.1         # ... and when the task has no subject yet
DISCOVER_INTERVAL_S = 1.0       # how often a task looks for subjects that appeared in the stream


def _text(data: bytes) -> str:
    return data.decode("utf-8")


_DECODERS: dict[str, Callable[[bytes], Any] | None] = {"json": json.loads, "text": _text, "bytes": None}


def decoder(decode) -> Callable[[bytes], Any] | None:
    """The function that turns a message's bytes into a value (None: the bytes themselves)."""
    if callable(decode):
        return decode
    if decode not in _DECODERS:
        raise ValueError(f"decode must be one of {', '.join(map(repr, _DECODERS))} or a callable, got {decode!r}")
    return _DECODERS[decode]


def partition_watermark(max_ts: dict[str, int], holding: list[str], max_out_of_orderness_ms: int) -> int:
    """The watermark of partitions with newest timestamps ``max_ts``: the minimum over those
    still ``holding`` it (with more to come) of their newest − ``max_out_of_orderness_ms``
    − 1 (one not yet read: WATERMARK_MIN); when none holds it, the newest of all."""
    delay = max_out_of_orderness_ms + 1
    if holding:
        return min(max_ts[s] - delay if s in max_ts else WATERMARK_MIN for s in holding)
    return max(max_ts.values()) - delay


async def publish_dead_letter(nc, dead_letter: str, stream: str, seq: int, subject: str, data: bytes,
                              error: str) -> None:
    """Republish a message that did not decode to ``dead_letter``, saying why and whence."""
    await nc.publish(dead_letter, data, headers={
        "Gearbus-Error": " ".join(error.split())[:1000],
        "Gearbus-Source": f"{stream}/{seq}/{subject}",
        "Nats-Msg-Id": f"gearbus-dead-letter/{stream}/{seq}",  # a replay does not store it twice
    })


def republish(servers: list[str], dead_letter: str, stream: str, items: list[tuple[int, str, bytes, str]],
              creds: str | None = None) -> None:
    """:func:`publish_dead_letter` each (seq, subject, data, error) on a connection of its own."""
    if not items:
        return

    async def publish(nc) -> None:
        for seq, subject, data, error in items:
            await publish_dead_letter(nc, dead_letter, stream, seq, subject, data, error)
        await nc.flush(timeout=API_TIMEOUT)

    on_connection(servers, publish, creds, name="gearbus-dead-letter")


async def _subjects(nc, stream: str, subject_filter: str) -> list[str]:
    """The stream's concrete subjects matching a filter (paged as the server pages them)."""
    found: list[str] = []
    while True:
        reply = await api(nc, f"$JS.API.STREAM.INFO.{stream}", {"subjects_filter": subject_filter,
                                                                 "offset": len(found)})
        page = list((reply["state"].get("subjects") or {}).keys())
        found.extend(page)
        if not page or len(found) >= reply.get("total", 0):
            return found


async def _sequence_before(nc, stream: str, when: datetime.datetime, subjects: list[str]) -> int:
    """The last stream sequence before ``when``: the one a consumer started at that time
    reports as delivered (no message is fetched)."""
    jsm = nc.jsm()
    config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME,
                            opt_start_time=when.astimezone(datetime.timezone.utc).isoformat(),
                            ack_policy=AckPolicy.NONE, filter_subjects=subjects, mem_storage=True,
                            inactive_threshold=CONSUMER_INACTIVE_S)
    info = await jsm.add_consumer(stream, config, timeout=API_TIMEOUT)
    await jsm.delete_consumer(stream, info.name)
    return info.delivered.stream_seq


class _Decoding:
    """Turns message bytes into values; what fails to decode is counted (and republished
    to a dead-letter subject when there is one) instead of failing the task."""

    dead_letter: str | None = None
    dead_letters = 0

    def _values(self, items: list[tuple], data_at: int) -> tuple[list[Any], list[tuple]]:
        """The decoded values of ``items`` (tuples holding the bytes at ``data_at``) and the
        items they came from, without those that failed to decode."""
        decode = self._decode
        if decode is None:
            return [item[data_at] for item in items], items
        try:
            return [decode(item[data_at]) for item in items], items
        except Exception:
            pass
        values, kept = [], []
        for item in items:
            try:
                values.append(decode(item[data_at]))
            except Exception as exc:
                self._reject(item, exc)
                continue
            kept.append(item)
        return values, kept

    def _reject(self, item: tuple, exc: Exception) -> None:
        self.dead_letters += 1
        if self.dead_letters == 1 or self.dead_letters % 1000 == 0:  # a stream of garbage: not a line each
            log.warning("%s: %d messages not decoded so far, the latest: %s: %s%s", self._name, self.dead_letters,
                        type(exc).__name__, exc, f" (republished to {self.dead_letter})" if self.dead_letter else "")
        if self.dead_letter:
            self._thread.submit(self._republish(item, f"{type(exc).__name__}: {exc}"))


class JetStreamSource(_Decoding, DataSource):
    """Reads a JetStream stream. Replayable: a checkpoint records the read position and a
    recovery reads again exactly from it.

    Partitions are the stream's concrete subjects that match ``subjects`` (literal or
    wildcards; default: the stream's own subjects). Each belongs to one task by its hash
    (:mod:`~gearbus.connectors.jetstream_subjects`), so every task decides alone which are
    its own. The stream may hold no message yet: a task looks for subjects that appear
    (every DISCOVER_INTERVAL_S) and reads each of its own from its first message after the
    start, also after a recovery or a rescale (which hands every subject's read position
    to its new task, :meth:`rescale`). Only a stream that does not exist fails :meth:`open`.

    A task reads its subjects in stream-sequence order through one
    :class:`~gearbus.connectors.jetstream_reader.PullReader` (one ephemeral pull consumer
    over its subjects), so its position is a single stream sequence: the last one handed
    to the pipeline. The reader keeps one pull request open for at most the free room of
    the buffer, so the buffer is bounded exactly and the stream is read no faster than the
    pipeline drains it; a message is handed over as soon as it arrives (nats-py's
    ``fetch`` waits for a full batch or its expiry: latency on a live stream).

    ``start``: "first", "new" (what arrives after :meth:`open`), a stream sequence (int) or
    a ``datetime``. ``until``: None (never ends), "now" (ends after the last message in
    the stream at :meth:`open`) or a stream sequence.

    Event time is ``timestamp_fn(value)``, else the stream's timestamp. The watermark is
    per partition (:meth:`watermark`); a partition stops holding it back once nothing more
    is in the stream for it (with ``until``: at once; otherwise after ``idle_timeout_ms``
    without a record, so a slow but live partition still holds it); with the stream's
    timestamps, a task with no partition, or only quiet ones, follows the clock.
    """

    replayable = True
    checked_at_submit = True
    event_time = True
    _name = "jetstream source"

    def __init__(self, stream: str, subjects: str | list[str] | None = None, *, start="first", until=None,
                 decode="json", timestamp_fn: Callable[[Any], int] | None = None, max_out_of_orderness_ms: int = 0,
                 servers: str | list[str] | None = None, dead_letter: str | None = None,
                 buffer_records: int = BUFFER_RECORDS, idle_timeout_ms: int = IDLE_TIMEOUT_MS, creds: str | None = None):
        if not isinstance(stream, str) or not stream:
            raise ValueError(f"stream must be a non-empty string, got {stream!r}")
        if not (start in ("first", "new") or isinstance(start, datetime.datetime)
                or (isinstance(start, int) and not isinstance(start, bool) and start >= 1)):
            raise ValueError(f"start must be 'first', 'new', a stream sequence >= 1 or a datetime, got {start!r}")
        if not (until is None or until == "now" or (isinstance(until, int) and not isinstance(until, bool)
                                                    and until >= 0)):
            raise ValueError(f"until must be None, 'now' or a stream sequence, got {until!r}")
        if not isinstance(max_out_of_orderness_ms, int) or max_out_of_orderness_ms < 0:
            raise ValueError(f"max_out_of_orderness_ms must be a non-negative integer, got {max_out_of_orderness_ms!r}")
        if timestamp_fn is not None and not callable(timestamp_fn):
            raise ValueError(f"timestamp_fn {timestamp_fn!r} is not callable")
        if not isinstance(buffer_records, int) or buffer_records < 1:
            raise ValueError(f"buffer_records must be a positive integer, got {buffer_records!r}")
        decoder(decode)
        self.stream = stream
        self.subjects = [subjects] if isinstance(subjects, str) else list(subjects or [])
        self.start = start
        self.until = until
        self.decode = decode
        self.timestamp_fn = timestamp_fn
        self.max_out_of_orderness_ms = max_out_of_orderness_ms
        self.servers = server_list(servers)
        self.creds = creds
        self.dead_letter = dead_letter
        self.buffer_records = buffer_records
        self.idle_timeout_ms = idle_timeout_ms
        self._name = f"jetstream source {stream}"

    # --- lifecycle (the task's thread) ---------------------------------------------

    def open(self, context: TaskContext) -> None:
        """Find this task's subjects and where to start and stop; reads nothing yet."""
        servers = servers_for(self.servers, context, f"read_jetstream({self.stream!r})")
        self._decode = decoder(self.decode)
        self._name = f"jetstream source {self.stream}[{context.index}]"
        self._last_seq: dict[str, int] = {}  # subject -> its last sequence in the stream, as last probed
        self._reader: PullReader | None = None
        self._probing = None
        self._max_ts: dict[str, int] = {}
        self._skip: dict[str, int] = {}  # subject -> read up to this sequence, ahead of the position (a rescale's)
        self._active: dict[str, float] = {}
        self._watermark: int | None = None
        self._index, self._parallelism = context.index, context.parallelism
        self._discovery = None
        self._arrivals: dict[str, int] = {}  # subject -> read up to: found by the discovery, not yet read
        self._arrivals_lock = threading.Lock()
        self._newest_elsewhere: int | None = None  # with timestamp_fn, for a task with no subject: see _idle_floor
        self._thread = LoopThread("jetstream-source")
        self._listed_ms: int | None = now_ms()  # every message stored before it is on a subject listed since
        try:
            self._nc = self._thread.call(connect(servers, name="gearbus-jetstream-source", creds=self.creds))
            self._owned, self._position, self._until, self._stream_last = self._thread.call(
                self.locate(self._nc, context.index, context.parallelism))
        except BaseException:
            self.close()
            raise
        self._base: int | None = self._position  # new subjects are read after it (None: not looked for)
        self._listed_at = self._stream_last  # every subject with a message up to it is known

    async def locate(self, nc, index: int = 0, parallelism: int = 1) -> tuple[list[str], int, int | None, int]:
        """Task ``index`` of ``parallelism``'s subjects now, the sequence to read after, the last
        one to read (None: no end) and the stream's last sequence now. A stream without
        messages on the subjects yet is no error (the task waits for them); a stream that
        does not exist is."""
        last, every = await self._listing(nc)
        owned = owned_subjects(every, index, parallelism)
        until = last if self.until == "now" else self.until
        start = self.start
        if start == "first":
            position = 0
        elif start == "new":
            position = last
        elif isinstance(start, datetime.datetime):
            position = await _sequence_before(nc, self.stream, start, owned) if owned else last
        else:
            position = start - 1
        return owned, position, until, last

    async def _listing(self, nc) -> tuple[int, set[str]]:
        """The stream's last sequence and the subjects matching the source's filters that
        hold messages (each one holding a message up to that sequence among them)."""
        try:
            info = await stream_info(nc, self.stream)
        except JetStreamError as exc:
            if "not found" in str(exc):
                raise JetStreamError(f"JetStream stream {self.stream!r} does not exist") from None
            raise
        filters = self.subjects or info["config"].get("subjects") or [">"]  # a mirror has no subjects
        every: set[str] = set()
        for subject_filter in filters:
            every.update(await _subjects(nc, self.stream, subject_filter))
        return info["state"]["last_seq"], every

    def snapshot(self) -> dict:
        return {"seq": self._position, "until": self._until, "subjects": list(self._owned),
                "max_ts": dict(self._max_ts), "skip": dict(self._skip), "base": self._base}

    def restore(self, state: dict) -> None:
        """Read on right after the checkpoint's position, the checkpoint's subjects, up to
        the checkpoint's end (so ``until="now"`` keeps meaning the first run's now); subjects
        of this task the checkpoint does not name are read from their first message after
        the start. A checkpoint from before subjects were assigned by hash has no ``base``:
        its task reads its own subjects and looks for no others."""
        if self._reader is not None:
            raise RuntimeError(f"{self._name}: restore() after the first read()")
        self._position = state["seq"]
        self._until = state["until"]
        self._owned = list(state["subjects"])
        self._max_ts = dict(state["max_ts"])
        self._skip = {subject: seq for subject, seq in state.get("skip", {}).items() if seq > self._position}
        self._base = state.get("base")
        self._listed_at, self._listed_ms = 0, None  # the checkpoint's subjects: not all there are now

    def rescale(self, states: list, index: int, parallelism: int) -> dict | None:
        """Task ``index`` of ``parallelism``'s state from every old task's: the subjects
        spread anew by their hash (:mod:`~gearbus.connectors.jetstream_subjects`), each read
        on from where its old task was; the task's position is the lowest of its subjects',
        and it skips what each of the others had read."""
        states = [state for state in states if state is not None]
        if not states:
            return None
        ends = {state["until"] for state in states}
        if len(ends) > 1:
            raise NotRescalable(f"{self._name}: its tasks end at different stream sequences ({sorted(ends)}: "
                                "until='now' was read when each started)")
        everywhere = {subject: seq for state in states
                      for subject, seq in read_to(state["seq"], state["subjects"], state.get("skip", {})).items()}
        owned = owned_subjects(everywhere, index, parallelism)
        position, skip = position_and_skip({s: everywhere[s] for s in owned}, max(s["seq"] for s in states))
        bases = [state.get("base") for state in states]
        return {"seq": position, "until": ends.pop(), "subjects": owned,
                "max_ts": {subject: ts for state in states for subject, ts in state["max_ts"].items()
                           if subject in owned},
                "skip": skip, "base": None if None in bases else min(bases)}

    def close(self) -> None:
        """Stop the reader, remove its consumer and disconnect."""
        close_thread(self, self._shutdown, self._name)

    async def _shutdown(self) -> None:
        if self._discovery is not None:
            self._discovery.cancel()
            await asyncio.gather(self._discovery, return_exceptions=True)
        await self._stop_reader()
        nc = getattr(self, "_nc", None)
        if nc is None or nc.is_closed:
            return
        await nc.flush(timeout=API_TIMEOUT)  # dead letters on their way
        await nc.close()

    # --- reading (the task's thread) -------------------------------------------------

    def read(self, max_records: int) -> list[Record] | None:
        self._take_new_subjects()
        if self._until is not None and self._all_listed() and (not self._owned or self._position >= self._until):
            return None
        if not self._owned:
            return []
        reader = self._reader or self._start_reader()
        if reader.error is not None:
            raise reader.error
        items = reader.take(max_records)
        if not items:
            return None if reader.finished and self._all_listed() else []
        last = items[-1][0]
        if self._skip:  # what a subject's old task had read already (after a rescale)
            skip = self._skip
            items = [item for item in items if item[0] > skip.get(item[1], 0)]
            self._skip = {subject: seq for subject, seq in skip.items() if seq > last}
            if not items:
                self._position = last
                return []
        values, items = self._values(items, 2)
        fn = self.timestamp_fn
        if fn is None:
            records = [new_record(Record, (v, item[3] // 1_000_000, None)) for v, item in zip(values, items)]
        else:
            records = [new_record(Record, (v, int(fn(v)), None)) for v in values]
        self._position = last
        max_ts, now = self._max_ts, time.monotonic()
        for record, item in zip(records, items):
            subject = item[1]
            if record[1] > max_ts.get(subject, WATERMARK_MIN):
                max_ts[subject] = record[1]
            self._active[subject] = now
        return records

    def idle_wait_s(self) -> float:
        if not getattr(self, "_owned", None):
            return NO_SUBJECT_WAIT_S
        reader = self._reader
        if reader is None:
            return BEHIND_WAIT_S
        if reader.error is not None or reader.buffer:
            return 0.0
        return LIVE_WAIT_S if reader.complete else BEHIND_WAIT_S

    def watermark(self) -> int | None:
        """The minimum over this task's partitions of (the newest timestamp read there −
        ``max_out_of_orderness_ms`` − 1: a record as new as the newest may still come), over
        the partitions that may still deliver records: one with messages ahead of the read
        position (buffered, or known in the stream) or, on an unbounded stream, one that had
        a record in the last ``idle_timeout_ms``. When none may, the newest of them all, and
        no less than :meth:`_idle_floor`, so a task with no subject (yet) does not hold the
        app's watermark back. None until a record was read or the floor is known; it never
        goes back."""
        reader = self._reader
        if self._owned and reader is None:  # before the first read, or new subjects were just taken
            return self._watermark
        holding = self._holding(reader) if reader is not None else []
        current = partition_watermark(self._max_ts, holding, self.max_out_of_orderness_ms) if self._max_ts else None
        floor = None if holding else self._idle_floor()
        if floor is not None and (current is None or floor > current):
            current = floor
        if current is not None and (self._watermark is None or current > self._watermark):
            self._watermark = current
        return self._watermark

    def _idle_floor(self) -> int | None:
        """How far the watermark of a task whose subjects may deliver nothing now can go
        (None: no further). With the stream's timestamps: the time of the last look for new
        subjects − ``idle_timeout_ms`` − ``max_out_of_orderness_ms`` − 1, as a message stored
        since is newer (a subject that appears later is not late). With ``timestamp_fn``, for a
        task with no subject: the oldest event time of the other subjects' last messages −
        ``max_out_of_orderness_ms`` − 1; their own tasks hold the app back while they read
        (a subject that appears later with older event times is late, as after Flink's
        source idleness); none while the stream has no subject."""
        if self._base is None:
            return None
        with self._arrivals_lock:
            listed, arriving, elsewhere = self._listed_ms, bool(self._arrivals), self._newest_elsewhere
        if arriving:
            return None
        delay = self.max_out_of_orderness_ms
        if self.timestamp_fn is None:
            return None if listed is None else listed - self.idle_timeout_ms - delay - 1
        return None if self._owned or elsewhere is None else elsewhere - delay - 1

    def _holding(self, reader: PullReader) -> list[str]:
        """The subjects that may still deliver records (see :meth:`watermark`)."""
        bounded = self._until is not None
        position, now, idle_after = self._position, time.monotonic(), self.idle_timeout_ms / 1000
        with reader.lock:
            complete, buffered, last_seq = reader.complete, reader.buffered, self._last_seq
            return [subject for subject in self._owned
                    if buffered[subject] > 0
                    or (not complete and last_seq.get(subject, position + 1) > position)
                    or (not bounded and now - self._active.get(subject, now) < idle_after)]

    # --- subjects that appear (the task's thread, and the source's loop) ---------------

    def _all_listed(self) -> bool:
        """Every subject with a message up to ``until`` is among this task's subjects or
        known not to be its own (a bounded source ends only then)."""
        if self._base is None:
            return True
        with self._arrivals_lock:
            return self._listed_at >= self._until and not self._arrivals

    def _take_new_subjects(self) -> None:
        """Start looking for subjects that appear; read those found since the last call
        from their first message on: the position goes back to it, and the subjects read
        further skip what they had read. The reader starts anew (what it buffered and did
        not hand over is read again)."""
        if self._base is None:
            return
        if self._discovery is None:
            self._discovery = self._thread.call(self._start_discovery())
        with self._arrivals_lock:  # the discovery knows a subject as new until it is owned
            arrivals, self._arrivals = self._arrivals, {}
            if not arrivals:
                return
            read = read_to(self._position, self._owned, self._skip) | arrivals
            self._position, self._skip = position_and_skip(read, self._position)
            self._owned = sorted(read)
        log.info("%s: reading subjects %s as they appeared", self._name, ", ".join(sorted(arrivals)))
        if self._reader is not None:
            self._thread.call(self._stop_reader())
            self._reader = None

    async def _start_discovery(self) -> asyncio.Task:
        return asyncio.create_task(self._discover())

    async def _discover(self) -> None:
        """Every DISCOVER_INTERVAL_S, list the stream's subjects; put this task's new ones
        in ``_arrivals`` with the sequence before their first message after the start.
        A bounded source stops once it has listed the stream at its end."""
        while True:
            try:
                await self._discover_once()
            except (JetStreamError, nats.errors.Error) as exc:  # the reader fails on its own if the stream is gone
                log.warning("%s: looking for new subjects: %s: %s", self._name, type(exc).__name__, exc)
            if self._until is not None and self._listed_at >= self._until:
                return
            await asyncio.sleep(DISCOVER_INTERVAL_S)

    async def _discover_once(self) -> None:
        started = now_ms()
        last, every = await self._listing(self._nc)
        with self._arrivals_lock:
            known = set(self._owned) | set(self._arrivals)
        new = [subject for subject in owned_subjects(every, self._index, self._parallelism) if subject not in known]
        limit = asyncio.Semaphore(PROBE_CONCURRENCY)

        async def read_to_before(subject: str) -> tuple[str, int]:
            async with limit:
                first = await self._first_after(subject, self._base)
            return subject, max(last, self._base) if first is None else first - 1

        found = dict(await asyncio.gather(*map(read_to_before, new)))
        alone = not known and not found  # no subject of its own
        elsewhere = await self._oldest_newest(every) if self.timestamp_fn is not None and alone else None
        with self._arrivals_lock:
            self._arrivals.update(found)
            self._newest_elsewhere = elsewhere
            self._listed_at = max(self._listed_at, last)
            self._listed_ms = max(self._listed_ms or 0, started)

    async def _oldest_newest(self, subjects: set[str]) -> int | None:
        """The oldest of the event times of ``subjects``' last messages (those that decode
        and stamp); None when there is none."""
        limit = asyncio.Semaphore(PROBE_CONCURRENCY)

        async def newest(subject: str) -> int | None:
            async with limit:
                try:
                    reply = await api(self._nc, f"$JS.API.STREAM.MSG.GET.{self.stream}", {"last_by_subj": subject})
                except JetStreamError:  # gone since the listing
                    return None
            data = base64.b64decode(reply["message"].get("data") or b"")
            try:
                return int(self.timestamp_fn(data if self._decode is None else self._decode(data)))
            except Exception:  # its own task dead-letters it or fails on it
                return None

        times = [t for t in await asyncio.gather(*map(newest, subjects)) if t is not None]
        return min(times, default=None)

    async def _first_after(self, subject: str, seq: int) -> int | None:
        """The sequence of ``subject``'s first message after ``seq`` (None: none now)."""
        try:
            reply = await api(self._nc, f"$JS.API.STREAM.MSG.GET.{self.stream}",
                              {"seq": seq + 1, "next_by_subj": subject})
        except JetStreamError as exc:
            if "no message found" in str(exc):
                return None
            raise
        return reply["message"]["seq"]

    # --- the reader (the source's own thread and loop) ----------------------------------

    def _start_reader(self) -> PullReader:
        start = time.monotonic()
        self._active.update({subject: start for subject in self._owned})
        self._reader = PullReader(self._nc, self.stream, self._owned, self._position, self._until, name=self._name,
                                  max_records=self.buffer_records, stream_last=self._stream_last)
        self._thread.submit(self._read_and_probe())
        return self._reader

    async def _read_and_probe(self) -> None:
        self._probing = asyncio.create_task(self._probe_while_behind())
        await self._reader.run()

    async def _stop_reader(self) -> None:
        if self._probing is not None:
            self._probing.cancel()
            await asyncio.gather(self._probing, return_exceptions=True)
            self._probing = None
        if self._reader is not None:
            await self._reader.close()

    async def _probe_while_behind(self) -> None:
        """Learn each subject's last sequence now, then, on an endless stream while the
        reader is behind, which quiet subjects got new messages since (for the watermark)."""
        reader, subjects = self._reader, self._owned
        while True:
            if subjects:
                try:
                    await self._probe(subjects)
                except (JetStreamError, nats.errors.Error) as exc:  # the reader resets or fails on its own
                    log.warning("%s: probing subjects: %s: %s", self._name, type(exc).__name__, exc)
            if self._until is not None or reader.ended:
                return
            await asyncio.sleep(PROBE_INTERVAL_S)
            subjects = [] if reader.complete else self._quiet()

    def _quiet(self) -> list[str]:
        """Owned subjects with nothing known ahead of the read position."""
        position, reader = self._position, self._reader
        with reader.lock:
            return [s for s in self._owned if reader.buffered[s] == 0 and self._last_seq.get(s, 0) <= position]

    async def _probe(self, subjects: list[str]) -> None:
        """Learn each subject's last sequence in the stream (for the watermark)."""
        limit = asyncio.Semaphore(PROBE_CONCURRENCY)

        async def last(subject: str) -> tuple[str, int]:
            async with limit:
                try:
                    reply = await api(self._nc, f"$JS.API.STREAM.MSG.GET.{self.stream}", {"last_by_subj": subject})
                except JetStreamError as exc:
                    if "no message found" in str(exc):
                        return subject, 0
                    raise
                return subject, reply["message"]["seq"]

        found = await asyncio.gather(*(last(s) for s in subjects))
        with self._reader.lock:
            self._last_seq.update(found)

    async def _republish(self, item: tuple, error: str) -> None:
        await publish_dead_letter(self._nc, self.dead_letter, self.stream, item[0], item[1], item[2], error)


class NatsSubjectSource(_Decoding, DataSource):
    """Reads a core-NATS subject (``queue`` group optional; with parallelism > 1 and no
    group, the tasks share one so each message reaches one task).

    At-most-once by nature: core NATS keeps nothing, so messages published while the task
    is down, or that arrive while its buffer is full, are lost (counted in ``dropped``).
    Not replayable, and it never ends. Event time is the arrival time.
    """

    _name = "nats source"

    def __init__(self, subject: str, *, decode="json", queue: str | None = None,
                 servers: str | list[str] | None = None, buffer_records: int = BUFFER_RECORDS, creds: str | None = None):
        if not isinstance(subject, str) or not subject:
            raise ValueError(f"subject must be a non-empty string, got {subject!r}")
        if not isinstance(buffer_records, int) or buffer_records < 1:
            raise ValueError(f"buffer_records must be a positive integer, got {buffer_records!r}")
        decoder(decode)
        self.subject = subject
        self.decode = decode
        self.queue = queue
        self.servers = server_list(servers)
        self.creds = creds
        self.buffer_records = buffer_records
        self.dropped = 0

    def open(self, context: TaskContext) -> None:
        servers = servers_for(self.servers, context, f"read_nats({self.subject!r})")
        self._decode = decoder(self.decode)
        self._name = f"nats source {self.subject}[{context.index}]"
        queue = self.queue or (f"gearbus.{context.app_name}.{context.processor_name}" if context.parallelism > 1
                               else "")
        self._buffer: collections.deque = collections.deque()  # (data, arrival ms)
        self._thread = LoopThread("nats-source")
        try:
            self._nc = self._thread.call(connect(servers, name="gearbus-nats-source", creds=self.creds))
            self._thread.call(self._subscribe(queue))
        except BaseException:
            self.close()
            raise

    async def _subscribe(self, queue: str) -> None:
        await self._nc.subscribe(self.subject, queue=queue, cb=self._on_message)
        await self._nc.flush(timeout=API_TIMEOUT)  # subscribed at the server: what is published from now on arrives

    async def _on_message(self, msg) -> None:
        if len(self._buffer) >= self.buffer_records:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("%s: buffer full, %d messages dropped so far", self._name, self.dropped)
            return
        self._buffer.append((msg.data, now_ms()))

    def read(self, max_records: int) -> list[Record]:
        buffer = self._buffer
        items = [buffer.popleft() for _ in range(min(max_records, len(buffer)))]
        if not items:
            return []
        values, items = self._values(items, 0)
        return [new_record(Record, (v, item[1], None)) for v, item in zip(values, items)]

    def idle_wait_s(self) -> float:
        return 0.0 if self._buffer else LIVE_WAIT_S

    def close(self) -> None:
        thread, self._thread = getattr(self, "_thread", None), None
        if thread is None:
            return
        nc = getattr(self, "_nc", None)
        failure = thread.stop(nc.close() if nc is not None and not nc.is_closed else None)
        if failure is not None:
            log.debug("%s: closing: %s", self._name, failure)
