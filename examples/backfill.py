"""Bus → Spark and back: the sensors averages as a Spark Structured Streaming query over a
JetStream stream that bus apps write into, with its results published to a JetStream subject.

    python examples/backfill.py --nats nats://127.0.0.1:4222 --stream READINGS \\
        --output-subject sensors.averages --checkpoint /tmp/backfill-ckpt [--available-now]

Input messages: JSON ``{"sensor": str, "temp": float, "ts": epoch_ms}`` (as a bus app with
``write_jetstream`` writes them). Output messages: JSON ``{"sensor", "window_start",
"window_end", "avg", "count"}`` per one-minute event-time window, re-published whenever a
window's value changes (the last message of a window is its answer). Offsets live in the
checkpoint and every message's ``Nats-Msg-Id`` is derived from its content, so a restarted
query neither loses nor duplicates results.
"""

from __future__ import annotations

import argparse
import sys

MINUTE = "1 minute"


def build_query(spark, servers: str, stream: str, output_subject: str, output_stream: str, checkpoint: str,
                max_delay: str = "5 seconds", available_now: bool = False):
    """Start the streaming query; returns the StreamingQuery."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    from gearbus.connectors.spark_jetstream import register

    register(spark)
    reading = StructType([StructField("sensor", StringType()), StructField("temp", DoubleType()),
                          StructField("ts", LongType())])
    readings = (spark.readStream.format("jetstream").option("servers", servers).option("stream", stream).load()
                .select(F.from_json(F.col("data").cast("string"), reading).alias("r")).select("r.*")
                .withColumn("event_time", F.timestamp_millis("ts")))
    averages = (readings.withWatermark("event_time", max_delay)
                .groupBy(F.window("event_time", MINUTE), "sensor")
                .agg(F.avg("temp").alias("avg"), F.count(F.lit(1)).alias("count")))
    row = F.struct(
        "sensor",
        F.unix_millis(F.col("window.start")).alias("window_start"),
        F.unix_millis(F.col("window.end")).alias("window_end"),
        F.round("avg", 6).alias("avg"),
        "count",
    )
    messages = averages.select(F.to_json(row).alias("data")).withColumn("id", F.sha2("data", 256))

    def publish(batch, epoch_id):
        """Each micro-batch's changed windows, through the batch sink (streaming Python sinks
        take append mode only); a replayed batch is deduplicated by the ids."""
        (batch.write.format("jetstream").mode("append").option("servers", servers)
         .option("subject", output_subject).option("stream", output_stream).save())

    writer = (messages.writeStream.outputMode("update").foreachBatch(publish)
              .option("checkpointLocation", checkpoint))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="1 second")
    return writer.start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="backfill", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nats", default="nats://127.0.0.1:4222", help="NATS URLs, comma-separated")
    parser.add_argument("--stream", required=True, help="JetStream stream with the readings")
    parser.add_argument("--output-subject", default="sensors.averages")
    parser.add_argument("--output-stream", default="SENSOR_AVERAGES", help="created if missing")
    parser.add_argument("--checkpoint", required=True, help="Spark checkpoint directory")
    parser.add_argument("--max-delay", default="5 seconds", help="how late readings may arrive")
    parser.add_argument("--available-now", action="store_true", help="process what is there, then stop")
    parser.add_argument("--spark-master", default="local[*]")
    opts = parser.parse_args(argv)
    from gearbus.runners.spark import spark_session

    spark = spark_session(opts.spark_master, "gearbus-backfill")
    query = build_query(spark, opts.nats, opts.stream, opts.output_subject, opts.output_stream, opts.checkpoint,
                        opts.max_delay, opts.available_now)
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
