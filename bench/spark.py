"""The wordcount on Spark: `gearbus run --runner spark` beside a hand-written PySpark RDD
wordcount, in the same run, both timed from command start (Spark session included) to exit.

    python bench/spark.py [--lines 200000] [--repeat 3] [--master local[*]]

Also prints the JetStream source's records/s into Spark and the sink's records/s back out
(bench/spark_jetstream.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_RATIO = 1.1

HAND_WRITTEN = """
import json, sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master(sys.argv[3]).appName("rdd-wordcount")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
sc = spark.sparkContext
counts = (sc.textFile(sys.argv[1], sc.defaultParallelism).flatMap(str.split)
          .map(lambda w: (w, 1)).reduceByKey(lambda a, b: a + b))
counts.map(lambda wc: json.dumps({"word": wc[0], "count": wc[1]}, ensure_ascii=False)).saveAsTextFile(sys.argv[2])
spark.stop()
"""


def generate(path: str, lines: int, seed: int = 42) -> None:
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(10_000)]
    with open(path, "w") as f:
        for _ in range(lines):
            f.write(" ".join(rng.choices(vocabulary, k=10)) + "\n")


def timed(command: list[str], env: dict) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def read_counts(directory: str) -> dict[str, int]:
    counts = {}
    for name in sorted(os.listdir(directory)):
        if name.startswith("part-"):
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                for line in f:
                    row = json.loads(line)
                    counts[row["word"]] = row["count"]
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--master", default="local[*]")
    opts = parser.parse_args(argv)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    gearbus = [sys.executable, "-m", "gearbus.cli", "run", "--runner", "spark", "--spark-master", opts.master,
               os.path.join(REPO, "examples", "wordcount.py")]
    ours, theirs = [], []
    with tempfile.TemporaryDirectory(prefix="gearbus-spark-bench-") as tmp:
        source = os.path.join(tmp, "input.txt")
        generate(source, opts.lines)
        for trial in range(opts.repeat):
            out_ours, out_theirs = os.path.join(tmp, f"ours-{trial}"), os.path.join(tmp, f"theirs-{trial}")
            ours.append(timed(gearbus + ["--input", source, "--output", out_ours], env))
            theirs.append(timed([sys.executable, "-c", HAND_WRITTEN, source, out_theirs, opts.master], env))
            if read_counts(out_ours) != read_counts(out_theirs):
                raise SystemExit("gearbus on Spark and the hand-written RDD wordcount disagree")
            print(f"trial {trial + 1}/{opts.repeat}: gearbus {ours[-1]:.2f} s, hand-written {theirs[-1]:.2f} s",
                  file=sys.stderr, flush=True)
    ratio = statistics.median(ours) / statistics.median(theirs)
    print(f"wordcount on Spark ({opts.master}), {opts.lines:,} lines x 10 words, {opts.repeat} trials, "
          f"wall from command start to exit (Spark session included); {os.cpu_count()} CPUs")
    print(f"{'s':<26}{'median':>8}{'best':>8}")
    print(f"{'gearbus run --runner spark':<26}{statistics.median(ours):>8.2f}{min(ours):>8.2f}")
    print(f"{'hand-written RDD':<26}{statistics.median(theirs):>8.2f}{min(theirs):>8.2f}")
    print(f"ratio {ratio:.2f}x (target <= {TARGET_RATIO}x: {'meets' if ratio <= TARGET_RATIO else 'MISSES'}); "
          "outputs identical")
    from spark_jetstream import NatsServer, measure_throughput  # bench/, beside this file

    with NatsServer() as server:
        figures = measure_throughput(server.url, 100_000)
    print(f"JetStream -> Spark source: {figures['source_records_per_s']:,.0f} records/s; Spark -> JetStream sink: "
          f"{figures['sink_records_per_s']:,.0f} records/s (100,000 records of 100 bytes, warm workers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
