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

Reading: each partition is a contiguous range of stream sequences read through the
JetStream pull reader the bus's source uses (:mod:`gearbus.connectors.jetstream_reader`:
an ephemeral ordered consumer, several pull requests in flight on one inbox, a new
consumer from the last sequence read after a gap or a stall), so a partition yields each
message of its range exactly once, in order.

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
    connect,
    dedup_id,
    ensure_stream,
    on_connection,
    stream_info,
    stream_state,
)
from gearbus.connectors.jetstream_reader import PullReader  # noqa: E402

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


def read_range(servers: list[str], stream: str, subject: str | None, first: int, last: int,
               chunk_rows: int = CHUNK_ROWS, pull_batch: int = PULL_BATCH,
               creds: str | None = None) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the messages with sequences ``first..last`` (inclusive), in order, each once,
    read through a :class:`~gearbus.connectors.jetstream_reader.PullReader`. Runs its own event
    loop, driven one chunk at a time by the caller (a Spark executor)."""
    if last < first:
        return
    loop = asyncio.new_event_loop()
    nc = reader = None
    try:
        nc = loop.run_until_complete(connect(servers, name=f"gearbus-spark-read-{stream}", creds=creds))
        reader = PullReader(nc, stream, subject.split(",") if subject else [], first - 1, last,
                            name=f"reading stream {stream} sequences {first}..{last}",
                            max_records=chunk_rows + pull_batch * PULL_IN_FLIGHT, batch=pull_batch,
                            in_flight=PULL_IN_FLIGHT, min_pull=pull_batch, follow=False)
        loop.run_until_complete(reader.open())
        running = loop.create_task(reader.run())
        while True:
            loop.run_until_complete(reader.wait_for(chunk_rows))
            if reader.error is not None:
                raise reader.error
            items = reader.take(chunk_rows)
            if not items:
                loop.run_until_complete(running)
                return
            yield _arrow(items)
    finally:
        try:
            if reader is not None:
                loop.run_until_complete(reader.close())
            if nc is not None:
                loop.run_until_complete(nc.close())
        finally:
            loop.close()


def _arrow(items: list[tuple]) -> pa.RecordBatch:
    """Buffered messages ``(seq, subject, data, time stamp ns)`` as one batch of :data:`SCHEMA`."""
    return pa.RecordBatch.from_arrays([
        pa.array([item[0] for item in items], pa.int64()),
        pa.array([item[1] for item in items], pa.string()),
        pa.array([item[2] for item in items], pa.binary()),
        pa.array([item[3] // 1000 for item in items], pa.timestamp("us", tz="UTC")),
    ], schema=ARROW_SCHEMA)


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
                info = on_connection(self.servers, lambda nc: stream_info(nc, str(stream)), self.creds)
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
