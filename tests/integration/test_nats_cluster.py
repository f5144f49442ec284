"""A three-server NATS cluster: losing the server that leads the KV streams makes KV
unavailable for a while; masters step down, a leader takes over once KV is back, and
the running app is intact.

Each server takes its turn: the KV streams (the masters' lease, the cluster state, the
checkpoint records) and the app's snapshot store are led from it, then it is killed
(and restarted before the next turn). So every role loses its own server once, the
AppMaster included, in the middle of checkpoints; after each fail-over the app's output
must move on from where it was once a leader is back."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import structlog

from gearbus.artifact import pack
from gearbus.client import Client
from gearbus.cluster import LocalCluster
from gearbus.natsserver import NatsCluster
from shared import subjects
from shared.bus import ride_out
from shared.messages import AppState
from tests.support.cluster import next_election, wait_for_workers, wait_state, wait_until
from tests.support.paths import TICKER
from tests.support.ticker import read_ticks

log = structlog.get_logger()

MASTERS_STREAM = "KV_" + subjects.MASTERS_BUCKET


async def lead_from(client: Client, streams: list[str], server: str) -> None:
    """Move the leadership of ``streams`` to ``server`` (a stepdown with a preferred peer)."""
    js = client.bus.js
    for stream in streams:
        async def leader() -> str:
            return (await js.stream_info(stream)).cluster.leader

        async with asyncio.timeout(30):
            while await ride_out(leader, f"the leader of {stream}") != server:
                await ride_out(lambda: client.bus.nc.request(
                    f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}",
                    json.dumps({"placement": {"preferred": server}}).encode(), timeout=5), f"moving {stream}")
                await asyncio.sleep(0.2)


async def caught_up(client: Client, streams: list[str]) -> None:
    """Wait until every replica of ``streams`` is current (a restarted server caught up)."""
    js = client.bus.js

    async def current(stream: str) -> bool:
        replicas = (await js.stream_info(stream)).cluster.replicas or []
        return len(replicas) == 2 and all(peer.current for peer in replicas)

    async with asyncio.timeout(30):
        for stream in streams:
            while not await ride_out(lambda: current(stream), f"the replicas of {stream}"):
                await asyncio.sleep(0.2)


async def test_losing_the_kv_stream_leader_server_keeps_the_app(tmp_path):
    output = tmp_path / "ticks.jsonl"
    with NatsCluster(3, base_dir=str(tmp_path / "nats")) as nats_cluster, \
            LocalCluster(workers=2, masters=2, log_dir=str(tmp_path / "logs"), nats=nats_cluster) as cluster:
        async with Client(cluster.urls, timeout=60) as client:
            await wait_for_workers(client, 2, timeout=60)
            js = client.bus.js
            for bucket in (MASTERS_STREAM, "KV_" + subjects.STATE_BUCKET):
                assert (await js.stream_info(bucket)).config.num_replicas == 3
            app_id = await client.submit(pack(TICKER), ["--output", str(output), "--rate", "100"])
            await wait_state(client, app_id, AppState.ACTIVE, timeout=60)
            streams = [MASTERS_STREAM, "KV_" + subjects.STATE_BUCKET, "KV_" + subjects.CHECKPOINT_BUCKET,
                       "OBJ_" + subjects.snapshot_bucket(app_id)]
            for victim in nats_cluster.servers:
                await lead_from(client, streams, victim.name)
                elected = await next_election(client, exclude="")
                killed_at = time.monotonic()
                victim.process.send_signal(signal.SIGKILL)
                await asyncio.wait_for(elected, 60)  # the lease could not be renewed: a leader is elected again
                log.info("kv_outage_measured", seconds=round(time.monotonic() - killed_at, 3), server=victim.name)
                status = await client.status(app_id)
                assert status.state == AppState.ACTIVE
                info = await client.info()
                assert info.leader in ("master-0", "master-1")
                before = max(read_ticks(output) or [0])

                async def flowing():
                    ticks = read_ticks(output)
                    return ticks if ticks and max(ticks) > before + 300 else None

                ticks = await wait_until(client, subjects.appmaster_heartbeat("*"), flowing, timeout=60)
                log.info("kv_output_resumed", seconds=round(time.monotonic() - killed_at, 3), server=victim.name)
                assert len(ticks) == len(set(ticks)), "a number was written twice"
                victim.process.wait()
                victim.start()
                await caught_up(client, streams)
            await client.kill(app_id)
