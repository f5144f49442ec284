"""The SparkRunner: a DSL pipeline translated into PySpark RDD operations.

A visitor walks the pipeline's steps in order and applies one translation per step
kind (Beam's Spark runner pattern). Records are ``(value, timestamp, key)`` tuples, as
on the bus. Aggregations combine in Spark (``combineByKey``); windows use the same
assigners and aggregators as the bus runtime, and the same late-data rule: a record is
judged against the watermark as the bus would have it when the record arrives (the
source's watermark after each batch of ``batch_records`` records). A bounded Spark job
emits final window results only: early triggers are ignored (said once at plan time).
Joins and keyed state run the bus's own operators per key partition, fed as one of the
bus's tasks would be (:mod:`gearbus.runners.spark_stateful`).

``map_async`` runs each partition's calls on an event loop of its own, with the bus's
rules (at most ``concurrency`` in flight, the same timeout and ``on_timeout``), and keeps
the partition's order in both modes: unordered mode may reorder results only between two
watermarks, and input order is one of the orders it allows.

JetStream replays too: ``read_jetstream`` with a bounded ``until`` reads its stream range
through the ``jetstream`` data source, decoded, stamped and watermarked per subject as the
bus source does; ``write_jetstream`` publishes with ids that are the same on every run, so
a rerun stores nothing twice (within the stream's duplicate window).
"""

from __future__ import annotations

import asyncio
import collections
import json
import operator
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Sequence
from urllib.parse import urlparse

from gearbus.api.aggregators import Aggregator
from gearbus.api.dsl import BasePipeline
from gearbus.api.steps import (
    Aggregate,
    Filter,
    FlatMap,
    GroupBy,
    IntervalJoin,
    Map,
    MapAsync,
    Merge,
    ProcessKeyed,
    Sink,
    Source,
    StatefulMap,
    Step,
    TableJoin,
    WindowJoin,
    for_step,
)
from gearbus.api.graph import GraphError
from gearbus.control.config import AppConfig
from gearbus.api.task import now_ms
from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from gearbus.artifact import pack
from gearbus.api.windows import (
    LATE,
    ON_TIME,
    Accumulation,
    GlobalWindows,
    SessionWindows,
    WindowResult,
)
from gearbus.connectors.files import CollectionSource, DiscardSink, JsonLinesSink, JsonLinesSource, TextFileSource
from gearbus.connectors.jetstream import JetStreamError, JetStreamTransactionalSink, dedup_id, on_connection
from gearbus.connectors.jetstream_source import JetStreamSource, decoder, partition_watermark, republish
from gearbus.nexmark.schema import problem as nexmark_problem, schema_error
from gearbus.nexmark.sources import EventsFileSource, GeneratorSource
from gearbus.runners import spark_stateful
from gearbus.runners.spark_records import CARRIED, STEP_FAILURE, StepFailure
from gearbus.runtime.async_map import call
from gearbus.runtime.windows import WindowOperator, window_limits
from shared.bus import NATS_URL_ENV
from shared.messages import AppError, AppState

MASTER_CONNECT_TIMEOUT_S = 5.0


class SparkUnavailable(RuntimeError):
    """Spark cannot start here; the message says what to do."""


def _guard(step: str, fn):
    """Wrap a user function so a failure names its step and value."""

    def guarded(value):
        try:
            return fn(value)
        except Exception as exc:
            raise StepFailure(step, value, exc) from exc

    return guarded


def check_java() -> None:
    """Spark needs Java 17 or newer; say so, with the fix, before anything starts."""
    java = shutil.which("java") or (os.path.join(os.environ["JAVA_HOME"], "bin", "java")
                                    if os.environ.get("JAVA_HOME") else None)
    if not java or not os.path.exists(java):
        raise SparkUnavailable("the Spark runner needs Java 17 or newer, and no java was found: install a JDK or "
                               "JRE 17+ (e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SparkUnavailable(f"the Spark runner needs Java 17+, and running {java} failed: {exc}") from None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(match.group(1)) if match else 0
    if major == 1 and match.group(2):
        major = int(match.group(2))
    if major < 17:
        raise SparkUnavailable(f"the Spark runner needs Java 17 or newer; {java} is version {major or 'unknown'} "
                               "(install e.g. openjdk-17-jre-headless, or set JAVA_HOME)")


def check_master(master: str) -> None:
    """A spark:// master that does not answer is a clear error within seconds."""
    if not master.startswith("spark://"):
        return
    for hostport in master.removeprefix("spark://").split(","):
        parsed = urlparse(f"spark://{hostport}")
        try:
            with socket.create_connection((parsed.hostname, parsed.port or 7077), MASTER_CONNECT_TIMEOUT_S):
                return
        except OSError:
            continue
    raise SparkUnavailable(f"no Spark master answers at {master} (tried for {MASTER_CONNECT_TIMEOUT_S:g} s)")


def spark_session(master: str = "local[*]", app_name: str = "gearbus"):
    check_java()
    check_master(master)
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need this Python's packages
    session = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "8")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


class SparkPlan:
    """The translation of one pipeline; :meth:`run` executes its sinks."""

    def __init__(self, pipeline: BasePipeline, spark, nats_servers: Sequence[str] = (), warn=print):
        self.batch = AppConfig.parse(pipeline.config).batch_records  # a bad config fails before Spark is asked
        self.pipeline = pipeline
        self.spark = spark
        self.sc = spark.sparkContext
        self.nats_servers = list(nats_servers)
        self.warn = warn
        self.rdds: dict[Step, object] = {}
        self.watermarks: dict[Step, object] = {}  # step -> its source's max delay, CARRIED or None
        self.outputs: list = []  # what run() does, in order: functions that each write one output
        self.cached: list = []   # RDDs persisted for this run, released after it
        self.ingestion_ms = now_ms()
        for step in pipeline.steps:
            translate = for_step(TRANSLATIONS, step)
            if translate is None:
                raise GraphError(f"step {step.name!r} ({step.kind}) cannot run on the spark runner")
            translate(self, step)
        early = [s.name for s in pipeline.steps if isinstance(s, Aggregate) and s.trigger is not None]
        if early:
            warn(f"spark runner: early triggers of {', '.join(early)} are ignored; a bounded Spark job emits "
                 "final window results only", file=sys.stderr)

    # --- sources --------------------------------------------------------------------

    def source(self, step: Source) -> None:
        data_source = step.data_source
        if isinstance(data_source, JetStreamSource):
            self._jetstream(step, data_source)
            return
        if isinstance(data_source, EventsFileSource):
            rdd = self._json_lines(step, data_source.path, data_source)
        elif isinstance(data_source, JsonLinesSource):
            rdd = self._json_lines(step, data_source.path)
        elif isinstance(data_source, TextFileSource):
            rdd = self.sc.textFile(data_source.path, self.sc.defaultParallelism)
        elif isinstance(data_source, CollectionSource):
            rdd = self.sc.parallelize(data_source.items, self.sc.defaultParallelism)
        elif isinstance(data_source, GeneratorSource):
            rdd = self._generated(step, data_source)
        else:
            raise GraphError(f"step {step.name!r}: the spark runner cannot read a {type(data_source).__name__}; "
                             "it reads TextFileSource, JsonLinesSource, CollectionSource, JetStreamSource and the "
                             "Nexmark sources")
        # The step's event time, else the source's own (as the bus stamps them), else ingestion time.
        timestamp_fn = step.timestamp_fn if step.timestamp_fn is not None else data_source.timestamp_fn
        if timestamp_fn is not None:
            stamp = _guard(step.name, timestamp_fn)
            records = rdd.map(lambda v: (v, int(stamp(v)), None))
        else:
            ts = self.ingestion_ms
            records = rdd.map(lambda v: (v, ts, None))
        self.rdds[step] = records
        self.watermarks[step] = step.watermarks.max_delay_ms

    def _json_lines(self, step: Step, path: str, events: EventsFileSource | None = None):
        """The file's values in file order; with ``events``, each line checked as a Nexmark event
        and only what ``events.select`` keeps."""
        def parse(indexed):
            line, index = indexed
            try:
                value = json.loads(line)
            except ValueError as exc:
                raise StepFailure(step.name, line, ValueError(f"{path}:{index + 1}: not valid JSON ({exc})")) from None
            if events is not None:
                what = nexmark_problem(value)
                if what is not None:
                    raise StepFailure(step.name, line, schema_error(path, index + 1, what, line)) from None
            return value

        lines = self.sc.textFile(path, self.sc.defaultParallelism).zipWithIndex()
        values = lines.filter(lambda pair: pair[0].strip()).map(parse)
        if events is None:
            return values
        return values.map(events.select).filter(lambda value: value is not None)

    def _generated(self, step: Step, source: GeneratorSource):
        """A bounded generator: slices of consecutive event numbers, generated in Spark's
        workers, in event-number order (as one task of the bus would read them)."""
        try:
            slices = source.spark_slices()
        except ValueError as exc:
            raise GraphError(f"step {step.name!r}: the spark runner reads bounded input: {exc}") from None
        starts = self.sc.parallelize(slices, max(1, min(len(slices), self.sc.defaultParallelism)))
        return starts.flatMap(source.slice_values)

    def _jetstream(self, step: Step, source: JetStreamSource) -> None:
        """The stream range the bus source would read, through the ``jetstream`` data source,
        in stream order. Values decode as on the bus (what does not decode is counted,
        skipped and sent to ``dead_letter``); event time is ``timestamp_fn(value)`` or the
        stream's time stamp; each record carries the watermark the bus source would have
        given before its batch (:meth:`_subject_watermarks`)."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        from gearbus.connectors.spark_jetstream import FORMAT, register

        if source.until is None:
            raise GraphError(f"step {step.name!r}: the Spark runner replays bounded history; give until=\"now\" "
                             "or a stream sequence")
        if source.start == "new":
            raise GraphError(f"step {step.name!r}: start=\"new\" reads only what arrives after the start, which a "
                             "bounded replay never sees; give start=\"first\", a stream sequence or a datetime")
        servers = self._servers(step, source.servers)
        first, last = on_connection(servers, lambda nc: _replay_range(nc, step.name, source), source.creds,
                                    name="gearbus-spark-plan")
        register(self.spark)
        reader = (self.spark.read.format(FORMAT).option("servers", ",".join(servers))
                  .option("stream", source.stream).option("start_seq", first).option("end_seq", last))
        if source.creds:
            reader = reader.option("creds", source.creds)
        if source.subjects:
            reader = reader.option("subject", ",".join(source.subjects))
        rows = reader.load().select("subject", "seq", "data", F.unix_millis("timestamp")).rdd
        decode = decoder(source.decode)
        stamp = _guard(step.name, source.timestamp_fn) if source.timestamp_fn is not None else None

        def decoded(partition):
            """(subject, None, value, event time), or (subject, error, (seq, data), None)."""
            for subject, seq, data, stream_ms in partition:
                data = bytes(data)
                try:
                    value = data if decode is None else decode(data)
                except Exception as exc:
                    yield subject, f"{type(exc).__name__}: {exc}", (seq, data), None
                    continue
                yield subject, None, value, stream_ms if stamp is None else int(stamp(value))

        messages = rows.mapPartitions(decoded).persist(StorageLevel.MEMORY_AND_DISK)
        self.cached.append(messages)
        indexed = messages.zipWithIndex()
        batch = self.batch
        stats = (indexed.map(lambda m: ((m[1] // batch, m[0][0]), (m[0][3], m[1], m[0][1] is not None)))
                 .reduceByKey(_merge_stats).collect())
        before = self.sc.broadcast(self._subject_watermarks(stats, source.max_out_of_orderness_ms))
        self.rdds[step] = indexed.filter(lambda m: m[0][1] is None).map(
            lambda m: (m[0][2], m[0][3], None, before.value[m[1] // batch]))
        self.watermarks[step] = CARRIED
        failed = sum(stat[2] for _, stat in stats)
        if failed:
            self.warn(f"spark runner: step {step.name!r}: {failed} messages of stream {source.stream!r} did not "
                      "decode and are skipped" + (f"; they go to {source.dead_letter}" if source.dead_letter else ""),
                      file=sys.stderr)
            if source.dead_letter:
                dead = messages.filter(lambda m: m[1] is not None)
                stream, dead_letter, creds = source.stream, source.dead_letter, source.creds

                def publish(partition) -> None:
                    republish(servers, dead_letter, stream, [(seq, subject, data, error)
                                                             for subject, error, (seq, data), _ in partition], creds)

                self.outputs.append(lambda: dead.foreachPartition(publish))

    def _subject_watermarks(self, stats, max_out_of_orderness_ms: int) -> list[int]:
        """The watermark in force as each batch of ``batch_records`` messages arrives: the bus
        source's after the batch before (and WATERMARK_MIN before its first record). As there,
        it is the minimum over the subjects with messages still to come of their newest
        timestamp − ``max_out_of_orderness_ms`` − 1 (a subject not yet seen: WATERMARK_MIN);
        once no subject has more to come, the newest of all; it never goes back. ``stats``:
        ((batch, subject), (newest event time or None, last index, undecoded count))."""
        newest: dict[int, dict[str, int]] = {}
        last_index: dict[str, int] = {}
        for (b, subject), (ts, index, _) in stats:
            if ts is not None:
                newest.setdefault(b, {})[subject] = ts
            last_index[subject] = max(last_index.get(subject, -1), index)
        by_end = sorted(last_index, key=last_index.get)
        max_ts: dict[str, int] = {}
        watermark, ended, before = None, 0, []
        for b in range(max((key[0] for key, _ in stats), default=-1) + 1):
            before.append(WATERMARK_MIN if watermark is None else watermark)
            for subject, ts in newest.get(b, {}).items():
                max_ts[subject] = max(max_ts.get(subject, ts), ts)
            while ended < len(by_end) and last_index[by_end[ended]] < (b + 1) * self.batch:
                ended += 1
            if not max_ts:
                continue
            current = partition_watermark(max_ts, by_end[ended:], max_out_of_orderness_ms)
            watermark = current if watermark is None else max(watermark, current)
        return before

    def _servers(self, step: Step, own: list[str]) -> list[str]:
        """The step's own NATS servers, else the runner's."""
        servers = own or self.nats_servers
        if not servers:
            raise GraphError(f"step {step.name!r}: no NATS servers; pass servers=... to the step, nats_url=... to "
                             f"the SparkRunner, or set {NATS_URL_ENV}")
        return servers

    # --- stateless steps (a record's items after the key, if any, go along) -------------

    def map(self, step: Map) -> None:
        fn = _guard(step.name, step.fn)
        self._then(step, lambda rdd: rdd.map(lambda r: (fn(r[0]),) + r[1:]))

    def map_async(self, step: MapAsync) -> None:
        name, fn, concurrency, timeout_ms, on_timeout = step.name, step.fn, step.concurrency, step.timeout_ms, step.on_timeout

        def partition(records):
            """Up to ``concurrency`` calls at a time; each result in turn, in input order.
            Leaving the runner cancels what is left (the partition failed or was cut short)."""
            with asyncio.Runner() as runner:
                loop, calls = runner.get_loop(), collections.deque()
                for record in records:
                    if len(calls) == concurrency:
                        yield _awaited(loop, name, *calls.popleft())
                    calls.append((record, loop.create_task(call(fn, record[0], timeout_ms, on_timeout))))
                while calls:
                    yield _awaited(loop, name, *calls.popleft())

        self._then(step, lambda rdd: rdd.mapPartitions(partition))

    def flat_map(self, step: FlatMap) -> None:
        fn = _guard(step.name, lambda v: list(step.fn(v)))
        self._then(step, lambda rdd: rdd.flatMap(lambda r: [(v,) + r[1:] for v in fn(r[0])]))

    def filter(self, step: Filter) -> None:
        fn = _guard(step.name, step.fn)
        self._then(step, lambda rdd: rdd.filter(lambda r: fn(r[0])))

    def group_by(self, step: GroupBy) -> None:
        fn = _guard(step.name, step.key_fn)
        self._then(step, lambda rdd: rdd.map(lambda r: (r[0], r[1], fn(r[0])) + r[3:]))

    def merge(self, step: Merge) -> None:
        self.rdds[step] = self.sc.union([self.rdds[i] for i in step.inputs])
        self.watermarks[step] = None  # interleaving of several sources: no per-record watermark

    def _then(self, step: Step, transform) -> None:
        upstream = step.inputs[0]
        self.rdds[step] = transform(self.rdds[upstream])
        self.watermarks[step] = self.watermarks.get(upstream)

    # --- aggregations -----------------------------------------------------------------

    def aggregate(self, step: Aggregate) -> None:
        assigner, aggregator = step.assigner, step.aggregator
        upstream = self.rdds[step.inputs[0]]
        delay = self.watermarks.get(step.inputs[0])
        if isinstance(assigner, GlobalWindows):
            results = self._global(step, upstream, aggregator)
        else:
            arrivals = self._arrival_watermarks(upstream, delay)
            if isinstance(assigner, SessionWindows):
                results = self._sessions(step, arrivals)
            else:
                results = self._windows(step, arrivals)
        self.rdds[step] = results.map(lambda res: (res, min(res.window_end - 1, WATERMARK_MAX - 1), res.key))
        self.watermarks[step] = None

    def _global(self, step: Aggregate, rdd, aggregator: Aggregator):
        name = step.name
        make, add, merge, result = aggregator.create, aggregator.add, aggregator.merge, aggregator.result
        pairs = rdd.map(lambda r: (r[2], r[0]))

        def create(value):
            return _apply(name, add, make(), value)

        def fold(acc, value):
            return _apply(name, add, acc, value)

        if aggregator.combinable:
            combined = pairs.combineByKey(create, fold, lambda a, b: _apply(name, merge, a, b))
        else:  # no merge: fold each key's values in arrival order
            ordered = pairs.zipWithIndex().map(lambda kv_i: (kv_i[0][0], (kv_i[1], kv_i[0][1])))
            combined = ordered.groupByKey().mapValues(
                lambda values: _fold_in_order(name, add, make(), sorted(values, key=lambda iv: iv[0])))
        return combined.map(lambda kv: WindowResult(kv[0], result(kv[1]), WATERMARK_MIN, WATERMARK_MAX, ON_TIME))

    def _arrival_watermarks(self, rdd, delay):
        """Each record with the watermark in force when the bus would deliver it: the
        source's watermark after the previous batch of ``batch_records`` records (or the
        one the record carries from its source)."""
        return self._watermarked(rdd, delay)[0]

    def _watermarked(self, rdd, delay):
        """:meth:`_arrival_watermarks`, and the watermarks the source reaches after each of
        its batches (None where only the records carry them)."""
        indexed = rdd.zipWithIndex()
        if delay == CARRIED:
            return indexed.map(lambda ri: (ri[0][:3], ri[0][3], ri[1])), None
        if delay is None:
            return indexed.map(lambda ri: (ri[0][:3], WATERMARK_MIN, ri[1])), []
        batch = self.batch
        newest = dict(indexed.map(lambda ri: (ri[1] // batch, ri[0][1])).reduceByKey(max).collect())
        after, running = {}, WATERMARK_MIN
        for b in range(max(newest, default=-1) + 1):
            running = max(running, newest.get(b, WATERMARK_MIN))
            after[b] = running - delay - 1
        before = self.sc.broadcast({b: after.get(b - 1, WATERMARK_MIN) for b in after})
        return indexed.map(lambda ri: (ri[0], before.value[ri[1] // batch], ri[1])), list(after.values())

    def _windows(self, step: Aggregate, arrivals):
        """Tumbling and sliding windows: late records beyond the allowed lateness are
        dropped; the rest combine per (key, window) in Spark."""
        name, assign, lateness, agg = step.name, step.assigner.assign, step.allowed_lateness_ms, step.aggregator
        make, add, merge, result = agg.create, agg.add, agg.merge, agg.result

        def place(arrival):
            (value, ts, key), watermark = arrival[0], arrival[1]
            complete, expired = window_limits(watermark, lateness)
            for window in assign(ts):
                if window.end > expired:  # not past its allowed lateness
                    yield (key, window.start, window.end), (value, window.end <= complete)

        def too_late(arrival):
            (_, ts, _), watermark = arrival[0], arrival[1]
            expired = window_limits(watermark, lateness)[1]
            return all(window.end <= expired for window in assign(ts))

        late_sink = step.late_sink
        if late_sink is not None:
            if not isinstance(late_sink, JsonLinesSink):
                raise GraphError(f"step {step.name!r}: the spark runner writes late records to a JsonLinesSink only")
            late = arrivals.filter(too_late).map(lambda a: a[0])
            self.outputs.append(lambda: _write_jsonl(late_sink, late))

        def create(item):
            return [_apply(name, add, make(), item[0]), item[1]]

        def fold(acc, item):
            acc[0] = _apply(name, add, acc[0], item[0])
            acc[1] = acc[1] or item[1]
            return acc

        combined = arrivals.flatMap(place).combineByKey(
            create, fold, lambda a, b: [_apply(name, merge, a[0], b[0]), a[1] or b[1]])
        return combined.map(lambda kv: WindowResult(kv[0][0], result(kv[1][0]), kv[0][1], kv[0][2],
                                                    LATE if kv[1][1] else ON_TIME))

    def _sessions(self, step: Aggregate, arrivals):
        """Session windows merge per key, so each key's records go, in arrival order,
        through the bus's own WindowOperator; its last pane per session is the result."""
        assigner, agg, lateness, name = step.assigner, step.aggregator, step.allowed_lateness_ms, step.name

        def sessions(key, items):
            op = WindowOperator(assigner, agg, None, Accumulation.ACCUMULATING, lateness)
            final = {}
            try:
                for (value, ts, _), watermark, _ in sorted(items, key=lambda item: item[2]):
                    for pane in op.process(key, value, ts, watermark):
                        final[(pane.window_start, pane.window_end)] = pane
                for pane in op.advance(WATERMARK_MAX):
                    final[(pane.window_start, pane.window_end)] = pane
            except Exception as exc:
                raise StepFailure(name, key, exc) from exc
            return list(final.values())

        return arrivals.map(lambda a: (a[0][2], a)).groupByKey().flatMap(lambda kv: sessions(kv[0], kv[1]))

    # --- sinks --------------------------------------------------------------------------

    def sink(self, step: Sink) -> None:
        data_sink, rdd = step.data_sink, self.rdds[step.inputs[0]]
        if isinstance(data_sink, JsonLinesSink):
            self.outputs.append(lambda: _write_jsonl(data_sink, rdd))
        elif isinstance(data_sink, JetStreamTransactionalSink):
            self._jetstream_sink(step, data_sink, rdd)
        elif isinstance(data_sink, DiscardSink):
            self.outputs.append(rdd.count)
        else:
            raise GraphError(f"step {step.name!r}: the spark runner cannot write a {type(data_sink).__name__}; "
                             "it writes JsonLinesSink, JetStreamTransactionalSink and DiscardSink")

    def _jetstream_sink(self, step: Step, data_sink: JetStreamTransactionalSink, rdd) -> None:
        """Each value as JSON, through the ``jetstream`` data source's sink, under a
        Nats-Msg-Id that every run of the job gives it again: ``id_fn(value)``, else the
        pipeline, step and content with the value's rank among equal ones (Spark's output
        order varies between runs; the multiset of values does not). So a rerun stores
        nothing twice and equal values are not taken for repeats of each other."""
        from pyspark.sql.types import BinaryType, StringType, StructField, StructType

        from gearbus.connectors.spark_jetstream import FORMAT, register

        servers, subject, id_fn = self._servers(step, data_sink.servers), data_sink.subject, data_sink.id_fn
        encode = _guard(step.name, lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode())
        if id_fn is not None:
            make_id = _guard(step.name, lambda v: str(id_fn(v)))
            rows = rdd.map(lambda r: (encode(r[0]), make_id(r[0])))
        else:
            prefix = f"{self.pipeline.name}/{step.name}"
            rows = rdd.map(lambda r: (encode(r[0]), 1)).reduceByKey(operator.add).flatMap(
                lambda dn: [(dn[0], f"{prefix}/{dedup_id(subject, dn[0])}/{i}") for i in range(dn[1])])
        schema = StructType([StructField("data", BinaryType(), False), StructField("id", StringType(), False)])

        def write() -> None:
            register(self.spark)
            writer = (self.spark.createDataFrame(rows, schema).write.format(FORMAT).mode("append")
                      .option("servers", ",".join(servers)).option("subject", subject))
            if data_sink.creds:
                writer = writer.option("creds", data_sink.creds)
            if data_sink.stream:
                writer = (writer.option("stream", data_sink.stream)
                          .option("duplicate_window", data_sink.duplicate_window_s))
            writer.save()

        self.outputs.append(write)

    def run(self) -> None:
        try:
            for write in self.outputs:
                write()
        finally:
            for rdd in self.cached:
                rdd.unpersist()


def _write_jsonl(data_sink: JsonLinesSink, rdd) -> None:
    path = data_sink.path
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)
    rdd.map(lambda r: json.dumps(r[0], ensure_ascii=False)).saveAsTextFile(path)


async def _replay_range(nc, step: str, source: JetStreamSource) -> tuple[int, int]:
    """The first and last stream sequence the bus source would read, as of now, found as the
    bus finds them (the same refusal: a missing stream),
    and a refusal of an ``until`` past the stream's end, which the bus would wait for and a
    replay cannot."""
    try:
        _, position, until, last = await source.locate(nc)
    except JetStreamError as exc:
        raise JetStreamError(f"step {step!r}: {exc}") from None
    if until > last:
        raise JetStreamError(f"step {step!r}: until={until} is past the end of stream {source.stream!r} (sequence "
                             f"{last}): the Spark runner replays what the stream holds and cannot wait for more")
    return position + 1, until


def _merge_stats(a, b):
    """Two (newest event time or None, last index, undecoded count) of a batch's subject, as one."""
    newest = b[0] if a[0] is None else a[0] if b[0] is None else max(a[0], b[0])
    return newest, max(a[1], b[1]), a[2] + b[2]


def _apply(step: str, fn, *args):
    try:
        return fn(*args)
    except Exception as exc:
        raise StepFailure(step, args[-1], exc) from exc


def _awaited(loop, step: str, record: tuple, task: asyncio.Task) -> tuple:
    """``record`` with the result of its call (run on ``loop`` until it is in)."""
    try:
        value = loop.run_until_complete(task)
    except Exception as exc:
        raise StepFailure(step, record[0], exc) from exc
    return (value,) + record[1:]


def _fold_in_order(step: str, add, acc, indexed_values):
    for _, value in indexed_values:
        acc = _apply(step, add, acc, value)
    return acc


TRANSLATIONS = {
    Source: SparkPlan.source,
    Map: SparkPlan.map,
    MapAsync: SparkPlan.map_async,
    FlatMap: SparkPlan.flat_map,
    Filter: SparkPlan.filter,
    GroupBy: SparkPlan.group_by,  # and a repartition: one stage on Spark, its intermediate stream a shuffle
    Merge: SparkPlan.merge,
    Aggregate: SparkPlan.aggregate,
    WindowJoin: spark_stateful.join,
    IntervalJoin: spark_stateful.join,
    TableJoin: spark_stateful.join,
    StatefulMap: spark_stateful.keyed,
    ProcessKeyed: spark_stateful.keyed,
    Sink: SparkPlan.sink,
}


def ship_module(sc, path: str) -> None:
    """Make the app's module importable in Spark's Python workers (its functions are
    pickled by reference): the .py file itself, or a package zipped."""
    artifact = pack(path)
    if artifact.kind == "module":
        sc.addPyFile(os.path.abspath(path))
        return
    target = os.path.join(tempfile.mkdtemp(prefix="gearbus-spark-"), f"{artifact.entry}.zip")
    with open(target, "wb") as f:
        f.write(artifact.data)
    sc.addPyFile(target)


def failure_from(exc: BaseException) -> AppError:
    """The user's error out of a Spark failure: the step and Python exception, not the JVM trace."""
    text = str(exc)
    match = re.search(re.escape(STEP_FAILURE) + r" \[(\w+)\] (.*?\(step '[^']*'.*?\))", text, re.S)
    if match:
        return AppError(match.group(1), match.group(2), "spark", text[-4000:])
    python_errors = re.findall(r"^(\w+(?:Error|Exception)): (.+)$", text, re.M)  # from a Python worker
    if python_errors:
        error_type, message = python_errors[-1]
        return AppError(error_type, message, "spark", text[-4000:])
    return AppError(type(exc).__name__, text.splitlines()[0] if text else repr(exc), "spark", traceback.format_exc())


class SparkRunner:
    """Runs a DSL pipeline on Spark (``local[*]`` by default, or a ``spark://`` master).
    ``nats_url`` (default ``$GEARBUS_NATS_URL``): the NATS of JetStream steps without
    servers of their own."""

    def __init__(self, master: str = "local[*]", spark=None, nats_url: str | Sequence[str] | None = None):
        self.master = master
        self.spark = spark
        nats_url = nats_url or os.environ.get(NATS_URL_ENV)
        self.nats_servers = nats_url.split(",") if isinstance(nats_url, str) else list(nats_url or [])

    def run(self, app, args: Sequence[str] = ()):
        from gearbus.runners import RunResult, load_pipeline

        pipeline = load_pipeline(app, args)
        AppConfig.parse(pipeline.config)  # a bad config is refused before a Spark session starts
        spark = self.spark or spark_session(self.master, pipeline.name)
        if isinstance(app, str):
            ship_module(spark.sparkContext, app)
        try:
            SparkPlan(pipeline, spark, self.nats_servers).run()
        except GraphError:
            raise
        except Exception as exc:
            return RunResult(AppState.FAILED, error=failure_from(exc), name=pipeline.name)
        return RunResult(AppState.SUCCEEDED, name=pipeline.name)


__all__ = ["SparkRunner", "SparkUnavailable", "check_java", "check_master", "spark_session"]
