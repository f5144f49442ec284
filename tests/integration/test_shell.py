"""`gearbus shell`, the distributed shell, as a user runs it: a real CLI process against
one cluster of two workers that every test of this file shares (tests/conftest.py keeps
the file on one xdist worker)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from gearbus.cluster import LocalCluster, children_of
from shared.bus import RemoteError
from shared.messages import AppState, AppType, ErrorCode
from tests.support.cli import GEARBUS, gearbus
from tests.support.cluster import wait_exited
from tests.support.paths import REPO

WORKERS = ["worker-0", "worker-1"]


@pytest.fixture(scope="module")
def shell_cluster(shared_cluster):
    return shared_cluster


@pytest.fixture
def client(shared_client):
    return shared_client


def shell(cluster: LocalCluster, *args: str, timeout: float = 60):
    return gearbus("shell", "--nats", cluster.url, *args, timeout=timeout)


async def test_a_command_runs_on_both_workers_each_line_labelled_then_each_exit_code(shell_cluster, client):
    code, out, err = await shell(shell_cluster, "--", "sh", "-c", 'echo "out $0"; echo warned >&2', "a b")
    assert code == 0, err
    assert sorted(out.splitlines()) == ["[worker-0] out a b", "[worker-1] out a b"]  # the argv as given
    for worker in WORKERS:
        assert f"[{worker}] warned\n" in err and f"[{worker}] exit 0\n" in err
        assert err.index(f"[{worker}] warned") < err.index(f"[{worker}] exit 0")
    app_id = int(re.match(r"app (\d+): ", err).group(1))
    status = await client.status(app_id)
    assert (status.state, status.app_type, status.error) == (AppState.SUCCEEDED, AppType.SHELL, None)
    code, out, _ = await gearbus("status", "--nats", shell_cluster.url, "--json", str(app_id))
    assert json.loads(out)["app_type"] == "shell"
    code, out, _ = await gearbus("status", "--nats", shell_cluster.url, str(app_id))
    assert "type: shell" in out

    # Output does not depend on reading while the command runs: read after the app ended.
    done = await client.submit_shell(["sh", "-c", "seq 1 500"], ["worker-1"])
    assert (await client.wait(done, timeout=30)).state == AppState.SUCCEEDED
    reply = await client.shell_output(done)
    [only] = reply.workers
    assert reply.ended and only.exit_code == 0 and [x.text for x in only.lines] == [str(i) for i in range(1, 501)]


async def test_a_command_that_does_not_exist_fails_on_each_worker_and_the_app(shell_cluster, client):
    code, out, err = await shell(shell_cluster, "--json", "--", "no-such-command-here", "x")
    assert code == 1 and "FAILED" in err and "exit code 127" in err
    records = [json.loads(line) for line in out.splitlines()]
    assert sorted((r["worker"], r["stream"], r["line"]) for r in records if "line" in r) == [
        (w, "stderr", "no-such-command-here: command not found") for w in WORKERS]
    assert sorted((r["worker"], r["exit_code"]) for r in records if "exit_code" in r) == [(w, 127) for w in WORKERS]
    [app] = [a for a in await client.list() if a.name == "shell no-such-command-here"]
    assert app.state == AppState.FAILED and app.error.error_type == "CommandFailed"


async def test_a_command_past_its_timeout_is_stopped(shell_cluster):
    code, _, err = await shell(shell_cluster, "--workers", "1", "--timeout", "1", "--", "sleep", "600")
    assert code == 1
    assert "[worker-0] exit 143 (stopped: it ran past the 1 s timeout; ended by SIGTERM)" in err, err
    assert "TimedOut" in err
    # The command's own process exits 0 at once; a child that ignores SIGTERM holds its
    # output open: the group is killed after the grace, and the app fails all the same.
    code, out, err = await shell(shell_cluster, "--workers", "1", "--timeout", "1", "--", "sh", "-c",
                                 '(trap "" TERM; exec sleep 600) & echo left a child')
    assert (code, out) == (1, "[worker-0] left a child\n"), err
    assert "[worker-0] exit 0 (stopped: it ran past the 1 s timeout)" in err and "TimedOut" in err, err


async def test_more_workers_than_the_cluster_has_are_refused_before_anything_runs(shell_cluster, client):
    before = len(await client.list())
    code, out, err = await shell(shell_cluster, "--workers", "5", "--", "touch", "/tmp/never")
    assert (code, out) == (2, "")
    assert "gearbus shell: --workers 5: the cluster has 2 live worker(s): worker-0, worker-1" in err
    code, _, err = await shell(shell_cluster, "--workers", "worker-0,worker-9", "--", "true")
    assert code == 2 and "no live worker worker-9; the cluster has 2 live worker(s): worker-0, worker-1" in err
    with pytest.raises(RemoteError) as refused:  # the master checks too: another client may not ask first
        await client.submit_shell(["true"], ["worker-0", "worker-7"])
    assert refused.value.code == ErrorCode.NOT_FOUND and "no live worker worker-7" in refused.value.message
    assert len(await client.list()) == before


async def test_kill_ends_a_long_running_shell_and_its_commands(shell_cluster, client):
    process = await asyncio.create_subprocess_exec(
        *GEARBUS, "shell", "--nats", shell_cluster.url, "--", "sh", "-c", "echo started; exec sleep 600", cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(60):
            app_id = int(re.match(rb"app (\d+): ", await process.stderr.readline()).group(1))
            started = {(await process.stdout.readline()).decode() for _ in WORKERS}
        assert started == {f"[{w}] started\n" for w in WORKERS}
        executors = [pid for pid, _, kind in shell_cluster.processes() if kind == "executor"]
        commands = [child for pid in executors for child in children_of(pid)]
        assert len(commands) == 2  # the sleeps, one per worker
        with pytest.raises(RemoteError) as refused:  # what a dashboard asks for its charts: a clear "no"
            await client.metrics_history(app_id)
        assert refused.value.code == ErrorCode.CONFLICT and "shell app: it has no processors" in refused.value.message
        code, out, _ = await gearbus("kill", "--nats", shell_cluster.url, str(app_id))
        assert code == 0 and "killed" in out
        async with asyncio.timeout(30):
            await asyncio.gather(*(wait_exited(pid, 30) for pid in commands))
            _, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 1 and f"app {app_id} ended TERMINATED" in err.decode()
    for worker in WORKERS:
        assert f"[{worker}] exit 143 (stopped: the app was killed; ended by SIGTERM)" in err.decode()
    assert (await client.status(app_id)).state == AppState.TERMINATED


async def test_a_dead_worker_takes_its_whole_command_with_it(shell_cluster, client):
    """The worker is SIGKILLed: its executor's death signal kills the command's process
    group, a child that ignores SIGTERM included, and the shell ends non-zero. (Last in
    this file: the shared cluster has one worker left after it.)"""
    process = await asyncio.create_subprocess_exec(
        *GEARBUS, "shell", "--nats", shell_cluster.url, "--workers", "worker-1", "--", "sh", "-c",
        '(trap "" TERM; exec sleep 601) & echo started; exec sleep 601', cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(60):
            assert await process.stdout.readline() == b"[worker-1] started\n"
        [executor] = [pid for pid, worker, kind in shell_cluster.processes() if kind == "executor"]
        [command] = children_of(executor)
        [left_behind] = children_of(command)
        shell_cluster.workers["worker-1"].kill()
        async with asyncio.timeout(30):
            await asyncio.gather(wait_exited(command, 30), wait_exited(left_behind, 30))
            await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 1
