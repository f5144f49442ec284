"""The ticker example's output (one JSON line per tick, numbered from 0) and waits on its progress."""

from __future__ import annotations

import json
import os

from gearbus.client import Client
from shared import subjects
from tests.support.cluster import wait_until


def read_ticks(path) -> list[int]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["n"] for line in f if line.endswith("\n")]


async def wait_for_ticks(client: Client, path, beyond: int, timeout: float = 20,
                         watcher: Client | None = None) -> list[int]:
    """Wait (woken by AppMaster heartbeats, which ``watcher`` may see if ``client`` may not)
    until the output holds a number > ``beyond``."""

    async def probe():
        ticks = read_ticks(path)
        return ticks if ticks and max(ticks) > beyond else None

    return await wait_until(client, subjects.appmaster_heartbeat("*"), probe, timeout, watcher)
