"""Exactly-once under failure, with real processes killed while a pipeline runs.

A pipeline reads 200,000 JSON events from a 4-subject JetStream stream, while the test
publishes them, into three stateful branches (keyed tumbling-window counts to
JetStream, a low-level task numbering each user's events to a JSON Lines file, a
map-side-combined count per user to another file). In turn: SIGKILL an executor,
SIGKILL a worker, SIGKILL the AppMaster, SIGKILL the leading master, SIGSTOP an
executor with its worker until the executor is declared lost, then SIGCONT both (the
zombie must be refused), and restart the nats-server (its file store kept) under the
running app. Every output must equal a computation written here: nothing lost, nothing
twice.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal

import nats
import pytest
import structlog

from gearbus.api.task import now_ms
from gearbus.artifact import pack
from gearbus.client import Client
from gearbus.cluster import LocalCluster
from gearbus.connectors.jetstream import Publisher, ensure_stream_async
from gearbus.natsserver import NatsServer
from shared import subjects
from shared.messages import AppState
from tests.support.cluster import next_election, wait_exited, wait_for_workers, wait_state, wait_until
from tests.support.paths import APPS

log = structlog.get_logger()
APP = os.path.join(APPS, "exactly_once.py")
EVENTS = 200_000
USERS = 50
BASE_TS = 1_700_000_000_000
PUBLISH_RATE = 8_000  # events/s
TAIL = 1_000  # the last events, published once every failure was inflicted: the app runs until then

pytestmark = pytest.mark.timeout(240)


def event(n: int) -> tuple[str, dict]:
    """Event n and its subject: each user always on the same one of four subjects."""
    k = (n * 7919) % USERS
    return f"ev.{k % 4}", {"id": n, "user": f"u{k}", "ts": BASE_TS + n * 5}


def expected_outputs():
    windows, ranks, totals = collections.Counter(), [], collections.Counter()
    seen = collections.Counter()
    for n in range(EVENTS):
        _, e = event(n)
        windows[(e["user"], (e["ts"] // 1000) * 1000)] += 1
        seen[e["user"]] += 1
        ranks.append((n, e["user"], seen[e["user"]]))
        totals[e["user"]] += 1
    return ({json.dumps({"user": u, "start": s, "count": c}, sort_keys=True) for (u, s), c in windows.items()},
            sorted(ranks), dict(totals))


class Gate:
    """Pauses the publisher while the nats-server restarts: ``pause()`` returns once every
    event published so far is acknowledged (so none is republished after later ones, which
    would put the stream out of event-time order), ``resume()`` lets it go on."""

    def __init__(self):
        self.open, self.paused = asyncio.Event(), asyncio.Event()
        self.open.set()
        self.finished = False

    async def pause(self) -> None:
        self.open.clear()
        await asyncio.wait_for(self.paused.wait(), 30)

    def resume(self) -> None:
        if not self.finished:
            self.paused.clear()
        self.open.set()

    def finish(self) -> None:
        """Every event is published and acknowledged: a pause holds at once."""
        self.finished = True
        self.paused.set()


async def publish_events(url: str, first: int, end: int, gate: Gate | None = None) -> None:
    """Publish events first..end-1 in order at PUBLISH_RATE, acknowledged; while ``gate``
    is paused, wait (the nats-server is being restarted)."""
    nc = await nats.connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    try:
        publisher = await Publisher(nc).open()
        loop = asyncio.get_running_loop()
        started, step = loop.time() - first / PUBLISH_RATE, PUBLISH_RATE // 20
        for n in range(first, end):
            subject, e = event(n)
            await publisher.publish(subject, json.dumps(e).encode(), f"ev-{n}")  # a republish is deduplicated
            if n % step == step - 1:
                if gate is not None and not gate.open.is_set():
                    await publisher.drain()
                    gate.paused.set()
                    await gate.open.wait()
                    started = loop.time() - (n + 1) / PUBLISH_RATE
                ahead = started + (n + 1) / PUBLISH_RATE - loop.time()
                if ahead > 0:
                    await asyncio.sleep(ahead)
        await publisher.drain()
        if gate is not None:
            gate.finish()
    finally:
        await nc.close()


async def read_stream(url: str, stream: str, subject: str) -> list[dict]:
    """Every message of a stream's subject, through an ordered consumer."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        expected = (await js.stream_info(stream)).state.messages
        values: list[dict] = []
        done = asyncio.Event()

        async def collect(msg):
            values.append(json.loads(msg.data))
            if len(values) >= expected:
                done.set()

        sub = await js.subscribe(subject, ordered_consumer=True, cb=collect)
        if expected:
            await asyncio.wait_for(done.wait(), 60)
        await sub.unsubscribe()
        return values
    finally:
        await nc.close()


def read_jsonl(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


class Run:
    """The app, its cluster and the client, with waits on its progress."""

    def __init__(self, cluster: LocalCluster, client: Client, app_id: int, server: NatsServer,
                 publishing: Gate):
        self.cluster, self.client, self.app_id = cluster, client, app_id
        self.server, self.publishing = server, publishing
        self.windows: list[dict] = []  # the window results published, once the app ended

    async def status(self):
        return await self.client.status(self.app_id)

    async def progressed(self, since_ms: int, epoch_at_least: int, timeout: float = 60):
        """Until a checkpoint triggered after ``since_ms`` (wall clock: the failure) completed,
        the app in an epoch of at least ``epoch_at_least``: it recovered and goes on. (The
        latest checkpoint's id alone could be one that completed just before the failure.)"""

        async def probe():
            status = await self.status()
            assert status.state == AppState.ACTIVE, f"the app ended {status.state}: {status.error}"
            cp = status.checkpoints
            after = cp is not None and any(c.status == "completed" and c.trigger_ms > since_ms for c in cp.history)
            return status if after and cp.epoch >= epoch_at_least else None

        return await wait_until(self.client, subjects.appmaster_heartbeat("*"), probe, timeout)

    def processes(self, kind: str) -> list[tuple[int, str, str]]:
        return [p for p in self.cluster.processes() if p[2] == kind]


async def kill_executor(run: Run, status):
    victim, _, _ = run.processes("executor")[0]
    failed_at = now_ms()
    os.kill(victim, signal.SIGKILL)
    return await run.progressed(failed_at, status.checkpoints.epoch + 1)


async def kill_worker(run: Run, status):
    """A worker that does not host the AppMaster, with the executors it runs."""
    [(_, appmaster_worker, _)] = run.processes("appmaster")
    worker = next(w for _, w, _ in run.processes("executor") if w != appmaster_worker)
    failed_at = now_ms()
    run.cluster.workers[worker].send_signal(signal.SIGKILL)
    await wait_exited(run.cluster.workers[worker].pid, 10)
    return await run.progressed(failed_at, status.checkpoints.epoch + 1)


async def kill_appmaster(run: Run, status):
    [(appmaster, _, _)] = run.processes("appmaster")
    failed_at = now_ms()
    os.kill(appmaster, signal.SIGKILL)
    return await run.progressed(failed_at, status.checkpoints.epoch + 1)


async def kill_master(run: Run, status):
    """The leading master: the app runs on without it (no rollback needed)."""
    leader = (await run.client.info()).leader
    elected = await next_election(run.client, exclude=leader)
    failed_at = now_ms()
    run.cluster.masters[leader].send_signal(signal.SIGKILL)
    await asyncio.wait_for(elected, 30)
    return await run.progressed(failed_at, status.checkpoints.epoch)


async def stop_executor(run: Run, status):
    """A zombie: an executor (and its worker, so it cannot be killed) stopped until the
    executor is declared lost, then let go once its replacement runs; it must stop
    (its heartbeat is answered "fenced") and nothing it sends may count."""
    [(_, appmaster_worker, _)] = run.processes("appmaster")
    zombie, zombie_worker, _ = next(p for p in run.processes("executor") if p[1] != appmaster_worker)
    worker_pid = run.cluster.workers[zombie_worker].pid
    failed_at = now_ms()
    os.kill(worker_pid, signal.SIGSTOP)
    os.kill(zombie, signal.SIGSTOP)
    try:
        status = await run.progressed(failed_at, status.checkpoints.epoch + 1)
    finally:
        os.kill(zombie, signal.SIGCONT)
        os.kill(worker_pid, signal.SIGCONT)
    await wait_exited(zombie, 20)
    return status


async def restart_nats(run: Run, status):
    """The nats-server stops and starts again on its port with its file store (the
    publisher waits meanwhile): frames, credit and control messages in flight are lost."""
    await run.publishing.pause()
    loop = asyncio.get_running_loop()
    failed_at = now_ms()
    try:
        await loop.run_in_executor(None, run.server.stop)
        await loop.run_in_executor(None, run.server.start)
    finally:
        run.publishing.resume()
    return await run.progressed(failed_at, status.checkpoints.epoch)


FAILURES = {"executor": kill_executor, "worker": kill_worker, "appmaster": kill_appmaster, "master": kill_master,
            "zombie": stop_executor, "nats": restart_nats}


@contextlib.asynccontextmanager
async def chaos_run(tmp_path, config: dict, ranks: str = "task"):
    """The chaos pipeline running on a cluster of 2 masters and 3 workers while its events
    are published (the last TAIL once the caller is done, so the app outlasts the failures
    however long they take); yields its Run."""
    store = tmp_path / "jetstream"
    os.makedirs(store)
    with NatsServer(store_dir=str(store), log_path=str(tmp_path / "nats.log")) as server, \
            LocalCluster(workers=3, slots=4, masters=2, log_dir=str(tmp_path / "logs"), nats=server,
                         heartbeat_interval=0.25) as cluster:
        url = server.url
        async with Client(url, timeout=30) as client:
            await ensure_stream_async(client.bus.nc, "EV", ["ev.*"], 120, "file")
            await ensure_stream_async(client.bus.nc, "OUT", ["out.windows"], 600, "file")
            await wait_for_workers(client, 3)
            await publish_events(url, 0, 1000)  # every subject exists before the app starts
            gate = Gate()
            publishing = asyncio.create_task(publish_events(url, 1000, EVENTS - TAIL, gate))
            app_id = await client.submit(
                pack(APP), ["--stream", "EV", "--until", str(EVENTS), "--windows-subject", "out.windows",
                            "--running", str(tmp_path / "out" / "running.jsonl"),
                            "--totals", str(tmp_path / "out" / "totals.jsonl"), "--ranks", ranks],
                config={"checkpoint_interval_ms": 300, **config})
            await wait_state(client, app_id, AppState.ACTIVE)
            run = Run(cluster, client, app_id, server, gate)
            try:
                yield run
            except BaseException:
                publishing.cancel()
                raise
            await publishing
            await publish_events(url, EVENTS - TAIL, EVENTS)
            final = await client.wait(app_id, timeout=120)
            assert final.state == AppState.SUCCEEDED, final.error
            assert sum(t.late_records for t in final.tasks) == 0, "the expected outputs assume no late events"
            run.windows = await read_stream(url, "OUT", "out.windows")
            assert (await client.bus.js.stream_info("EV")).state.messages == EVENTS


def assert_exact(windows: list[dict], out_dir) -> None:
    """Every output equals the computation written here: nothing lost, nothing twice."""
    expected_windows, expected_ranks, expected_totals = expected_outputs()
    got_windows = [json.dumps(w, sort_keys=True) for w in windows]
    assert len(got_windows) == len(set(got_windows)), "a window result was published twice"
    assert set(got_windows) == expected_windows
    ranks = sorted((r["id"], r["user"], r["rank"]) for r in read_jsonl(out_dir / "running.jsonl"))
    assert len(ranks) == EVENTS and ranks == expected_ranks
    totals = read_jsonl(out_dir / "totals.jsonl")
    got_totals = {r["user"]: r["count"] for r in totals}
    assert len(totals) == USERS and got_totals == expected_totals


async def test_every_failure_in_turn_leaves_every_output_exact(tmp_path):
    async with chaos_run(tmp_path, {"max_restarts": 20}) as run:
        status = await run.progressed(0, 0)
        assert status.guarantee == "exactly-once", status.guarantee_detail
        for failure, inflict in FAILURES.items():
            status = await inflict(run, status)
            log.info("survived", failure=failure, epoch=status.checkpoints.epoch)
    assert_exact(run.windows, tmp_path / "out")


async def test_a_power_cut_resumes_the_app_by_itself_exactly(tmp_path):
    """Every gearbus process and the nats-server SIGKILLed at once while the app runs, then
    all started again on the same store: the new leader finds the app, its AppMaster is gone
    (its worker came back without it), so a new one resumes from the last completed
    checkpoint, and every output is exact. The ranks are kept by stateful_map in the rocksdb
    state backend (the other test keeps them in a custom task's memory)."""
    async with chaos_run(tmp_path, {"state_backend": "rocksdb"}, ranks="keyed") as run:
        await run.progressed(0, 0)
        status = await run.progressed(now_ms(), 0)  # well under way
        await run.publishing.pause()
        failed_at = now_ms()
        run.server.process.kill()
        run.cluster.power_cut()
        loop = asyncio.get_running_loop()
        restarted = loop.time()
        await loop.run_in_executor(None, run.server.start)
        run.cluster.restart()
        await run.progressed(failed_at, status.checkpoints.epoch + 1, timeout=90)
        print(f"power cut: committed output again {loop.time() - restarted:.2f} s after the restart")
        run.publishing.resume()
    assert_exact(run.windows, tmp_path / "out")
