"""tests/apps/savepoint_counts.py's inputs and outputs: events of USERS users published to a
JetStream stream, and the counts per user the app writes."""

from __future__ import annotations

import collections
import json
import os

import nats

from gearbus.artifact import pack
from gearbus.connectors.jetstream import Publisher, ensure_stream_async
from shared.messages import AppState
from shared import subjects
from tests.support.cluster import wait_state, wait_until
from tests.support.paths import APPS

APP = os.path.join(APPS, "savepoint_counts.py")
EVENTS = 6_000
USERS = 7


async def publish(url: str, first: int, end: int, subjects: int = 1, first_subject: int = 1) -> None:
    """Events ``first`` to ``end`` (exclusive) on subject ev.<first_subject> (with ``subjects``:
    event n on ev.<first_subject + n % subjects>), deduplicated by number."""
    nc = await nats.connect(url)
    try:
        publisher = await Publisher(nc).open()
        for n in range(first, end):
            await publisher.publish(f"ev.{first_subject + n % subjects}", json.dumps({"n": n, "user": f"u{n % USERS}"}).encode(),
                                    f"ev-{n}")
        await publisher.drain()
    finally:
        await nc.close()


def counts(output) -> list[dict]:
    with open(output, encoding="utf-8") as f:
        return sorted((json.loads(line) for line in f), key=lambda row: row["user"])


def expected_counts(**fields) -> list[dict]:
    """Each user's count over all EVENTS, with ``fields`` added to every row."""
    return [{"user": u, "count": c, **fields}
            for u, c in sorted(collections.Counter(f"u{n % USERS}" for n in range(EVENTS)).items())]


def args(output, version: int) -> list[str]:
    return ["--stream", "EV", "--until", str(EVENTS), "--output", str(output), "--version", str(version)]


async def start_counting(client, url: str, output, published: int, version: int = 1) -> int:
    """The stream made and events 0 to ``published`` in it, the app submitted in
    ``version`` and ACTIVE: its id."""
    await ensure_stream_async(client.bus.nc, "EV", ["ev.*"], 120, "file")
    await publish(url, 0, published)
    app_id = await client.submit(pack(APP), args(output, version))
    await wait_state(client, app_id, AppState.ACTIVE)
    return app_id


async def read_at_least(client, app_id: int, events: int, after_checkpoint: int = 0) -> int:
    """Wait until the source tasks read ``events`` in the current epoch (their counters
    start anew with each) and a checkpoint after ``after_checkpoint`` completed; its id."""
    async def probe():
        status = await client.status(app_id)
        read = sum(c.records_in for c in status.tasks if c.task.processor == 0)
        last = status.checkpoints.last_id if status.checkpoints else 0
        return last if read >= events and last > after_checkpoint else None

    return await wait_until(client, subjects.appmaster_heartbeat("*"), probe, timeout=60)
