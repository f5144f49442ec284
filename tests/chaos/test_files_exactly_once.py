"""Exactly-once with files: the wordcount (``--combine-keys 1``: a heavy shuffle) over
300,000 lines, with the executor reading a split SIGKILLed in the middle of it, and in
another run the executor hosting the sink. The counts must equal ``collections.Counter``
over the file exactly, with every word once: a restarted source resumes from its
checkpointed byte offset and the sink's file holds each committed result once."""

from __future__ import annotations

import collections
import json
import os
import random
import signal

import pytest

from gearbus.artifact import pack
from gearbus.client import Client
from gearbus.cluster import LocalCluster
from shared import subjects
from shared.messages import AppState
from tests.support.cluster import wait_for_workers, wait_until
from tests.support.paths import WORDCOUNT

LINES = 300_000
READ, WRITE = 0, 1  # processors: read+split+combine, then count+format; the sink is the last

pytestmark = pytest.mark.timeout(180)


def write_input(path) -> collections.Counter:
    rng = random.Random(11)
    vocabulary = [f"w{i}" for i in range(10_000)]
    expected = collections.Counter()
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(LINES):
            words = rng.choices(vocabulary, k=10)
            expected.update(words)
            f.write(" ".join(words) + "\n")
    return expected


def executor_ids(cluster) -> dict[int, int]:
    """executor id -> pid, as the workers launched them."""
    return {executor_id: pid for (_, executor_id), pid in cluster.launches().items() if executor_id >= 0}


@pytest.mark.parametrize("victim", ["source", "sink"])
async def test_wordcount_survives_a_killed_executor_exactly(victim, tmp_path):
    source, output = tmp_path / "lines.txt", tmp_path / "out" / "counts.jsonl"
    expected = write_input(source)
    with LocalCluster(workers=2, slots=4, log_dir=str(tmp_path / "logs"), heartbeat_interval=0.25) as cluster:
        async with Client(cluster.url, timeout=30) as client:
            await wait_for_workers(client, 2)
            app_id = await client.submit(
                pack(WORDCOUNT), ["--input", str(source), "--output", str(output), "--combine-keys", "1"],
                config={"checkpoint_interval_ms": 100, "batch_records": 512})
            split = LINES // 2

            async def mid_split():
                status = await client.status(app_id)
                assert status.state in (AppState.PENDING, AppState.ACTIVE), f"the app ended before the kill: {status}"
                read = {c.task.index: c.records_in for c in status.tasks if c.task.processor == READ}
                checkpointed = status.checkpoints is not None and status.checkpoints.last_id
                return read if min(read.values(), default=0) >= 0.3 * split and checkpointed else None

            await wait_until(client, subjects.appmaster_heartbeat("*"), mid_split)
            # Tasks with index i run on executor i (task placement by index): the source task
            # 0 and the sink (one task, index 0) share executor 0, so kill executor 1 to hit a
            # split alone, executor 0 to hit the sink.
            os.kill(executor_ids(cluster)[1 if victim == "source" else 0], signal.SIGKILL)
            final = await client.wait(app_id, timeout=120)
    assert final.state == AppState.SUCCEEDED, final.error
    assert final.restarts >= 1 and final.checkpoints.epoch >= 1
    with open(output, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    counts = {row["word"]: row["count"] for row in rows}
    assert len(rows) == len(counts), "a word was written twice"
    assert counts == dict(expected)
