"""A three-server NATS cluster: losing the server that leads the KV streams makes KV
unavailable for a while; masters step down, a leader takes over once KV is back, and
the running app is intact."""

from __future__ import annotations

import asyncio
import signal
import time

import structlog

from gearbus.artifact import pack
from gearbus.client import Client
from gearbus.cluster import LocalCluster
from gearbus.natsserver import NatsCluster
from shared import subjects
from shared.messages import AppState
from tests.support.cluster import next_election, wait_for_workers, wait_state, wait_until
from tests.support.paths import TICKER
from tests.support.ticker import read_ticks

log = structlog.get_logger()


async def test_losing_the_kv_stream_leader_server_keeps_the_app(tmp_path):
    output = tmp_path / "ticks.jsonl"
    with NatsCluster(3, base_dir=str(tmp_path / "nats")) as nats_cluster, \
            LocalCluster(workers=2, masters=2, log_dir=str(tmp_path / "logs"), nats=nats_cluster) as cluster:
        async with Client(cluster.urls, timeout=60) as client:
            await wait_for_workers(client, 2, timeout=60)
            js = client.bus.js
            for bucket in ("KV_" + subjects.MASTERS_BUCKET, "KV_" + subjects.STATE_BUCKET):
                assert (await js.stream_info(bucket)).config.num_replicas == 3
            app_id = await client.submit(pack(TICKER), ["--output", str(output), "--rate", "100"])
            await wait_state(client, app_id, AppState.ACTIVE, timeout=60)
            leader_server = (await js.stream_info("KV_" + subjects.MASTERS_BUCKET)).cluster.leader
            victim = next(s for s in nats_cluster.servers if s.name == leader_server)
            before = max(read_ticks(output) or [0])
            elected = await next_election(client, exclude="")
            killed_at = time.monotonic()
            victim.process.send_signal(signal.SIGKILL)
            await asyncio.wait_for(elected, 60)  # the lease could not be renewed: a leader is elected again
            log.info("kv_outage_measured", seconds=round(time.monotonic() - killed_at, 3), server=leader_server)
            status = await client.status(app_id)
            assert status.state == AppState.ACTIVE
            info = await client.info()
            assert info.leader in ("master-0", "master-1")

            async def flowing():
                ticks = read_ticks(output)
                return ticks if ticks and max(ticks) > before + 300 else None

            ticks = await wait_until(client, subjects.appmaster_heartbeat("*"), flowing, timeout=60)
            assert len(ticks) == len(set(ticks)), "a number was written twice"
            await client.kill(app_id)
