"""JetStream as a Spark source and sink, through PySpark's Python Data Source API.

    from gearbus.connectors.spark_jetstream import register
    register(spark)                                   # the format is named "jetstream"

    # batch: a range of a stream (start_seq .. end_seq, both inclusive)
    df = (spark.read.format("jetstream").option("servers", "nats://127.0.0.1:4222")
          .option("stream", "EVENTS").option("start_seq", 1).load())

    # Structured Streaming: offsets are stream sequences, {"seq": N}
    sdf = spark.readStream.format("jetstream").option("servers", url).option("stream", "EVENTS").load()

    # sink: publishes each row's ``data`` with a Nats-Msg-Id dedup id built from the row
    (sdf.select("data").writeStream.format("jetstream").option("servers", url)
        .option("subject", "results.x").option("checkpointLocation", path).start())

On a secure NATS, option ``creds`` names a credential file (``gearbus security user``) present
at that path on the driver and every executor; TLS files come from GEARBUS_TLS_CA,
GEARBUS_TLS_CERT and GEARBUS_TLS_KEY in their environment.

Rows read have the schema ``seq long, subject string, data binary, timestamp timestamp``
(:data:`SCHEMA`): the stream sequence, the message's subject, its payload and the time
JetStream stored it.

Where the code runs (the Python Data Source API's rules): the planning methods (the
batch reader's ``partitions()``; the stream reader's ``initialOffset``, ``latestOffset``,
``partitions``, ``commit``) run in a Python process on the driver; they open a
short-lived connection per call on a fresh event loop when they need stream info.
``read()`` and ``write()`` run in executor Python workers on freshly unpickled objects:
they connect inside the call, on their own event loop, and close before they return.
Nothing holds a connection in ``__init__`` (it could not be pickled).

Reading: each partition is a contiguous range of stream sequences read through its own
ephemeral ordered consumer (deliver by start sequence, ack none, in memory), pulled with
``$JS.API.CONSUMER.MSG.NEXT`` requests issued on one inbox subscription (several
requests in flight); the sequence, consumer sequence, time stamp and pending count come
from the reply subject, so no per-message API call is made. A gap in the consumer
sequence (a dropped message) or a stall recreates the consumer from the last sequence
read, so a partition yields each message of its range exactly once, in order.

Writing: plain publishes with a reply subject under one inbox (one wildcard
subscription collects the acks), a bounded window of unacknowledged messages, and
republishing (same id) of messages whose ack does not come. Each message carries a
``Nats-Msg-Id``: the row's ``id`` column when there is one, else a hash of subject and
data, so a replayed micro-batch (a query restarted from its checkpoint re-runs its last
uncommitted batch) is dropped by the stream's duplicate window instead of stored twice.
The replay must fall inside that window (JetStream's default is two minutes).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType, TimestampType

try:  # pyspark >= 4.2
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - older pyspark: Trigger.AvailableNow is not offered to the source
    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

from gearbus.connectors.jetstream import (  # noqa: E402  (after the pyspark imports above)
    PUBLISH_WINDOW,
    JetStreamError,
    Publisher,
    api,
    connect,
    dedup_id,
    ensure_stream,
    publish_messages,
    run_fresh,
    stream_info,
    stream_state,
)

log = logging.getLogger(__name__)

FORMAT = "jetstream"
SCHEMA = StructType([
    StructField("seq", LongType(), nullable=False),
    StructField("subject", StringType(), nullable=False),
    StructField("data", BinaryType(), nullable=False),
    StructField("timestamp", TimestampType(), nullable=False),
])
ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")  # what the Python Data Source API checks batches against

# register() puts the session's default parallelism here: the planning processes get the
# SparkContext's environment, and have no SparkContext of their own to ask.
PARALLELISM_ENV = "GEARBUS_SPARK_DEFAULT_PARALLELISM"

DEFAULT_SERVERS = "nats://127.0.0.1:4222"
CHUNK_ROWS = 10_000          # rows per Arrow batch handed to Spark
PULL_BATCH = 2_000           # messages per MSG.NEXT pull request
PULL_IN_FLIGHT = 4           # pull requests kept outstanding
PULL_EXPIRES_S = 5.0         # a pull request's server-side expiry
IDLE_S = 2.0                 # no message for this long: recreate the consumer from the last sequence
STALL_S = 30.0               # no progress for this long: fail the task


# --------------------------------------------------------------------------- options


def _option(options: Any, name: str, default: Any = None) -> Any:
    value = options.get(name) if options is not None else None
    return default if value is None or value == "" else value


def _int_option(options: Any, name: str, default: int | None) -> int | None:
    value = _option(options, name)
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"jetstream option {name!r} must be an integer, got {value!r}") from None


def _servers(options: Any) -> list[str]:
    raw = str(_option(options, "servers", DEFAULT_SERVERS))
    servers = [s.strip() for s in raw.split(",") if s.strip()]
    if not servers:
        raise ValueError("jetstream option 'servers' is empty")
    return servers


def _stream(options: Any) -> str:
    stream = _option(options, "stream")
    if not stream:
        raise ValueError("jetstream source: option 'stream' (the JetStream stream to read) is required")
    return str(stream)


def default_partitions(options: Any = None) -> int:
    """Option ``partitions``, else the session's default parallelism (set by :func:`register`),
    else this machine's core count."""
    value = _int_option(options, "partitions", None)
    if value is None:
        env = os.environ.get(PARALLELISM_ENV)
        value = int(env) if env else (os.cpu_count() or 1)
    if value < 1:
        raise ValueError(f"jetstream option 'partitions' must be >= 1, got {value}")
    return value


# --------------------------------------------------------------------------- reading


@dataclass
class SeqRange(InputPartition):
    """A contiguous range of stream sequences, both ends inclusive: one Spark partition."""

    first: int
    last: int

    def __post_init__(self):
        self.value = (self.first, self.last)


def split_range(first: int, last: int, parts: int) -> list[SeqRange]:
    """``first..last`` cut into at most ``parts`` contiguous ranges of near-equal length."""
    n = last - first + 1
    if n <= 0:
        return []
    parts = max(1, min(parts, n))
    return [SeqRange(first + n * i // parts, first + n * (i + 1) // parts - 1) for i in range(parts)]


def _parse_ack_reply(reply: str) -> tuple[int, int, int, int]:
    """(stream seq, consumer seq, time stamp ns, pending) from a JetStream delivery's reply subject:
    ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`` or the v2 form
    with domain and account hash before the stream (and a random token at the end)."""
    t = reply.split(".")
    if len(t) == 9:
        return int(t[5]), int(t[6]), int(t[7]), int(t[8])
    return int(t[7]), int(t[8]), int(t[9]), int(t[10])


class _RangeReader:
    """Reads sequences ``first..last`` (inclusive) of a stream, optionally filtered by subject,
    through an ephemeral ordered pull consumer; yields columns in chunks."""

    def __init__(self, servers: list[str], stream: str, subject: str | None, first: int, last: int,
                 chunk_rows: int = CHUNK_ROWS, pull_batch: int = PULL_BATCH, in_flight: int = PULL_IN_FLIGHT,
                 creds: str | None = None):
        self.servers, self.stream, self.subject, self.creds = servers, stream, subject, creds
        self.first, self.last = first, last
        self.chunk_rows, self.pull_batch = chunk_rows, pull_batch
        self.max_outstanding = pull_batch * in_flight
        self.nc = None
        self.sub = None
        self.consumer: str | None = None
        self.gen = 0
        self.seen = first - 1         # last stream sequence accepted
        self.cseq = 0                 # last consumer sequence seen on the current consumer
        self.outstanding = 0          # messages asked for and not yet received
        self.pending = 0              # messages after `seen` the server knows of (matching the filter)
        self.done = False
        self.need_reset = False
        self.wake = asyncio.Event()
        self.received = 0             # messages received in total (progress marker)
        self._clear()

    def _clear(self):
        self.seqs: list[int] = []
        self.subjects: list[str] = []
        self.datas: list[bytes] = []
        self.stamps: list[int] = []

    async def open(self) -> None:
        self.nc = await connect(self.servers, name=f"gearbus-spark-read-{self.stream}", creds=self.creds)
        await self._new_consumer()

    async def _new_consumer(self) -> None:
        await self._drop_consumer()
        self.gen += 1
        self.cseq = 0
        self.outstanding = 0
        self.need_reset = False
        start = self.seen + 1
        if start > self.last:
            self._finish()
            return
        config = {"deliver_policy": "by_start_sequence", "opt_start_seq": start, "ack_policy": "none",
                  "replay_policy": "instant", "mem_storage": True, "num_replicas": 1,
                  "inactive_threshold": int(30e9), "max_waiting": 64}
        if self.subject:  # one filter, or several comma-separated (JetStream's filter_subjects)
            filters = self.subject.split(",")
            if len(filters) == 1:
                config["filter_subject"] = filters[0]
            else:
                config["filter_subjects"] = filters
        inbox = self.nc.new_inbox()
        gen = self.gen

        async def on_msg(msg):
            if gen == self.gen:
                await self._on_msg(msg)

        self.sub = await self.nc.subscribe(inbox, cb=on_msg, pending_msgs_limit=1_000_000,
                                           pending_bytes_limit=1 << 30)
        self.inbox = inbox
        info = await api(self.nc, f"$JS.API.CONSUMER.CREATE.{self.stream}",
                          {"stream_name": self.stream, "config": config})
        self.consumer = info["name"]
        self.next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.consumer}"
        self.pending = int(info.get("num_pending", 0))
        if self.pending == 0:
            self._finish()
            return
        await self._request()

    async def _drop_consumer(self) -> None:
        if self.sub is not None:
            try:
                await self.sub.unsubscribe()
            except Exception:  # noqa: BLE001 - the connection may be gone; the consumer expires anyway
                pass
            self.sub = None
        if self.consumer is not None:
            name, self.consumer = self.consumer, None
            try:
                await api(self.nc, f"$JS.API.CONSUMER.DELETE.{self.stream}.{name}", timeout=2.0)
            except Exception:  # noqa: BLE001 - inactive_threshold removes it
                pass

    async def _request(self) -> None:
        want = min(self.pending, self.last - self.seen) - self.outstanding
        while want > 0 and self.outstanding < self.max_outstanding:
            n = min(self.pull_batch, want, self.max_outstanding - self.outstanding)
            body = b'{"batch":%d,"expires":%d}' % (n, int(PULL_EXPIRES_S * 1e9))
            await self.nc.publish(self.next_subject, body, reply=self.inbox)
            self.outstanding += n
            want -= n

    def _finish(self) -> None:
        self.done = True
        self.wake.set()

    async def _on_msg(self, msg) -> None:
        if self.done or self.need_reset:
            return
        reply = msg.reply
        if not reply:  # a status message: a pull request ended (404/408) or the consumer went away (409)
            headers = msg.headers or {}
            status = headers.get("Status", "")
            if status == "100":
                return
            if status in ("404", "408"):
                left = headers.get("Nats-Pending-Messages")
                self.outstanding = max(0, self.outstanding - int(left)) if left else 0
                await self._request()
            else:
                self.need_reset = True
                self.wake.set()
            return
        sseq, cseq, stamp, pending = _parse_ack_reply(reply)
        self.outstanding -= 1
        self.received += 1
        if cseq != self.cseq + 1:  # a message was dropped (slow consumer): start over from `seen`
            self.need_reset = True
            self.wake.set()
            return
        self.cseq = cseq
        if sseq > self.last:
            self._finish()
            return
        self.seqs.append(sseq)
        self.subjects.append(msg.subject)
        self.datas.append(msg.data)
        self.stamps.append(stamp // 1000)
        self.seen = sseq
        self.pending = pending
        if sseq >= self.last or pending == 0:
            self._finish()
            return
        if len(self.seqs) >= self.chunk_rows:
            self.wake.set()
        if self.outstanding <= self.max_outstanding - self.pull_batch:
            await self._request()

    async def next_chunk(self) -> pa.RecordBatch | None:
        """The next Arrow batch of rows, or None once the range is read."""
        stalled_since = time.monotonic()
        mark = self.received
        while not self.done and len(self.seqs) < self.chunk_rows:
            if self.need_reset:
                await self._new_consumer()
                continue
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), IDLE_S)
            except TimeoutError:
                if self.received != mark:  # slow, but messages come
                    mark, stalled_since = self.received, time.monotonic()
                    continue
                if time.monotonic() - stalled_since > STALL_S:
                    raise JetStreamError(f"reading stream {self.stream} sequences {self.seen + 1}..{self.last}: "
                                         f"no message for {STALL_S:g} s") from None
                # nothing came for a while: lost pull requests (a reconnect), a deleted consumer or
                # deleted messages; a fresh consumer from `seen` + 1 sorts all of these out
                await self._new_consumer()
        if not self.seqs:
            return None
        batch = pa.RecordBatch.from_arrays([
            pa.array(self.seqs, pa.int64()),
            pa.array(self.subjects, pa.string()),
            pa.array(self.datas, pa.binary()),
            pa.array(self.stamps, pa.timestamp("us", tz="UTC")),
        ], schema=ARROW_SCHEMA)
        self._clear()
        return batch

    async def close(self) -> None:
        if self.nc is None:
            return
        try:
            await self._drop_consumer()
        finally:
            try:
                await self.nc.close()
            except Exception:  # noqa: BLE001
                pass
            self.nc = None


def read_range(servers: list[str], stream: str, subject: str | None, first: int, last: int,
               chunk_rows: int = CHUNK_ROWS, pull_batch: int = PULL_BATCH,
               creds: str | None = None) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the messages with sequences ``first..last`` (inclusive), in order, each once.
    Runs its own event loop, driven one chunk at a time by the caller (a Spark executor)."""
    if last < first:
        return
    loop = asyncio.new_event_loop()
    reader = None
    try:
        reader = _RangeReader(servers, stream, subject, first, last, chunk_rows, pull_batch, creds=creds)
        loop.run_until_complete(reader.open())
        while True:
            batch = loop.run_until_complete(reader.next_chunk())
            if batch is None:
                return
            yield batch
    finally:
        try:
            if reader is not None:
                loop.run_until_complete(reader.close())
        finally:
            loop.close()


class _ReaderOptions:
    """What both readers need, parsed once on the driver and pickled to the executors."""

    def __init__(self, options: Any):
        self.servers = _servers(options)
        self.creds = _option(options, "creds")
        self.stream = _stream(options)
        self.subject = _option(options, "subject")
        self.partitions = default_partitions(options)
        self.chunk_rows = _int_option(options, "chunk_rows", CHUNK_ROWS)
        self.pull_batch = _int_option(options, "pull_batch", PULL_BATCH)

    def read(self, part: SeqRange) -> Iterator[pa.RecordBatch]:
        return read_range(self.servers, self.stream, self.subject, part.first, part.last,
                          self.chunk_rows, self.pull_batch, self.creds)

    def last_seq(self) -> int:
        return int(stream_state(self.servers, self.stream, self.creds)["last_seq"])


class JetStreamBatchReader(DataSourceReader):
    """A range of a stream: ``start_seq`` (default 1) to ``end_seq`` (default: the last sequence
    when the query is planned), split into contiguous ranges, one partition per core."""

    def __init__(self, options: Any):
        self.opts = _ReaderOptions(options)
        self.start_seq = _int_option(options, "start_seq", 1)
        self.end_seq = _int_option(options, "end_seq", None)
        if self.start_seq < 1:
            raise ValueError(f"jetstream option 'start_seq' must be >= 1, got {self.start_seq}")

    def partitions(self) -> Sequence[InputPartition]:
        end = self.end_seq if self.end_seq is not None else self.opts.last_seq()
        return split_range(self.start_seq, end, self.opts.partitions) or [SeqRange(1, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.opts.read(partition)


class JetStreamStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{"seq": N}``: everything up to stream sequence N has been read. A micro-batch
    reads ``(start, end]``, split into contiguous ranges, one partition per core."""

    def __init__(self, options: Any):
        self.opts = _ReaderOptions(options)
        self.start_seq = str(_option(options, "start_seq", "1")).lower()
        if self.start_seq not in ("earliest", "latest"):
            if _int_option(options, "start_seq", 1) < 1:
                raise ValueError(f"jetstream option 'start_seq' must be >= 1, 'earliest' or 'latest', "
                                 f"got {self.start_seq}")
        self.max_rows = _int_option(options, "max_records_per_batch", None)
        self.target: int | None = None  # the last sequence to read under Trigger.AvailableNow

    def initialOffset(self) -> dict:
        if self.start_seq == "earliest":
            return {"seq": 0}
        if self.start_seq == "latest":
            return {"seq": self.opts.last_seq()}
        return {"seq": int(self.start_seq) - 1}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self.opts.last_seq()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = int(start["seq"])
        end = self.opts.last_seq()
        if self.target is not None:
            end = min(end, self.target)
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + limit.max_rows)
        return {"seq": max(begin, end)}  # never back: a purged or recreated stream has a lower last_seq

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return split_range(int(start["seq"]) + 1, int(end["seq"]), self.opts.partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.opts.read(partition)

    def commit(self, end: dict) -> None:
        # Nothing to release: each partition's consumer is deleted when its read ends (and is
        # ephemeral with an inactivity threshold besides). Offsets live in Spark's checkpoint.
        pass


# --------------------------------------------------------------------------- writing


@dataclass
class PublishedMessage(WriterCommitMessage):
    """A write task's tally: messages stored, and messages the stream dropped as duplicates."""

    published: int
    duplicates: int


def _column(batch: pa.RecordBatch, name: str):
    i = batch.schema.get_field_index(name)
    return batch.column(i) if i >= 0 else None


class _WriterBase:
    """Validates the sink options and the input schema on the driver; publishes on the executors."""

    def __init__(self, options: Any, schema: StructType):
        self.servers = _servers(options)
        self.creds = _option(options, "creds")
        self.subject = _option(options, "subject")
        names = {f.name.lower(): f for f in schema.fields}
        data = names.get("data")
        if data is None or not isinstance(data.dataType, (BinaryType, StringType)):
            raise ValueError("jetstream sink: the rows need a 'data' column of type binary or string; "
                             f"got {schema.simpleString()}")
        if "subject" in names and not isinstance(names["subject"].dataType, StringType):
            raise ValueError("jetstream sink: the 'subject' column must be a string")
        if not self.subject and "subject" not in names:
            raise ValueError("jetstream sink: set option 'subject' or give the rows a 'subject' column")
        self.data_name = data.name
        self.subject_name = names["subject"].name if "subject" in names else None
        self.id_name = names["id"].name if "id" in names else None
        self.window = _int_option(options, "publish_window", PUBLISH_WINDOW)
        stream = _option(options, "stream")
        if stream:  # make sure the target exists (create it for the 'subject' option) and deduplicates
            if self.subject:
                window_s = float(_option(options, "duplicate_window", 120))
                info = ensure_stream(self.servers, str(stream), [self.subject], window_s, creds=self.creds)
            else:
                async def get():
                    nc = await connect(self.servers, creds=self.creds)
                    try:
                        return await stream_info(nc, str(stream))
                    finally:
                        await nc.close()
                info = run_fresh(get())
            if int(info["config"].get("duplicate_window", 0)) <= 0:
                raise JetStreamError(f"stream {stream} has no duplicate window: a replayed batch would be stored twice")

    def _write(self, iterator: Iterator[pa.RecordBatch]) -> PublishedMessage:
        loop = asyncio.new_event_loop()
        nc = None
        try:
            nc = loop.run_until_complete(connect(self.servers, name="gearbus-spark-write", creds=self.creds))
            pub = loop.run_until_complete(Publisher(nc, window=self.window).open())
            for batch in iterator:
                loop.run_until_complete(self._publish_batch(pub, batch))
            loop.run_until_complete(pub.drain())
            return PublishedMessage(pub.published, pub.duplicates)
        finally:
            if nc is not None:
                loop.run_until_complete(nc.close())
            loop.close()

    async def _publish_batch(self, pub: Publisher, batch: pa.RecordBatch) -> None:
        datas = _column(batch, self.data_name).to_pylist()
        subjects = (_column(batch, self.subject_name).to_pylist() if self.subject_name
                    else [self.subject] * len(datas))
        ids = _column(batch, self.id_name).to_pylist() if self.id_name else None
        default_subject = self.subject
        for k, data in enumerate(datas):
            if data is None:
                continue  # nothing to publish
            if isinstance(data, str):
                data = data.encode()
            subject = subjects[k] or default_subject
            if not subject:
                raise ValueError("jetstream sink: a row has no subject (null 'subject' and no 'subject' option)")
            msg_id = str(ids[k]) if ids is not None and ids[k] is not None else dedup_id(subject, data)
            await pub.publish(subject, data, msg_id)


class JetStreamBatchWriter(_WriterBase, DataSourceArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishedMessage:
        return self._write(iterator)

    def commit(self, messages: list[PublishedMessage | None]) -> None:
        log.info("jetstream sink: %s", _tally(messages))

    def abort(self, messages: list[PublishedMessage | None]) -> None:
        # Published messages cannot be taken back; rerunning the write is safe (dedup ids).
        log.warning("jetstream sink: write aborted after %s", _tally(messages))


class JetStreamStreamWriter(_WriterBase, DataSourceStreamArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishedMessage:
        return self._write(iterator)

    def commit(self, messages: list[PublishedMessage | None], batchId: int) -> None:
        log.info("jetstream sink: batch %d: %s", batchId, _tally(messages))

    def abort(self, messages: list[PublishedMessage | None], batchId: int) -> None:
        # What was published stays; Spark reruns the batch and the dedup ids drop the repeats.
        log.warning("jetstream sink: batch %d aborted after %s", batchId, _tally(messages))


def _tally(messages) -> str:
    done = [m for m in messages if isinstance(m, PublishedMessage)]
    return (f"{sum(m.published for m in done)} published, {sum(m.duplicates for m in done)} duplicates dropped, "
            f"{len(messages) - len(done)} tasks without a result")


# --------------------------------------------------------------------------- the data source


class JetStreamDataSource(DataSource):
    """Format ``jetstream``. Read options: ``servers`` (comma-separated NATS URLs), ``stream``,
    ``subject`` (a filter, or several comma-separated), ``start_seq`` (default 1; streaming also
    'earliest'/'latest'), ``end_seq`` (batch; default the stream's last sequence at planning),
    ``partitions`` (default: the session's parallelism), ``max_records_per_batch`` (streaming).
    Write options: ``servers``, ``subject`` (or a ``subject`` column), ``stream`` (created if
    missing, with ``duplicate_window`` seconds, default 120). Rows to write need a ``data``
    column (binary or string) and may have ``id`` (the dedup id) and ``subject`` columns."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return SCHEMA

    def _check_schema(self, schema: StructType) -> None:
        if [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType) for f in SCHEMA.fields]:
            raise ValueError(f"the jetstream source has the fixed schema {SCHEMA.simpleString()}; "
                             f"got {schema.simpleString()}")

    def reader(self, schema: StructType) -> DataSourceReader:
        self._check_schema(schema)
        return JetStreamBatchReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self._check_schema(schema)
        return JetStreamStreamReader(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> JetStreamBatchWriter:
        if overwrite:
            raise ValueError("the jetstream sink only appends to a stream: use mode('append')")
        return JetStreamBatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> JetStreamStreamWriter:
        return JetStreamStreamWriter(self.options, schema)


def register(spark) -> None:
    """Register the ``jetstream`` format with this session (and tell its planning processes
    the session's default parallelism, the default number of partitions)."""
    sc = spark.sparkContext
    sc.environment[PARALLELISM_ENV] = str(sc.defaultParallelism)
    spark.dataSource.register(JetStreamDataSource)


# --------------------------------------------------------------------------- throughput


def measure_throughput(url: str, n: int = 100_000, spark=None, payload_bytes: int = 100) -> dict:
    """Records/s of the jetstream source into Spark (a batch read of ``n`` records materialised
    with the noop sink) and of the sink back out (``n`` cached rows written to a stream), each
    timed around its Spark action, after a small warm-up of both (so the figures exclude the
    one-off start of Spark's Python workers). Creates streams with unique names on the server
    at ``url``; prints and returns the figures."""
    from pyspark.sql import SparkSession

    if spark is None:
        spark = SparkSession.getActiveSession()
    if spark is None:  # Spark's Python workers must run this interpreter (it has nats-py and gearbus)
        import sys

        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        spark = (SparkSession.builder.master("local[*]").config("spark.ui.enabled", "false")
                 .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                 .getOrCreate())
    register(spark)
    tag = uuid.uuid4().hex[:8].upper()
    src, out, warm = f"BENCH_IN_{tag}", f"BENCH_OUT_{tag}", f"BENCH_WARM_{tag}"
    ensure_stream(url, src, [f"bench.in.{tag}"])
    ensure_stream(url, out, [f"bench.out.{tag}"])
    ensure_stream(url, warm, [f"bench.warm.{tag}"])
    pad = b"x" * max(0, payload_bytes - 12)
    publish_messages(url, f"bench.in.{tag}", (b"%012d" % i + pad for i in range(n)))

    def source(end_seq=None):
        reader = spark.read.format(FORMAT).option("servers", url).option("stream", src)
        return reader.option("end_seq", end_seq).load() if end_seq else reader.load()

    def sink(df, subject):
        df.write.format(FORMAT).mode("append").option("servers", url).option("subject", subject).save()

    source(min(n, 1000)).write.format("noop").mode("overwrite").save()  # warm-up: start the workers
    sink(source(min(n, 1000)).select("data"), f"bench.warm.{tag}")

    t0 = time.perf_counter()
    source().write.format("noop").mode("overwrite").save()
    read_s = time.perf_counter() - t0

    rows = source().select("data").cache()
    cached = rows.count()
    t0 = time.perf_counter()
    sink(rows, f"bench.out.{tag}")
    write_s = time.perf_counter() - t0
    rows.unpersist()
    stored = int(stream_state(url, out)["messages"])
    if cached != n or stored != n:
        raise JetStreamError(f"throughput run lost records: {n} published, {cached} read, {stored} written")
    result = {"records": n, "source_records_per_s": n / read_s, "sink_records_per_s": n / write_s,
              "source_s": read_s, "sink_s": write_s}
    print(f"jetstream -> spark: {n:,} records in {read_s:.2f} s = {n / read_s:,.0f} records/s; "
          f"spark -> jetstream: {n:,} records in {write_s:.2f} s = {n / write_s:,.0f} records/s")
    return result


if __name__ == "__main__":  # python -m gearbus.connectors.spark_jetstream [N]
    import sys
    import tempfile

    from gearbus.natsserver import NatsServer

    with tempfile.TemporaryDirectory() as store, NatsServer(store_dir=store) as server:
        measure_throughput(server.url, int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
