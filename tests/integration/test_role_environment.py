"""Every role reads the NATS URL from the environment as the command line does
(``$GEARBUS_NATS_URL``, the flag winning), as containers and twelve-factor services expect."""

from __future__ import annotations

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
