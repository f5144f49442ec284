"""Recovery from process failures on a running app (real processes, SIGKILL): a lost
executor or worker is replaced and its tasks restarted (at-most-once); repeated failures
blacklist a worker; an exhausted restart budget fails the app."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import structlog

from gearbus.artifact import pack
from gearbus.client import Client
from gearbus.runtime.frames import encode_frame
from shared import subjects
from shared.messages import AppState, ExecutorStopped, TaskFailed, decode
from tests.support.cli import gearbus
from tests.support.cluster import wait_exited, wait_for_workers, wait_state, wait_until
from tests.support.paths import TICKER
from tests.support.ticker import read_ticks

log = structlog.get_logger()


async def flowing_beyond(client, path, beyond: int, timeout: float = 30) -> list[int]:
    async def probe():
        seen = read_ticks(path)
        return seen if seen and max(seen) > beyond else None

    return await wait_until(client, subjects.appmaster_heartbeat("*"), probe, timeout)


async def restarts_reach(client, app_id: int, count: int, timeout: float = 30):
    async def probe():
        status = await client.status(app_id)
        return status if status.restarts >= count else None

    return await wait_until(client, subjects.appmaster_heartbeat("*"), probe, timeout)


async def start_ticker(client, output, **config) -> int:
    app_id = await client.submit(pack(TICKER), ["--output", str(output), "--rate", "200"], config=config)
    await wait_state(client, app_id, AppState.ACTIVE)
    await flowing_beyond(client, output, 50)
    return app_id


def assert_at_most_once(seen: list[int]) -> None:
    assert len(seen) == len(set(seen)), "a number was written twice"


async def test_a_killed_executor_is_replaced_and_the_app_goes_on(cluster, client, tmp_path):
    output = tmp_path / "ticks.jsonl"
    app_id = await start_ticker(client, output)
    victim = next(pid for pid, _, kind in cluster.processes() if kind == "executor")
    before = max(read_ticks(output))
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    status = await restarts_reach(client, app_id, 1)
    seen = await flowing_beyond(client, output, before + 200)
    log.info("executor_recovery_measured", seconds=round(time.monotonic() - killed_at, 3))
    assert status.state == AppState.ACTIVE and status.restarts == 1
    assert_at_most_once(seen)
    # how it came about, as the AppMaster's state machine took it
    code, out, err = await gearbus("status", "--nats", cluster.url, "--debug", str(app_id))
    assert code == 0, err
    assert "AppMaster: running, epoch 1" in out
    lost = next(line for line in out.splitlines() if "executor_stopped(" in line)
    assert "-> " in lost and "Fence" in lost and "StoreEpoch" in lost and "RequestSlot" in lost
    assert "deployed(epoch=1)" in out.split(lost)[1]  # the rollback's deployment came after
    code, out, _ = await gearbus("status", "--nats", cluster.url, "--debug", "--json", str(app_id))
    debug = json.loads(out)["debug"]
    assert debug["epoch"] == 1 and [s["stimulus_id"] for s in debug["stimuli"]] == sorted(
        s["stimulus_id"] for s in debug["stimuli"])
    await client.kill(app_id)


async def test_a_worker_whose_executors_keep_failing_is_blacklisted(cluster_factory, tmp_path):
    """Worker "big" has the most free slots, so replacements land there until it has
    failed blacklist_after (2) times in a row; then the app moves to "small"."""
    cluster = cluster_factory(workers=0, slots=4)
    cluster.start_worker("big", slots=4)
    cluster.start_worker("small", slots=1)
    output = tmp_path / "ticks.jsonl"
    async with Client(cluster.url, timeout=30) as client:
        await wait_for_workers(client, 2)
        app_id = await start_ticker(client, output, executors=1, blacklist_after=2)
        for kill in range(2):
            [(victim, worker_id, _)] = [p for p in cluster.processes() if p[2] == "executor"]
            assert worker_id == "big"
            before = max(read_ticks(output))  # read now: the restore may truncate the file
            os.kill(victim, signal.SIGKILL)
            status = await restarts_reach(client, app_id, kill + 1)
            await flowing_beyond(client, output, before + 50)
        assert status.blacklisted_workers == ["big"]
        [(_, worker_id, _)] = [p for p in cluster.processes() if p[2] == "executor"]
        assert worker_id == "small"
        await client.kill(app_id)


async def test_a_worker_is_blacklisted_at_once_with_blacklist_after_1(cluster, client, tmp_path):
    output = tmp_path / "ticks.jsonl"
    app_id = await start_ticker(client, output, executors=1, blacklist_after=1)
    [(victim, worker_id, _)] = [p for p in cluster.processes() if p[2] == "executor"]
    before = max(read_ticks(output))  # read now: the restore may truncate the file to the last checkpoint
    os.kill(victim, signal.SIGKILL)
    status = await restarts_reach(client, app_id, 1)
    assert status.blacklisted_workers == [worker_id]
    await flowing_beyond(client, output, before + 100)
    [(_, new_worker, _)] = [p for p in cluster.processes() if p[2] == "executor"]
    assert new_worker != worker_id
    await client.kill(app_id)


async def test_a_lost_worker_has_its_executors_relaunched_elsewhere(cluster, client, tmp_path):
    output = tmp_path / "ticks.jsonl"
    app_id = await start_ticker(client, output)
    processes = cluster.processes()
    appmaster_worker = next(w for _, w, kind in processes if kind == "appmaster")
    victim = next((w for _, w, kind in processes if kind == "executor" and w != appmaster_worker), None)
    assert victim is not None, f"expected an executor away from the AppMaster's worker: {processes}"
    orphans = asyncio.Queue()

    async def on_stopped(msg):
        orphans.put_nowait(decode(msg.data))

    sub = await client.bus.nc.subscribe(subjects.appmaster_executor_stopped(app_id), cb=on_stopped)
    before = max(read_ticks(output))
    cluster.workers[victim].send_signal(signal.SIGKILL)
    # Its executors report their own end at once (nobody else is left to), rather than
    # leaving the AppMaster to wait for five missed heartbeats.
    report = await asyncio.wait_for(orphans.get(), 5)
    await sub.unsubscribe()
    assert isinstance(report, ExecutorStopped) and report.worker_gone and report.worker_id == victim
    await wait_exited(cluster.workers[victim].pid, 10)
    status = await restarts_reach(client, app_id, 1)
    seen = await flowing_beyond(client, output, before + 200)
    assert status.state == AppState.ACTIVE
    assert_at_most_once(seen)
    assert all(w != victim for _, w, _ in cluster.processes())
    await client.kill(app_id)


async def test_an_exhausted_restart_budget_fails_the_app_with_the_last_error(cluster, client, tmp_path):
    output = tmp_path / "ticks.jsonl"
    app_id = await start_ticker(client, output, executors=1, max_restarts=1)
    for kill in range(2):
        [(victim, _, _)] = [p for p in cluster.processes() if p[2] == "executor"]
        before = max(read_ticks(output))  # read now: the restore may truncate the file
        os.kill(victim, signal.SIGKILL)
        await wait_exited(victim, 10)
        if kill == 0:  # the first loss is survived: wait for the replacement to run
            await restarts_reach(client, app_id, 1)
            await flowing_beyond(client, output, before + 50)
    final = await client.wait(app_id, timeout=30)
    assert final.state == AppState.FAILED
    assert final.error.error_type == "RestartBudgetExhausted"
    assert "gave up after 1 restarts" in final.error.message and "exited with code -9" in final.error.message


async def test_a_killed_appmaster_is_relaunched_and_adopts_the_running_executors(cluster, client, tmp_path):
    output = tmp_path / "ticks.jsonl"
    app_id = await start_ticker(client, output)
    [(appmaster, old_worker, _)] = [p for p in cluster.processes() if p[2] == "appmaster"]
    executors_before = sorted(pid for pid, _, kind in cluster.processes() if kind == "executor")
    before = max(read_ticks(output))
    killed_at = time.monotonic()
    os.kill(appmaster, signal.SIGKILL)

    async def relaunched():
        running = [p for p in cluster.processes() if p[2] == "appmaster" and p[0] != appmaster]
        return running if running and (await client.status(app_id)).executors else None

    await wait_until(client, subjects.appmaster_heartbeat("*"), relaunched)
    log.info("appmaster_relaunch_measured", seconds=round(time.monotonic() - killed_at, 3))
    seen = await flowing_beyond(client, output, before + 200)
    status = await client.status(app_id)
    assert status.state == AppState.ACTIVE and status.restarts == 0
    assert sorted(pid for pid, _, kind in cluster.processes() if kind == "executor") == executors_before
    assert sorted(seen) == list(range(len(seen))), "the executors kept running: no gap, no duplicate"
    await client.kill(app_id)
    final = await client.wait(app_id, timeout=10)
    assert final.state == AppState.TERMINATED


async def test_a_task_failure_is_reported_until_a_recovery_replaces_the_attempt(cluster, client, tmp_path):
    """A task's failure report is one core NATS message: one sent while the AppMaster
    reconnects (its server died) is lost, and nobody would restart the task. So the executor
    repeats it until the next attempt is launched, and the AppMaster recovers once however
    many copies it gets. The AppMaster is stopped (SIGSTOP) so it hears nothing until resumed."""
    output = tmp_path / "ticks.jsonl"
    app_id = await start_ticker(client, output)
    status = await client.status(app_id)
    epoch, restarts = status.checkpoints.epoch, status.restarts
    [(appmaster, _, _)] = [p for p in cluster.processes() if p[2] == "appmaster"]
    reports: list[TaskFailed] = []

    async def on_report(msg):
        reports.append(decode(msg.data, (TaskFailed,)))

    sub = await client.bus.nc.subscribe(subjects.appmaster_task_failed(app_id), cb=on_report)
    os.kill(appmaster, signal.SIGSTOP)
    try:
        ahead = encode_frame(0, 0, epoch, 10**6, 0, False, 0, [])  # the frames before it "were lost"
        await client.bus.nc.publish(subjects.task_inbox(app_id, 1, 1), ahead)
        deadline = time.monotonic() + 6  # well within the master's patience with a silent AppMaster
        while len(reports) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    finally:
        os.kill(appmaster, signal.SIGCONT)
        await sub.unsubscribe()
    assert len(reports) >= 3, f"the failure was reported {len(reports)} time(s) in 6 s"
    assert {(r.task.processor, r.task.index, r.epoch, r.recoverable) for r in reports} == {(1, 1, epoch, True)}
    before = max(read_ticks(output))
    seen = await flowing_beyond(client, output, before + 200)
    status = await client.status(app_id)
    assert status.state == AppState.ACTIVE
    assert status.restarts == restarts + 1, "one failure, one recovery, however often it was reported"
    assert_at_most_once(seen)
    await client.kill(app_id)
