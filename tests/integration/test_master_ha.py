"""Master high availability: leader lease on JetStream KV, fail-over under a running app,
fencing of a deposed leader, and the start-up refusals. Real processes, SIGKILL/SIGSTOP."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import msgpack
import pytest
import structlog

from gearbus.artifact import pack
from gearbus.client import Client
from gearbus.cluster import LocalCluster
from gearbus.natsserver import NatsServer
from shared import subjects
from shared.bus import RequestError
from shared.messages import AppState, ClusterInfo, QueryCluster, decode
from tests.support.cluster import next_election, wait_for_workers, wait_state, wait_until
from tests.support.paths import APPS, TICKER
from tests.support.ticker import read_ticks, wait_for_ticks

log = structlog.get_logger()


async def leader_of(client: Client) -> str:
    return (await client.info()).leader


async def test_a_standby_takes_over_while_the_app_keeps_running(tmp_path):
    output = tmp_path / "ticks.jsonl"
    with LocalCluster(workers=2, masters=2, log_dir=str(tmp_path / "logs")) as cluster:
        async with Client(cluster.url, timeout=30) as client:
            await wait_for_workers(client, 2)
            app_id = await client.submit(pack(TICKER), ["--output", str(output), "--rate", "200"])
            await wait_state(client, app_id, AppState.ACTIVE)
            for round_ in range(3):  # kill the leader repeatedly; each time the survivor leads
                leader = await leader_of(client)
                elected = await next_election(client, exclude=leader)
                before = max(read_ticks(output) or [0])
                killed_at = time.monotonic()
                cluster.masters[leader].send_signal(signal.SIGKILL)
                event = await asyncio.wait_for(elected, 15)
                log.info("failover_measured", round=round_, seconds=round(time.monotonic() - killed_at, 3),
                         new_leader=event.master_id)
                status = await client.status(app_id)
                assert status.state == AppState.ACTIVE
                assert (await client.info()).leader == event.master_id
                ticks = await wait_for_ticks(client, output, beyond=before + 200)
                assert sorted(ticks) == list(range(len(ticks))), "the output has a gap or a duplicate"
                cluster.masters[leader].wait()
                cluster.start_master(leader)  # a fresh standby for the next round
            await client.kill(app_id)


async def test_gearbus_info_shows_every_master_and_the_leader(tmp_path):
    with LocalCluster(workers=1, masters=3, log_dir=str(tmp_path / "logs")) as cluster:
        async with Client(cluster.url, timeout=30) as client:
            await wait_for_workers(client, 1)

            async def all_registered():
                info = await client.info()
                return info if len(info.masters) == 3 else None

            info = await wait_until(client, subjects.WORKER_HEARTBEAT, all_registered)
            assert info.masters == ["master-0", "master-1", "master-2"]
            assert info.leader in info.masters


async def test_a_paused_leader_past_its_lease_neither_answers_nor_writes(tmp_path):
    with LocalCluster(workers=1, masters=2, log_dir=str(tmp_path / "logs")) as cluster:
        async with Client(cluster.url, timeout=30) as client:
            await wait_for_workers(client, 1)
            app_id = await client.submit(pack(os.path.join(APPS, "endless.py")))
            await wait_state(client, app_id, AppState.ACTIVE)
            old = await leader_of(client)
            elected = await next_election(client, exclude=old)
            cluster.masters[old].send_signal(signal.SIGSTOP)
            new = (await asyncio.wait_for(elected, 15)).master_id
            js = client.bus.js
            kv = await js.key_value(subjects.STATE_BUCKET)
            revision = (await kv.get(subjects.app_state_key(app_id))).revision
            cluster.masters[old].send_signal(signal.SIGCONT)

            async def stepped_down():
                with open(os.path.join(cluster.log_dir, f"{old}.log"), encoding="utf-8") as f:
                    return any('"leader_stepped_down"' in line for line in f)

            await wait_until(client, subjects.WORKER_HEARTBEAT, stepped_down, timeout=15)
            replies = await all_replies(client.bus.nc, subjects.MASTER_INFO, QueryCluster().encode())
            assert [decode(r, (ClusterInfo,)).leader for r in replies] == [new]
            await client.kill(app_id)  # the new leader writes; the old one never did
            entry = await kv.get(subjects.app_state_key(app_id))
            assert entry.revision > revision
            assert msgpack.unpackb(entry.value)["state"] == AppState.TERMINATED
            assert cluster.masters[old].poll() is None  # it stays up, as a standby


async def all_replies(nc, subject: str, payload: bytes, window: float = 0.5) -> list[bytes]:
    """Every reply to one request within ``window`` seconds (nats request() keeps only one)."""
    inbox = nc.new_inbox()
    replies: list[bytes] = []

    async def collect(msg):
        replies.append(msg.data)

    sub = await nc.subscribe(inbox, cb=collect)
    await nc.publish(subject, payload, reply=inbox)
    await asyncio.sleep(window)  # counting replies needs a window: a second reply must have time to arrive
    await sub.unsubscribe()
    return replies


def run_master(url: str, master_id: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "services.master", "--nats", url, "--master-id", master_id],
                          capture_output=True, text=True, timeout=timeout)


async def test_a_second_master_with_the_same_id_refuses_to_start(tmp_path, nats_server):
    first = subprocess.Popen([sys.executable, "-m", "services.master", "--nats", nats_server.url,
                              "--master-id", "twin"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async with Client(nats_server.url, timeout=30) as client:
            await client.info()  # the first one serves
        second = await asyncio.get_running_loop().run_in_executor(None, run_master, nats_server.url, "twin")
        assert second.returncode != 0
        assert "master id 'twin' is already in use" in second.stderr
    finally:
        first.terminate()
        first.wait(10)


async def test_a_master_without_jetstream_says_so(tmp_path):
    with NatsServer(jetstream=False, store_dir=str(tmp_path)) as plain:
        done = await asyncio.get_running_loop().run_in_executor(None, run_master, plain.url, "m")
    assert done.returncode != 0
    assert "has no JetStream enabled" in done.stderr


async def test_requests_with_no_master_end_with_a_clear_deadline_error(nats_server):
    async with Client(nats_server.url, timeout=1) as client:
        with pytest.raises(RequestError, match="no master answered within 1 s"):
            await client.status(1)
