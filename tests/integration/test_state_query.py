"""Reading a running app's keyed state for one key, as a user does: `gearbus state`, the
client and the REST API, against a real cluster; the app runs on meanwhile."""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter

import pytest

from gearbus.artifact import pack
from gearbus.runtime.state_backend import BACKENDS
from shared.bus import RequestError
from shared.messages import AppState, ErrorCode
from tests.support.cli import gearbus
from tests.support.cluster import wait_state
from tests.support.dashboard import Dashboard
from tests.support.files import read_jsonl
from tests.support.paths import APPS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KEYED_COUNTS = os.path.join(APPS, "keyed_counts.py")
KEYS, PARALLELISM = 5, 2


async def counted(client, app_id: int, key: int) -> int:
    """The live count of ``key``, once its task has counted one."""
    async with asyncio.timeout(30):
        while True:
            reply = await client.state(app_id, "count", json.dumps(key))
            if reply.found:
                return json.loads(reply.value)
            await asyncio.sleep(0.1)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_running_apps_state_is_read_by_key_from_the_task_that_owns_it(cluster, client, tmp_path, backend):
    output = tmp_path / "counts.jsonl"
    app_id = await client.submit(pack(KEYED_COUNTS), [str(KEYS), str(output), str(PARALLELISM), backend])
    await wait_state(client, app_id, AppState.ACTIVE)
    first = {key: await counted(client, app_id, key) for key in range(KEYS)}
    assert all(count >= 1 for count in first.values())

    reply = await client.state(app_id, "count", "3")
    async with asyncio.timeout(30):
        while (app := await client.status(app_id)).dag is None:  # the AppMaster's first heartbeat brings it
            await asyncio.sleep(0.1)
    counter = next(p for p in app.dag.processors if p.name.startswith("count"))
    # executors hash ints as ints: key 3 is in key group 3, which task 3 * n // 128 of n owns
    assert (reply.task.processor, reply.task.index) == (counter.id, 3 * PARALLELISM // 128)

    committed = Counter(row % KEYS for row in read_jsonl(output)) if output.exists() else Counter()
    later = {key: await counted(client, app_id, key) for key in range(KEYS)}
    assert all(later[key] >= max(first[key], committed[key]) for key in range(KEYS))  # live: ahead of the output
    async with asyncio.timeout(30):
        while await counted(client, app_id, 0) <= later[0]:  # the app runs on while it is read
            await asyncio.sleep(0.1)

    nothing = await client.state(app_id, "count", "99")
    assert not nothing.found and nothing.value == "null"
    if backend != "memory":
        return  # the command line and the REST API ask through the same request, whatever holds the state

    code, out, err = await gearbus("state", str(app_id), "count", "1", "--nats", cluster.url)
    assert code == 0 and int(out) >= later[1], (out, err)
    code, out, err = await gearbus("state", str(app_id), "count", "1", "--json", "--nats", cluster.url)
    shown = json.loads(out)
    assert code == 0 and shown["found"] and shown["key"] == 1 and shown["value"] >= later[1]
    assert shown["task"] == {"processor": counter.id, "index": 1 * PARALLELISM // 128}
    code, out, err = await gearbus("state", str(app_id), "count", "99", "--nats", cluster.url)
    assert code == 1 and "holds nothing for key 99" in err
    code, out, err = await gearbus("state", str(app_id), "nope", "1", "--nats", cluster.url)
    assert code != 0 and "no step named 'nope'" in err and "count" in err
    code, out, err = await gearbus("state", str(app_id), "count", "word", "--nats", cluster.url)
    assert code != 0 and "the key must be JSON" in err

    async with Dashboard(cluster.url) as dashboard:
        status, body = await dashboard.json("GET", f"/api/v1/apps/{app_id}/state/count?key=2")
        assert status == 200 and body["found"] and body["value"] >= later[2] and body["key"] == 2
        status, body = await dashboard.json("GET", f"/api/v1/apps/{app_id}/state/by_key?key=2")
        assert status == 400 and "holds no state by key" in body["error"]
        status, body = await dashboard.json("GET", f"/api/v1/apps/{app_id}/state/count?key=%7B%7D")
        assert status == 400 and "cannot be a JSON object" in body["error"]

    await client.kill(app_id)
    await wait_state(client, app_id, AppState.TERMINATED)
    with pytest.raises(RequestError) as refused:
        await client.state(app_id, "count", "1")
    assert refused.value.code == ErrorCode.CONFLICT and "only a running app's state" in refused.value.message
