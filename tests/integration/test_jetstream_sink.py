"""Bus apps write into JetStream (for Spark's jetstream source to read) with
write_jetstream: with ids taken from the data (``id_fn``), running the same work again
stores nothing twice."""

from __future__ import annotations

import asyncio
import json
import os

from gearbus.artifact import pack
from gearbus.connectors import jetstream
from shared.messages import AppState
from tests.support.paths import APPS


async def test_a_bus_app_writes_into_a_jetstream_stream_without_duplicates(cluster, client):
    app = os.path.join(APPS, "to_jetstream.py")
    for _ in range(2):  # the second run publishes the same data again: all of it deduplicated
        app_id = await client.submit(pack(app), [cluster.url, "2000"])
        final = await client.wait(app_id, timeout=60)
        assert final.state == AppState.SUCCEEDED, final.error
        state = await asyncio.get_running_loop().run_in_executor(None, jetstream.stream_state, cluster.url,
                                                                 "READINGS")
        assert state["messages"] == 2000
    sub = await client.bus.js.subscribe("readings.raw", ordered_consumer=True)
    seen = set()
    for _ in range(2000):
        msg = await sub.next_msg(timeout=10)
        seen.add(json.loads(msg.data)["ts"])
    await sub.unsubscribe()
    assert seen == {1_700_000_000_000 + n * 250 for n in range(2000)}
