"""Every role reads the NATS URL from the environment as the command line does
(``$GEARBUS_NATS_URL``, the flag winning), as containers and twelve-factor services expect;
one that cannot reach it says so, naming it, and exits after ``--connect-timeout``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from gearbus.client import Client
from shared.bus import NATS_URL_ENV
from tests.support.cluster import wait_for_workers
from tests.support.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

UNREACHABLE = "nats://127.0.0.1:1"
ROLES = ("master", "worker", "dashboard")


def start(role: str, env_url: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", f"services.{role}", *args], cwd=REPO,
                            env=dict(os.environ, **{NATS_URL_ENV: env_url}),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def test_a_master_and_a_worker_find_nats_through_the_environment_and_a_flag_wins(nats_server, tmp_path):
    master = start("master", nats_server.url, "--master-id", "from-env")
    worker = start("worker", UNREACHABLE, "--nats", nats_server.url, "--worker-id", "flag-wins", "--slots", "1",
                   "--log-dir", str(tmp_path))
    try:
        async with Client(nats_server.url, timeout=30) as client:
            await wait_for_workers(client, 1)
            info = await client.info()
        assert info.leader == "from-env"
        assert [w.worker_id for w in info.workers] == ["flag-wins"]
    finally:
        for process in (worker, master):
            process.terminate()
            process.wait(20)


async def test_a_role_that_cannot_reach_nats_retries_naming_the_url_then_exits_non_zero():
    """Master, worker and dashboard alike: warnings that name the URL while they retry, then an
    exit code other than 0 soon after --connect-timeout, with the URL in the last word."""
    closed = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)
    dead = f"nats://127.0.0.1:{closed.sockets[0].getsockname()[1]}"
    closed.close()
    await closed.wait_closed()
    loop = asyncio.get_running_loop()

    async def give_up(role: str) -> tuple[int, str, float]:
        started = loop.time()
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", f"services.{role}", "--nats", dead, "--connect-timeout", "2",
            *(["--port", "0"] if role == "dashboard" else []), cwd=REPO,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(process.communicate(), 30)
        return process.returncode, out.decode(), loop.time() - started

    for role, (code, out, took) in zip(ROLES, await asyncio.gather(*(give_up(role) for role in ROLES))):
        lines = out.strip().splitlines()
        assert code != 0 and took < 15, (role, code, took, out)
        retries = [line for line in lines if "nats_unreachable_retrying" in line]
        assert len(retries) >= 2 and all(dead in line for line in retries), (role, out)
        assert any(dead in line and "gave up after 2 s" in line for line in lines[-3:]), (role, out)
