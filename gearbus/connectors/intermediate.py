"""Intermediate streams at run time (Samza's): the stage upstream of a stream writes it
exactly-once, the stage downstream reads it as a replayable source, and each stage
checkpoints and recovers on its own.

A stream has ``partitions`` subjects ``<stream>.<p>``; a record goes to the partition that
owns its key's key group (:func:`~gearbus.api.partitioners.group_owner` over the
partitions), so the keys of one partition are keys of one reading task whenever the
partitions are a multiple of the readers (the planner reads through a processor of one
task per partition otherwise): no reader filters, and keyed state downstream is where a
bus shuffle would have put it.

Each message is one writer task's batch: its place (:data:`PLACE`: the checkpoint that
committed it and its position in that transaction), then ``[writer, writers, watermark,
values, timestamps, keys]`` (values encoded by :mod:`shared.values`, so tuples stay
tuples); the watermark holds after its records. A writer sends its watermark to every partition (an
empty batch when it has no records for one), and WATERMARK_MAX at its end. A partition's
watermark is the lowest of its writers'; it has ended when every writer's is
WATERMARK_MAX.

The writer is a two-phase-commit sink (:class:`JetStreamTransactionalSink`): a batch is
published, with a ``Nats-Msg-Id`` from its position, once the upstream checkpoint that
holds it completes, so the stream holds committed records only. JetStream drops a
message published again within its duplicate window (2 minutes); the reader drops one
published again later (a commit retried for long, a restore of an old checkpoint): a
writer's places only grow, as its transactions commit in checkpoint order, so the reader
keeps the last place it read of each writer in each partition. The reader records its
read positions in the downstream checkpoint and, once that checkpoint completes, purges
what it had read: what the stream holds is the downstream stage's backlog.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import threading

from gearbus.api.partitioners import IntermediateStream, group_owner, owned_groups
from gearbus.api.task import DataSource, Record, TaskContext, new_record, not_rescalable
from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from gearbus.connectors.jetstream import (API_TIMEOUT, JetStreamError, JetStreamTransactionalSink, api, close_thread,
                                        connect, servers_for, stream_info)
from gearbus.connectors.jetstream_reader import PullReader
from shared import values
from shared.loop_thread import LoopThread
from shared.messages import IntermediateStreamSpec, StreamBacklog

log = logging.getLogger(__name__)

MESSAGE_RECORDS = 2_000   # records in one stream message at most
FULL_WAIT_S = 1.0         # a full stream: how long a writer waits before it looks again
PLACE = struct.Struct(">QI")  # heads each message: its transaction's checkpoint id, its position in it
OWNER = "gearbus_app"     # the stream's metadata: the app whose intermediate stream it is
DUPLICATE_WINDOW_NS = 120 * 10**9
READ_BUFFER = 64          # messages a reading task holds ahead of its pipeline
TAKE_MESSAGES = 8         # messages one read hands over at most


def subject(stream: str, partition: int) -> str:
    return f"{stream}.{partition}"


def partitions_read(index: int, parallelism: int, partitions: int) -> list[int]:
    """The partitions task ``index`` of ``parallelism`` reads: those whose key groups it owns.
    Each is read by one task only when ``partitions`` is a multiple of ``parallelism``."""
    if partitions % parallelism:
        raise ValueError(f"{partitions} partitions cannot be read by {parallelism} tasks without sharing one: "
                         "the partitions must be a multiple of the readers")
    return sorted({group_owner(group, partitions) for group in owned_groups(index, parallelism)})


def encode(writer: int, writers: int, watermark: int, records: list[Record]) -> bytes:
    """One stream message; a value that cannot travel raises shared.values.ValueTypeError."""
    return values.pack([writer, writers, watermark, [r[0] for r in records], [r[1] for r in records],
                        [r[2] for r in records]])


def decode(data: bytes) -> tuple[int, int, int, list[Record]]:
    """(writer, writers, watermark, records) of a stream message."""
    writer, writers, watermark, vals, stamps, keys = values.unpack(data)
    return writer, writers, watermark, [new_record(Record, r) for r in zip(vals, stamps, keys)]


class StreamWriter(JetStreamTransactionalSink):
    """An upstream task's writes into an intermediate stream, committed with its stage's
    checkpoints (see the module). Records arrive keyed (the edge's key step ran before).
    With ``max_bytes`` (> 0), a commit waits while the stream holds that much: the stage
    waits for its reader, and nothing is dropped or reordered."""

    def __init__(self, stream: IntermediateStream, max_bytes: int = -1, servers: list[str] | None = None):
        super().__init__(f"{stream.stream}.*", servers=servers)
        self.target = stream
        self.max_bytes = max_bytes

    def open(self, context: TaskContext) -> None:
        self._security = context.app_security
        super().open(context)
        self._writer, self._writers = context.index, context.parallelism
        partitions = self.target.partitions
        self._subjects = [subject(self.target.stream, p) for p in range(partitions)]
        self._pending: list[list[Record]] = [[] for _ in range(partitions)]
        self._watermark = WATERMARK_MIN
        self._sent = [WATERMARK_MIN] * partitions  # the watermark each partition has (or will have) from this task
        self._route = self.target.route

    def write(self, records: list[Record]) -> None:
        for partition, batch in enumerate(self._route(records, len(self._pending), self._writer)):
            if batch:
                pending = self._pending[partition]
                pending.extend(batch)
                if len(pending) >= MESSAGE_RECORDS:
                    self._add(partition)

    def on_watermark(self, watermark: int) -> None:
        self._watermark = max(self._watermark, watermark)

    def _add(self, partition: int) -> None:
        """The partition's pending records (or none) as a message of the open transaction."""
        records, self._pending[partition] = self._pending[partition], []
        self._values.append((self._subjects[partition],
                             encode(self._writer, self._writers, self._watermark, records)))
        self._sent[partition] = self._watermark

    def pre_commit(self, checkpoint_id: int) -> None:
        """Seal what was written, and the watermark to every partition that has not had it."""
        for partition, pending in enumerate(self._pending):
            if pending or self._sent[partition] != self._watermark:
                self._add(partition)
        super().pre_commit(checkpoint_id)

    async def _publish(self, transactions) -> None:
        """Publish each transaction's messages in order, each headed by its place (the
        checkpoint and its position in it), by which a reader drops one published again
        later than the stream's duplicate window."""
        for prefix, checkpoint_id, messages, _ in transactions:
            if self.max_bytes > 0:
                await self._wait_for_room()
            for i, (to, body) in enumerate(messages):
                await self._publisher.publish(to, PLACE.pack(checkpoint_id, i) + body, f"{prefix}/{i}")
        await self._publisher.drain()

    async def _wait_for_room(self) -> None:
        warned = False
        while (await stream_info(self._nc, self.target.stream))["state"]["bytes"] >= self.max_bytes:
            if not warned:
                log.warning("intermediate stream %s holds %d bytes or more: the writer waits for its reader",
                            self.target.stream, self.max_bytes)
                warned = True
            await asyncio.sleep(FULL_WAIT_S)

    def rescale(self, states: list, index: int, parallelism: int) -> list:
        """Not rescalable: the readers count the writers (nothing held: nothing to divide)."""
        not_rescalable(states, f"the writers of intermediate stream {self.target.stream}")
        return []


class StreamReader(DataSource):
    """A downstream task's reads of one or more intermediate streams (the inputs of a join),
    replayable from the positions its checkpoint holds (see the module).

    Each partition is read through a consumer of its own, with a position of its own: a
    purge of one partition then moves no other's consumer past what it has not read."""

    replayable = True
    event_time = True

    def __init__(self, streams: list[IntermediateStream], servers: list[str] | None = None):
        self.streams = list(streams)
        self.servers = list(servers or [])

    def open(self, context: TaskContext) -> None:
        servers = servers_for(self.servers, context, "an intermediate stream")
        self._name = f"intermediate stream reader {context.processor_name}[{context.index}]"
        #: subject -> its stream, for the partitions this task reads
        self._stream_of = {subject(s.stream, p): s.stream for s in self.streams
                           for p in partitions_read(context.index, context.parallelism, s.partitions)}
        self._position = dict.fromkeys(self._stream_of, 0)          # the last sequence read
        self._writers: dict[str, int] = {}                           # stream -> its writer tasks
        self._marks: dict[str, dict[int, int]] = {subj: {} for subj in self._stream_of}  # each writer's watermark
        self._low = dict.fromkeys(self._stream_of, WATERMARK_MIN)    # the partition's: its writers' lowest
        self._seen: dict[str, dict[int, tuple[int, int]]] = {subj: {} for subj in self._stream_of}  # last place read
        self._readers: dict[str, PullReader] = {}
        self._lock = threading.Lock()  # checkpoints are prepared on the task's thread, completed on another
        self._checkpoints: list[tuple[int, dict[str, int]]] = []     # (checkpoint id, positions) not yet complete
        self._purged = dict.fromkeys(self._stream_of, 0)
        self._thread = LoopThread("intermediate-reader")
        try:
            self._nc = self._thread.call(connect(servers, name="gearbus-intermediate-reader",
                                                 security=context.app_security))
        except BaseException:
            self.close()
            raise

    def snapshot(self) -> dict:
        return {"position": dict(self._position), "writers": dict(self._writers),
                "watermarks": {subj: dict(m) for subj, m in self._marks.items()},
                "seen": {subj: dict(s) for subj, s in self._seen.items()}}

    def restore(self, state: dict) -> None:
        if self._readers:
            raise RuntimeError(f"{self._name}: restore() after the first read()")
        self._writers.update(state["writers"])
        for subj in self._stream_of:
            self._position[subj] = state["position"].get(subj, 0)
            self._marks[subj] = dict(state["watermarks"].get(subj, {}))
            self._seen[subj] = {w: tuple(place) for w, place in state["seen"].get(subj, {}).items()}
            self._low[subj] = self._lowest(subj)

    def read(self, max_records: int) -> list[Record] | None:
        if self._ended():
            return None
        if not self._readers:
            self._start()
        records: list[Record] = []
        for subj, reader in self._readers.items():
            if reader.error is not None:
                raise reader.error
            for seq, _, data, _ in reader.take(TAKE_MESSAGES):
                self._position[subj] = seq
                self._take(subj, data, records)
            if len(records) >= max_records:
                break
        return records

    def _take(self, subj: str, data: bytes, records: list[Record]) -> None:
        """One message's records and watermark, unless it was read before (published again
        by a writer's recovery, after the stream's duplicate window)."""
        place = PLACE.unpack_from(data)
        writer, writers, watermark, batch = decode(memoryview(data)[PLACE.size:])
        seen = self._seen[subj]
        if place <= seen.get(writer, (-1, -1)):
            return
        seen[writer] = place
        records.extend(batch)
        stream = self._stream_of[subj]
        if self._writers.get(stream) != writers:
            self._writers[stream] = writers
            for other in self._stream_of:
                self._low[other] = self._lowest(other)
        marks = self._marks[subj]
        if watermark > marks.get(writer, WATERMARK_MIN):
            marks[writer] = watermark
            self._low[subj] = self._lowest(subj)

    def _lowest(self, subj: str) -> int:
        """The partition's watermark: its writers' lowest (WATERMARK_MIN until its stream has
        said how many writers it has)."""
        writers = self._writers.get(self._stream_of[subj])
        if writers is None:
            return WATERMARK_MIN
        marks = self._marks[subj]
        return min(marks.get(w, WATERMARK_MIN) for w in range(writers))

    def _ended(self) -> bool:
        """Every partition read has WATERMARK_MAX from every writer of its stream."""
        return min(self._low.values()) == WATERMARK_MAX

    def watermark(self) -> int:
        """The lowest of the partitions' watermarks."""
        return min(self._low.values())

    def idle_wait_s(self) -> float:
        return 0.0 if any(r.buffer for r in self._readers.values()) else 0.005

    def _start(self) -> None:
        for subj, stream in self._stream_of.items():
            reader = PullReader(self._nc, stream, [subj], self._position[subj], None, name=f"{self._name} {subj}",
                                max_records=READ_BUFFER, batch=READ_BUFFER // 2, in_flight=2)
            self._readers[subj] = reader
            self._thread.submit(reader.run())

    def prepare_checkpoint(self, checkpoint_id: int) -> None:
        with self._lock:
            self._checkpoints.append((checkpoint_id, dict(self._position)))

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        """Purge what this task had read at the completed checkpoint: no recovery reads it again."""
        with self._lock:
            done = [positions for cid, positions in self._checkpoints if cid <= checkpoint_id]
            self._checkpoints = [(cid, p) for cid, p in self._checkpoints if cid > checkpoint_id]
        if done:
            moved = {subj: seq for subj, seq in done[-1].items() if seq > self._purged[subj]}
            self._purged.update(moved)
            if moved:
                self._thread.submit(self._purge(moved))

    async def _purge(self, positions: dict[str, int]) -> None:
        async def purge(subj: str, position: int) -> None:
            try:
                await api(self._nc, f"$JS.API.STREAM.PURGE.{self._stream_of[subj]}",
                          {"filter": subj, "seq": position + 1}, timeout=API_TIMEOUT)
            except JetStreamError as exc:  # what it keeps, the next checkpoint's purge takes
                log.warning("%s: purging %s up to %d: %s", self._name, subj, position, exc)

        await asyncio.gather(*(purge(subj, position) for subj, position in positions.items()))

    def close(self) -> None:
        close_thread(self, self._shutdown, getattr(self, "_name", "intermediate stream reader"))

    async def _shutdown(self) -> None:
        for reader in self._readers.values():
            await reader.close()
        nc = getattr(self, "_nc", None)
        if nc is not None and not nc.is_closed:
            await nc.close()


# --- the streams' lifecycle (the master's, and the submitting client's check) -----------


class StreamTaken(JetStreamError):
    """A stream of the name an intermediate stream needs exists and is not the app's."""


def owner_of(info: dict) -> str | None:
    """The app whose intermediate stream this is (None: not an intermediate stream)."""
    return (info["config"].get("metadata") or {}).get(OWNER)


async def existing(nc, name: str) -> dict | None:
    try:
        return await stream_info(nc, name)
    except JetStreamError as exc:
        if "not found" in str(exc):
            return None
        raise


def refuse_taken(name: str, info: dict, app: str) -> None:
    owner = owner_of(info)
    if owner != app:
        raise StreamTaken(f"JetStream stream {name!r} exists and belongs to "
                          f"{'app ' + repr(owner) if owner else 'something else (it is not an intermediate stream)'}, "
                          f"not to app {app!r}: rename the app or the step, or delete that stream")


async def create_streams(nc, specs: list[IntermediateStreamSpec], app: str, replicas: int = 1) -> None:
    """Make an app's streams; one it left behind (it failed) is emptied and taken again (a
    fresh start reads none of it); one that is not the app's is refused (StreamTaken)."""
    for spec in specs:
        info = await existing(nc, spec.name)
        if info is not None:
            refuse_taken(spec.name, info, app)
            await api(nc, f"$JS.API.STREAM.PURGE.{spec.name}", {})
            continue
        await api(nc, f"$JS.API.STREAM.CREATE.{spec.name}", {
            "name": spec.name, "subjects": [f"{spec.name}.*"], "storage": "file", "retention": "limits",
            "duplicate_window": DUPLICATE_WINDOW_NS,
            "num_replicas": replicas, "description": f"gearbus app {app}: the intermediate stream of {spec.edge}",
            "metadata": {OWNER: app}})


async def delete_streams(nc, names: list[str]) -> None:
    for name in names:
        try:
            await api(nc, f"$JS.API.STREAM.DELETE.{name}", {})
        except JetStreamError as exc:
            if "not found" not in str(exc):
                raise


async def backlogs(nc, specs: list[IntermediateStreamSpec]) -> list[StreamBacklog]:
    """What each stream holds now (-1 messages: it could not be read)."""
    found = []
    for spec in specs:
        try:
            info = await existing(nc, spec.name)
        except JetStreamError:
            info = None
        state = info["state"] if info else {"messages": -1, "bytes": 0}
        found.append(StreamBacklog(spec.name, spec.partitions, spec.from_stage, spec.to_stage, state["messages"],
                                   state["bytes"]))
    return found
