"""Bus → Spark and back: a bus app writes readings into JetStream, the backfill example's
Structured Streaming query averages them per sensor and minute, and publishes the results
to a JetStream subject."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys

import pytest

from gearbus.artifact import pack
from gearbus.connectors import jetstream
from shared.messages import AppState
from tests.support.paths import APPS, EXAMPLES, REPO

pytestmark = pytest.mark.spark

BASE = 1_700_000_000_000
#: examples/backfill.py's main run, says "ran", waits for a line, runs again.
TWICE = """
import sys
sys.path.insert(0, sys.argv[1])
import backfill
backfill.main(sys.argv[2:])
print("ran", flush=True)
sys.stdin.readline()
backfill.main(sys.argv[2:])
"""


async def read_all(client, subject: str, count: int) -> list[dict]:
    sub = await client.bus.js.subscribe(subject, ordered_consumer=True)
    rows = [json.loads((await sub.next_msg(timeout=10)).data) for _ in range(count)]
    await sub.unsubscribe()
    return rows


async def test_spark_averages_what_the_bus_wrote_and_publishes_them_back(cluster, client, tmp_path):
    app_id = await client.submit(pack(os.path.join(APPS, "to_jetstream.py")), [cluster.url, "1200"])
    assert (await client.wait(app_id, timeout=60)).state == AppState.SUCCEEDED

    loop = asyncio.get_running_loop()
    log = tmp_path / "backfill.log"
    # The example's main, with the arguments a user gives it, twice in one process: once,
    # then (when the test has read what it stored) again from its checkpoint. The second
    # run reuses the first one's Spark session instead of starting another JVM.
    with open(log, "w") as errors:
        example = subprocess.Popen(
            [sys.executable, "-c", TWICE, EXAMPLES, "--nats", cluster.url, "--stream", "READINGS",
             "--checkpoint", str(tmp_path / "checkpoint"), "--available-now", "--spark-master", "local[2]"],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True)
    try:
        ran = await asyncio.wait_for(loop.run_in_executor(None, example.stdout.readline), 300)
        assert ran == "ran\n", log.read_text()[-3000:]
        stored = (await loop.run_in_executor(None, jetstream.stream_state, cluster.url,
                                             "SENSOR_AVERAGES"))["messages"]
        rows = await read_all(client, "sensors.averages", stored)

        await loop.run_in_executor(None, lambda: example.communicate("\n", timeout=300))
        assert example.returncode == 0, log.read_text()[-3000:]
    finally:
        if example.poll() is None:
            example.kill()
            example.wait()
    final = {}
    for row in rows:  # the last message of a window is its answer
        final[(row["sensor"], row["window_start"])] = row

    temps = collections.defaultdict(list)  # the readings the bus app wrote (see tests/apps/to_jetstream.py)
    for n in range(1200):
        ts = BASE + n * 250
        temps[(f"s{n % 4}", ts // 60_000 * 60_000)].append(n % 30)
    expected = {key: {"sensor": key[0], "window_start": key[1], "window_end": key[1] + 60_000,
                      "avg": round(sum(v) / len(v), 6), "count": len(v)} for key, v in temps.items()}
    assert final == expected

    # the second run restarted from its checkpoint: nothing new, nothing twice
    again = (await loop.run_in_executor(None, jetstream.stream_state, cluster.url, "SENSOR_AVERAGES"))["messages"]
    assert again == stored
