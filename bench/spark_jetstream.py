"""The JetStream Spark connector's throughput: records/s of the ``jetstream`` source into
Spark and of its sink back out, on an embedded nats-server.

    python bench/spark_jetstream.py [N]          (N records of 100 bytes, default 100,000)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from gearbus.connectors.jetstream import JetStreamError, ensure_stream, publish_messages, stream_state  # noqa: E402
from gearbus.connectors.spark_jetstream import FORMAT, register  # noqa: E402
from gearbus.natsserver import NatsServer  # noqa: E402


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


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as store, NatsServer(store_dir=store) as server:
        measure_throughput(server.url, int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
