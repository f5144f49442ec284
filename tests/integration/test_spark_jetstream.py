"""JetStream as a Spark source and sink (format "jetstream"), against a real nats-server
with JetStream and a local[2] Spark session shared across the file."""

from __future__ import annotations

import datetime
import json
import os
import time
import uuid

import pytest

from bench.spark_jetstream import measure_throughput
from gearbus.connectors import jetstream
from gearbus.connectors import spark_jetstream as sj
from gearbus.natsserver import NatsServer
from tests.support.spark import shared_spark

pytestmark = pytest.mark.spark

N = 30_000  # the batch read's records: two partitions of more than one Arrow chunk (CHUNK_ROWS) each
#: the streaming tests' records: several micro-batches each (exactness at N is the batch read's)
STREAMED = 40_000


@pytest.fixture(scope="module")
def spark():
    session = shared_spark()
    sj.register(session)
    return session


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    store = tmp_path_factory.mktemp("jetstream")
    with NatsServer(store_dir=str(store)) as s:
        yield s


def new_stream(server, prefix: str, duplicate_window_s: float = 120.0) -> tuple[str, str]:
    """A fresh stream (name, subject prefix) on the shared server."""
    tag = uuid.uuid4().hex[:8]
    name, subject = f"{prefix}_{tag}".upper(), f"{prefix}.{tag}".lower()
    jetstream.ensure_stream(server.url, name, [f"{subject}.>"], duplicate_window_s)
    return name, subject


def payloads(start: int, stop: int) -> list[bytes]:
    return [b"rec-%07d" % i for i in range(start, stop)]


def publish(server, subject: str, data: list[bytes]) -> None:
    stored, duplicates = jetstream.publish_messages(server.url, subject, data)
    assert (stored, duplicates) == (len(data), 0)


def source(spark, server, stream: str, **options):
    reader = spark.read.format("jetstream").option("servers", server.url).option("stream", stream)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def stream_source(spark, server, stream: str, **options):
    reader = spark.readStream.format("jetstream").option("servers", server.url).option("stream", stream)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def messages(server, stream: str) -> int:
    return int(jetstream.stream_state(server.url, stream)["messages"])


# --------------------------------------------------------------------------- batch source


def test_split_range_is_contiguous_and_even():
    parts = sj.split_range(11, 110, 3)
    assert [(p.first, p.last) for p in parts] == [(11, 43), (44, 76), (77, 110)]
    assert [(p.first, p.last) for p in sj.split_range(1, 2, 8)] == [(1, 1), (2, 2)]
    assert sj.split_range(5, 4, 2) == []



def test_batch_read_of_30k_records_is_exact(spark, server):
    stream, subject = new_stream(server, "batch")
    data = payloads(0, N)
    before = time.time()
    publish(server, f"{subject}.a", data)
    after = time.time()

    df = source(spark, server, stream)
    assert [f.name for f in df.schema.fields] == ["seq", "subject", "data", "timestamp"]
    assert df.rdd.getNumPartitions() == spark.sparkContext.defaultParallelism
    rows = df.collect()
    assert len(rows) == N
    assert sorted(r.data for r in rows) == data
    assert sorted(r.seq for r in rows) == list(range(1, N + 1))
    assert {r.subject for r in rows} == {f"{subject}.a"}
    # the session time zone is UTC: timestamps come back naive, in UTC
    stamps = [r.timestamp.replace(tzinfo=datetime.timezone.utc).timestamp() for r in rows]
    assert before - 1 <= min(stamps) <= max(stamps) <= after + 1
    # in stream order within each partition, so the rows by seq carry the payloads in publish order
    assert [r.data for r in sorted(rows, key=lambda r: r.seq)] == data


def test_batch_read_of_a_range_with_a_subject_filter(spark, server):
    stream, subject = new_stream(server, "range")
    publish(server, f"{subject}.a", [b"%d" % i for i in range(1, 501)])     # seq 1..500
    publish(server, f"{subject}.b", [b"%d" % i for i in range(501, 1001)])  # seq 501..1000

    df = source(spark, server, stream, start_seq=400, end_seq=900, subject=f"{subject}.b", partitions=3)
    assert df.rdd.getNumPartitions() == 3
    assert sorted((r.seq, r.data) for r in df.collect()) == [(i, b"%d" % i) for i in range(501, 901)]

    df = source(spark, server, stream, start_seq=100, end_seq=700, subject=f"{subject}.a", partitions=3)
    assert sorted(r.seq for r in df.collect()) == list(range(100, 501))

    assert sorted(r.seq for r in source(spark, server, stream, start_seq=950).collect()) == list(range(950, 1001))
    assert source(spark, server, stream, subject=f"{subject}.none").count() == 0
    assert source(spark, server, stream, start_seq=2000).count() == 0


def test_batch_read_of_a_missing_stream_names_it(spark, server):
    with pytest.raises(Exception, match="stream not found"):
        source(spark, server, "NO_SUCH_STREAM").collect()


# --------------------------------------------------------------------------- streaming source


def test_streaming_reads_each_record_once_and_picks_up_new_ones(spark, server, tmp_path):
    stream, subject = new_stream(server, "live")
    publish(server, f"{subject}.a", payloads(0, STREAMED))
    name = f"live_{uuid.uuid4().hex[:8]}"
    query = (stream_source(spark, server, stream).writeStream.format("memory").queryName(name)
             .trigger(processingTime="100 milliseconds")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        query.processAllAvailable()
        count, distinct, low, high = spark.sql(
            f"SELECT count(*), count(DISTINCT data), min(seq), max(seq) FROM {name}").first()
        assert (count, distinct, low, high) == (STREAMED, STREAMED, 1, STREAMED)

        publish(server, f"{subject}.a", payloads(STREAMED, STREAMED + 30_000))
        query.processAllAvailable()
        count, distinct, low, high = spark.sql(
            f"SELECT count(*), count(DISTINCT data), min(seq), max(seq) FROM {name}").first()
        assert (count, distinct, low, high) == (STREAMED + 30_000, STREAMED + 30_000, 1, STREAMED + 30_000)
        end = query.lastProgress["sources"][0]["endOffset"]
        assert (json.loads(end) if isinstance(end, str) else end) == {"seq": STREAMED + 30_000}
    finally:
        query.stop()
        spark.sql(f"DROP VIEW IF EXISTS {name}")


def test_available_now_reads_in_limited_batches_and_resumes_from_its_checkpoint(spark, server, tmp_path):
    stream, subject = new_stream(server, "avail")
    publish(server, f"{subject}.a", payloads(0, STREAMED))
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def run():
        query = (stream_source(spark, server, stream, max_records_per_batch=10_000)
                 .select("seq", "data").writeStream.format("parquet").option("path", out)
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        query.awaitTermination(60)
        assert not query.isActive
        assert query.exception() is None
        return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]

    assert run() == [10_000] * 4  # the read limit is respected under Trigger.AvailableNow
    written = spark.read.parquet(out)
    assert (written.count(), written.select("data").distinct().count()) == (STREAMED, STREAMED)

    publish(server, f"{subject}.a", payloads(STREAMED, STREAMED + 10_000))
    assert run() == [10_000]  # restarted from the checkpoint: only the new records
    written = spark.read.parquet(out)
    assert (written.count(), written.select("seq").distinct().count()) == (STREAMED + 10_000, STREAMED + 10_000)
    assert sorted(r.data for r in written.select("data").collect()) == payloads(0, STREAMED + 10_000)


# --------------------------------------------------------------------------- sink


def test_sink_killed_mid_batch_and_restarted_neither_loses_nor_duplicates(spark, server, tmp_path):
    src, src_subject = new_stream(server, "sinksrc")
    out, out_subject = new_stream(server, "sinkout")
    total, batch = STREAMED, 10_000  # four micro-batches
    publish(server, f"{src_subject}.a", payloads(0, total))
    checkpoint = str(tmp_path / "checkpoint")

    def start():
        return (stream_source(spark, server, src, max_records_per_batch=batch).select("data")
                .writeStream.format("jetstream").option("servers", server.url)
                .option("subject", f"{out_subject}.x").option("checkpointLocation", checkpoint)
                .trigger(availableNow=True).start())

    # 1. stop the query while a micro-batch is publishing (the target holds part of the batch)
    query = start()
    seen_partial = None
    deadline = time.monotonic() + 60
    while query.isActive and time.monotonic() < deadline:
        stored = messages(server, out)
        if 0 < stored < total and stored % batch:
            seen_partial = stored
            query.stop()
            break
        time.sleep(0.01)
    query.stop()
    assert seen_partial is not None, "the query was not caught mid-batch"
    # Killing the tasks does not stop their Python workers at once: they publish the rows
    # they already hold. Wait until the target stops growing.
    stopped_at, still = messages(server, out), 0
    while still < 3:
        time.sleep(0.2)
        now = messages(server, out)
        still, stopped_at = (still + 1 if now == stopped_at else 0), now
    assert seen_partial <= stopped_at < total
    offsets = [f for f in os.listdir(os.path.join(checkpoint, "offsets")) if f.isdigit()]
    commits = [f for f in os.listdir(os.path.join(checkpoint, "commits")) if f.isdigit()]
    assert len(offsets) == len(commits) + 1  # the batch that ran was planned, not committed

    # 2. restart from the checkpoint: the uncommitted batch is replayed; its repeats are dropped
    query = start()
    query.awaitTermination(60)
    assert query.exception() is None
    assert messages(server, out) == total

    # 3. replay the last batch once more (as if the driver died after publishing, before committing)
    last = max(int(f) for f in os.listdir(os.path.join(checkpoint, "commits")) if f.isdigit())
    os.remove(os.path.join(checkpoint, "commits", str(last)))
    crc = os.path.join(checkpoint, "commits", f".{last}.crc")
    if os.path.exists(crc):
        os.remove(crc)
    query = start()
    query.awaitTermination(60)
    assert query.exception() is None
    assert [p["batchId"] for p in query.recentProgress if p["numInputRows"]] == [last]

    target = source(spark, server, out)
    assert messages(server, out) == total
    assert sorted(r.data for r in target.select("data").collect()) == payloads(0, total)  # each once


def test_batch_sink_uses_id_and_subject_columns(spark, server):
    out, out_subject = new_stream(server, "batchout")
    rows = [(i, f"{out_subject}.{'even' if i % 2 == 0 else 'odd'}", f"value {i % 10}") for i in range(1000)]
    df = spark.createDataFrame(rows, "id long, subject string, data string")
    df.write.format("jetstream").mode("append").option("servers", server.url).save()
    df.write.format("jetstream").mode("append").option("servers", server.url).save()  # all duplicates
    assert messages(server, out) == 1000  # data repeats, ids do not: all kept, once
    back = source(spark, server, out).collect()
    assert sorted((r.subject, r.data) for r in back) == sorted((s, d.encode()) for _, s, d in rows)

    # without an id column the dedup id is a hash of subject and data
    df.select("subject", "data").write.format("jetstream").mode("append").option("servers", server.url).save()
    # 10 distinct (subject, data) pairs (even i -> even values, odd i -> odd values), stored once
    assert messages(server, out) == 1000 + 10


def test_sink_rejects_rows_without_data_or_subject(spark, server):
    df = spark.createDataFrame([(1,)], "x long")
    with pytest.raises(Exception, match="'data' column"):
        df.write.format("jetstream").mode("append").option("servers", server.url).option("subject", "a").save()
    df = spark.createDataFrame([("x",)], "data string")
    with pytest.raises(Exception, match="option 'subject'"):
        df.write.format("jetstream").mode("append").option("servers", server.url).save()


def test_sink_to_a_subject_no_stream_captures_fails_clearly_and_option_stream_creates_it(spark, server):
    subject = f"nostream.{uuid.uuid4().hex[:8]}"
    df = spark.createDataFrame([(b"a",), (b"b",)], "data binary")
    with pytest.raises(Exception, match="no JetStream stream captures subject"):
        df.write.format("jetstream").mode("append").option("servers", server.url).option("subject", subject).save()
    stream = f"CREATED_{uuid.uuid4().hex[:8]}".upper()
    for _ in range(2):
        (df.write.format("jetstream").mode("append").option("servers", server.url).option("subject", subject)
         .option("stream", stream).option("duplicate_window", 60).save())
    assert messages(server, stream) == 2


# --------------------------------------------------------------------------- throughput


def test_measure_throughput(spark, server):
    """bench/spark_jetstream.py's measurement runs (on a tenth of N: the exactness of a
    100,000-record read is the batch test's)."""
    result = measure_throughput(server.url, N // 10, spark)
    assert result["records"] == N // 10
    assert result["source_records_per_s"] > 0 and result["sink_records_per_s"] > 0
