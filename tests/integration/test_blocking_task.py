"""A task that blocks its executor's loop for longer than the executor timeout is slow,
not dead: heartbeats go from a thread of their own, so the app is not rolled back."""

from __future__ import annotations

import json
import os

import pytest

from gearbus.artifact import pack
from gearbus.client import Client
from gearbus.cluster import LocalCluster
from shared.messages import AppState
from tests.support.cluster import wait_for_workers
from tests.support.paths import APPS

APP = os.path.join(APPS, "slow_batch.py")

pytestmark = pytest.mark.timeout(60)


async def test_a_blocked_task_loop_is_not_declared_lost(tmp_path):
    output = tmp_path / "out.jsonl"
    # heartbeats every 0.25 s: an executor silent for 1.25 s would be declared lost
    with LocalCluster(workers=1, slots=4, log_dir=str(tmp_path / "logs"), heartbeat_interval=0.25) as cluster:
        async with Client(cluster.url, timeout=30) as client:
            await wait_for_workers(client, 1)
            app_id = await client.submit(pack(APP), ["--output", str(output), "--block-s", "3"])
            final = await client.wait(app_id, timeout=40)
    assert final.state == AppState.SUCCEEDED, final.error
    assert final.restarts == 0 and final.checkpoints.epoch == 0
    with open(output, encoding="utf-8") as f:
        assert sorted(json.loads(line) for line in f) == list(range(1000))
