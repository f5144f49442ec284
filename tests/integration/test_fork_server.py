"""The worker's fork server (services/worker/forkserver.py, services/worker/launcher.py) on
real processes: a forked role starts as a fresh interpreter would, its exit reaches the
worker, a dead fork server costs no launch, and a worker's death still reaches every child."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest
import pytest_asyncio

from gearbus.artifact import pack
from gearbus.client import Client
from gearbus.cluster import children_of, launched_by, role_of
from services.worker.launcher import INTERPRETER_ENV, ForkedProcess, Launcher
from shared import subjects
from shared.messages import AppState, ExecutorStopped, decode
from tests.support.cluster import wait_exited, wait_for_workers, wait_state
from tests.support.paths import APPS, REPO

pytestmark = pytest.mark.timeout(90)

ROLE = "tests.support.launched_role"
#: The stand-in role is found on the repository's path (roles run with -P: the working directory is not on it)
IMPORTABLE = os.pathsep.join(filter(None, (REPO, os.environ.get("PYTHONPATH"))))
#: as a worker makes it
ENV = {**os.environ, "GEARBUS_LAUNCH": "from-the-launch", "PYTHONPATH": IMPORTABLE, **INTERPRETER_ENV}


@pytest_asyncio.fixture
async def launchers(monkeypatch):
    """Make launchers as a worker has one; their background work and fork servers end with the test."""
    monkeypatch.setenv("PYTHONPATH", IMPORTABLE)  # the fork server's, which its children import with
    made: list[Launcher] = []
    tasks: set[asyncio.Task] = set()

    def spawn(coro, name):
        task = asyncio.create_task(coro, name=name)
        tasks.add(task)
        return task

    async def make(fork_server: bool = True) -> Launcher:
        launcher = Launcher(spawn, fork_server)
        await launcher.start()
        made.append(launcher)
        return launcher

    yield make
    for launcher in made:
        await launcher.close()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def run_role(launcher: Launcher, log_path, code: str = "0"):
    """Launch the stand-in role, wait for its end, and read what it was started with."""
    process = await launcher.launch(ROLE, [code], ENV, str(log_path), signal.SIGKILL)
    assert await asyncio.wait_for(process.wait(), 30) == int(code)
    return process, json.loads(log_path.read_text().splitlines()[-1])


async def test_a_forked_role_starts_as_a_fresh_interpreter_would(launchers, tmp_path):
    forking, plain = await launchers(), await launchers(fork_server=False)
    forked, seen_forked = await run_role(forking, tmp_path / "forked.log", "3")
    fresh, seen_fresh = await run_role(plain, tmp_path / "fresh.log", "3")
    assert isinstance(forked, ForkedProcess) and isinstance(fresh, asyncio.subprocess.Process)
    assert seen_forked["ppid"] == forking.server.process.pid != os.getpid() == seen_fresh["ppid"]
    assert seen_forked["name"] == "gb-launched_rol"
    for seen in (seen_forked, seen_fresh):  # nothing else differs: the environment replaced whole
        del seen["ppid"], seen["name"]
    assert seen_forked == seen_fresh
    assert seen_forked["env"] == ENV and seen_forked["argv"] == ["3"] and seen_forked["stdin"] == ""


async def test_a_forked_role_ends_by_the_signal_the_worker_sends(launchers, tmp_path):
    launcher = await launchers()
    for stop, code in ((ForkedProcess.terminate, -signal.SIGTERM), (ForkedProcess.kill, -signal.SIGKILL)):
        process = await launcher.launch(ROLE, ["sleep"], ENV, str(tmp_path / "sleep.log"), signal.SIGKILL)
        stop(process)
        assert await asyncio.wait_for(process.wait(), 30) == code
        with pytest.raises(ProcessLookupError):  # reaped: its pid is not signalled again
            process.kill()


async def test_a_dead_fork_server_takes_its_children_and_costs_no_launch(launchers, tmp_path):
    launcher = await launchers()
    sleeper = await launcher.launch(ROLE, ["sleep"], ENV, str(tmp_path / "sleep.log"), signal.SIGKILL)
    first = launcher.server.process
    first.kill()
    assert await asyncio.wait_for(sleeper.wait(), 30) == -signal.SIGKILL
    await asyncio.wait_for(first.wait(), 30)
    fallback, seen = await run_role(launcher, tmp_path / "fallback.log", "4")
    assert isinstance(fallback, asyncio.subprocess.Process) and seen["ppid"] == os.getpid()
    assert launcher.server is not None and launcher.server.process is not first  # a new one for what follows
    forked, seen = await run_role(launcher, tmp_path / "forked.log", "5")
    assert isinstance(forked, ForkedProcess) and seen["ppid"] == launcher.server.process.pid


async def test_a_malformed_request_does_not_stop_the_fork_server(launchers, tmp_path):
    launcher = await launchers()
    await asyncio.wait_for(asyncio.shield(launcher.server.ready), 60)
    launcher.server.process.stdin.write(b'{"launch": {"id": 1}}\nnot json\n')
    forked, seen = await run_role(launcher, tmp_path / "forked.log", "0")
    assert isinstance(forked, ForkedProcess) and seen["ppid"] == launcher.server.process.pid


async def test_a_workers_processes_are_forked_and_their_exits_and_its_death_reach_them(cluster_factory, tmp_path):
    """The app's processes are the fork server's children; an executor's exit code reaches the
    worker's ExecutorStopped; a killed worker takes its fork server and all of them along."""
    cluster = cluster_factory(workers=1, slots=4)
    worker = cluster.workers["worker-0"]
    async with Client(cluster.url, timeout=30) as client:
        await wait_for_workers(client, 1)
        app_id = await client.submit(pack(os.path.join(APPS, "endless.py")))
        await wait_state(client, app_id, AppState.ACTIVE)
        [fork_server] = children_of(worker.pid)
        assert role_of(fork_server) == "forkserver"
        processes = launched_by(worker.pid)
        assert sorted(kind for _, kind in processes) == ["appmaster", "executor", "executor"]
        assert all(pid in children_of(fork_server) for pid, _ in processes)

        stopped = asyncio.Queue()

        async def on_stopped(msg):
            stopped.put_nowait(decode(msg.data))

        sub = await client.bus.nc.subscribe(subjects.EXECUTOR_STOPPED, cb=on_stopped)
        victim = next(pid for pid, kind in processes if kind == "executor")
        os.kill(victim, signal.SIGKILL)
        report = await asyncio.wait_for(stopped.get(), 15)
        await sub.unsubscribe()
        assert isinstance(report, ExecutorStopped) and report.kind == "executor"
        assert report.exit_code == -signal.SIGKILL

        survivors = [pid for pid, _ in launched_by(worker.pid)]
        worker.kill()
        for pid in [fork_server, *survivors]:
            await wait_exited(pid, timeout=15)
