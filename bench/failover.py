"""Fail-over and recovery times, each over several SIGKILL trials.

    python bench/failover.py [--trials 5] [--masters 2]

Master fail-over: an embedded cluster with several masters; the leader is killed once
per trial (a fresh standby started each time); measured from the kill until a
`master.info` request is answered by another master. Beside it: the lease TTL (the floor
of any lease-based fail-over) and Gearpump's documented "up to 15 seconds".

Executor recovery: examples/ticker.py (200 numbers/s) on one executor; the executor is
killed once per trial; measured from the kill until the sink writes a number generated
after the kill, i.e. until the restarted tasks process again. Beside it: Gearpump's
documented "about 10 seconds".

AppMaster relaunch: the same app, its AppMaster killed once per trial; measured from the
kill until a relaunched AppMaster reports the running executors as its own (its first
heartbeat naming them).

KV outage: a three-server NATS cluster; once per trial the server leading the masters'
KV stream is killed (and restarted after); measured from the kill until a master is
elected again (the lease could not be renewed while the stream had no leader).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from gearbus.artifact import pack  # noqa: E402
from gearbus.client import Client  # noqa: E402
from gearbus.cluster import LocalCluster  # noqa: E402
from gearbus.natsserver import NatsCluster  # noqa: E402
from shared import subjects  # noqa: E402
from shared.bus import RequestError  # noqa: E402
from shared.messages import AppMasterHeartbeat, QueryCluster, decode  # noqa: E402

GEARPUMP_FAILOVER_S = 15.0
GEARPUMP_RECOVERY_S = 10.0
TARGET_MEDIAN_S = 1.5
TARGET_RECOVERY_S = 3.0


async def leader_served_by_other(client: Client, killed: str, deadline_s: float = 30) -> float:
    """Ask master.info until a master other than ``killed`` answers; return when it did."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            info = await client.bus.request(subjects.MASTER_INFO, QueryCluster(), timeout=0.2)
            if info.leader != killed:
                return time.monotonic()
        except RequestError:
            await asyncio.sleep(0.005)
    raise SystemExit(f"no new leader answered within {deadline_s:g} s")


async def measure(trials: int, masters: int, workdir: str) -> list[float]:
    cluster = LocalCluster(workers=1, masters=masters, log_dir=os.path.join(workdir, "logs"))
    cluster.start()
    times = []
    try:
        async with Client(cluster.url, timeout=30) as client:
            await client.info()
            for trial in range(trials):
                leader = (await client.info()).leader
                killed_at = time.monotonic()
                cluster.masters[leader].send_signal(signal.SIGKILL)
                served_at = await leader_served_by_other(client, leader)
                times.append(served_at - killed_at)
                cluster.masters.pop(leader).wait()
                cluster.start_master(f"standby-{trial}")
                print(f"trial {trial + 1}/{trials}: {leader} killed, new leader served after "
                      f"{times[-1]:.3f} s", file=sys.stderr, flush=True)
    finally:
        cluster.stop()
    return times


def pids_of(cluster, kind: str = "executor") -> list[int]:
    return [pid for pid, _, k in cluster.processes() if k == kind]


def newest_tick_ms(path: str) -> int:
    try:
        with open(path, "rb") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return 0
    return max((json.loads(line)["ts"] for line in lines[-50:] if line.strip()), default=0)


async def measure_recovery(trials: int, workdir: str) -> list[float]:
    output = os.path.join(workdir, "ticks.jsonl")
    cluster = LocalCluster(workers=2, log_dir=os.path.join(workdir, "recovery-logs"))
    cluster.start()
    times = []
    try:
        async with Client(cluster.url, timeout=30) as client:
            app_id = await client.submit(pack(os.path.join(REPO, "examples", "ticker.py")),
                                         ["--output", output, "--rate", "200"],
                                         config={"executors": 1, "max_restarts": trials + 1,
                                                 "appmaster_restarts": trials + 1})
            for trial in range(trials):
                while not pids_of(cluster) or newest_tick_ms(output) == 0:
                    await asyncio.sleep(0.05)
                [victim] = pids_of(cluster)
                killed_ms = time.time() * 1000
                killed_at = time.monotonic()
                os.kill(victim, signal.SIGKILL)
                while newest_tick_ms(output) <= killed_ms:
                    await asyncio.sleep(0.005)
                times.append(time.monotonic() - killed_at)
                print(f"trial {trial + 1}/{trials}: executor {victim} killed, processing again after "
                      f"{times[-1]:.3f} s", file=sys.stderr, flush=True)
            appmaster_times = await measure_appmaster(client, cluster, trials)
            await client.kill(app_id)
    finally:
        cluster.stop()
    return times, appmaster_times


async def measure_appmaster(client: Client, cluster, trials: int) -> list[float]:
    times = []
    for trial in range(trials):
        while not pids_of(cluster, "appmaster"):
            await asyncio.sleep(0.05)
        [victim] = pids_of(cluster, "appmaster")
        adopted = asyncio.get_running_loop().create_future()

        async def on_heartbeat(msg):
            if decode(msg.data, (AppMasterHeartbeat,)).executors and not adopted.done():
                adopted.set_result(time.monotonic())

        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        await asyncio.sleep(0.05)  # let heartbeats already in flight from the dead one pass
        sub = await client.bus.nc.subscribe(subjects.appmaster_heartbeat("*"), cb=on_heartbeat)
        times.append(await asyncio.wait_for(adopted, 60) - killed_at)
        await sub.unsubscribe()
        print(f"trial {trial + 1}/{trials}: AppMaster {victim} killed, relaunched one in charge after "
              f"{times[-1]:.3f} s", file=sys.stderr, flush=True)
    return times


async def measure_kv_outage(trials: int, workdir: str) -> list[float]:
    nats_cluster = NatsCluster(3, base_dir=os.path.join(workdir, "nats"))
    nats_cluster.start()
    cluster = LocalCluster(workers=1, masters=2, log_dir=os.path.join(workdir, "kv-logs"), nats=nats_cluster)
    cluster.start()
    times = []
    try:
        async with Client(cluster.urls, timeout=60) as client:
            await client.info()
            js = client.bus.js
            for trial in range(trials):
                leader = (await js.stream_info("KV_" + subjects.MASTERS_BUCKET)).cluster.leader
                victim = next(s for s in nats_cluster.servers if s.name == leader)
                elected = asyncio.get_running_loop().create_future()

                async def on_elected(msg):
                    if not elected.done():
                        elected.set_result(time.monotonic())

                sub = await client.bus.nc.subscribe(subjects.MASTER_ELECTED, cb=on_elected)
                killed_at = time.monotonic()
                victim.process.send_signal(signal.SIGKILL)
                times.append(await asyncio.wait_for(elected, 60) - killed_at)
                await sub.unsubscribe()
                victim.process.wait()
                victim.start()  # back into the cluster for the next trial
                await client.info()
                print(f"trial {trial + 1}/{trials}: KV leader {leader} killed, a master led again after "
                      f"{times[-1]:.3f} s", file=sys.stderr, flush=True)
    finally:
        cluster.stop()
        nats_cluster.stop()
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--masters", type=int, default=2)
    opts = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gearbus-failover-") as workdir:
        times = asyncio.run(measure(opts.trials, opts.masters, workdir))
        recovery, relaunch = asyncio.run(measure_recovery(opts.trials, workdir))
        outage = asyncio.run(measure_kv_outage(opts.trials, workdir))
    median = statistics.median(times)
    ttl = 1.0
    print(f"master fail-over, {len(times)} trials, {opts.masters} masters, lease TTL {ttl:g} s; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(f"{'s':<22}{'median':>8}{'min':>8}{'max':>8}")
    print(f"{'gearbus fail-over':<22}{median:>8.3f}{min(times):>8.3f}{max(times):>8.3f}")
    print(f"{'lease TTL (floor)':<22}{ttl:>8.3f}")
    print(f"{'Gearpump (documented)':<22}{GEARPUMP_FAILOVER_S:>8.3f}")
    print(f"ratio median / TTL {median / ttl:.2f}; Gearpump / gearbus {GEARPUMP_FAILOVER_S / median:.1f}x")
    verdict = "meets" if median <= TARGET_MEDIAN_S else "MISSES"
    print(f"target median <= {TARGET_MEDIAN_S:g} s: {verdict}")
    r_median = statistics.median(recovery)
    print(f"\nexecutor-loss recovery, {len(recovery)} trials (ticker at 200/s on one executor)")
    print(f"{'s':<22}{'median':>8}{'min':>8}{'max':>8}")
    print(f"{'gearbus recovery':<22}{r_median:>8.3f}{min(recovery):>8.3f}{max(recovery):>8.3f}")
    print(f"{'Gearpump (documented)':<22}{GEARPUMP_RECOVERY_S:>8.3f}")
    print(f"ratio Gearpump / gearbus {GEARPUMP_RECOVERY_S / r_median:.1f}x; target median <= "
          f"{TARGET_RECOVERY_S:g} s: {'meets' if r_median <= TARGET_RECOVERY_S else 'MISSES'}")
    print(f"\nAppMaster relaunch, {len(relaunch)} trials")
    print(f"{'s':<22}{'median':>8}{'min':>8}{'max':>8}")
    print(f"{'gearbus relaunch':<22}{statistics.median(relaunch):>8.3f}{min(relaunch):>8.3f}{max(relaunch):>8.3f}")
    print(f"\nKV outage after losing the stream leader's server (3 nats-servers), {len(outage)} trials")
    print(f"{'s':<22}{'median':>8}{'min':>8}{'max':>8}")
    print(f"{'kill -> leader again':<22}{statistics.median(outage):>8.3f}{min(outage):>8.3f}{max(outage):>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
