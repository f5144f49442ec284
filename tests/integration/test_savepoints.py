"""Savepoints on a real cluster: stop an app with a savepoint half-way through a stream,
change a map's code, resume from the savepoint: the state carries over and the final
counts are exact, also when the counting step runs in more tasks than it was saved from;
a pipeline whose stateful steps do not match is refused, naming them."""

from __future__ import annotations

import os

import pytest

from gearbus.artifact import pack
from gearbus.connectors.jetstream import ensure_stream_async
from shared import subjects
from shared.bus import RequestError
from shared.messages import AppState
from tests.support.cluster import wait_until
from tests.support.user_counts import APP, EVENTS, args, counts, expected_counts, publish, start_counting

pytestmark = pytest.mark.timeout(120)


async def test_stop_with_a_savepoint_change_the_code_and_resume_exactly(cluster, client, tmp_path):
    url, output = cluster.url, tmp_path / "counts.jsonl"
    first = await start_counting(client, url, output, EVENTS // 2)

    async def read_half():
        status = await client.status(first)
        read = sum(c.records_in for c in status.tasks if c.task.processor == 0)
        return status if read >= EVENTS // 2 and status.checkpoints and status.checkpoints.last_id else None

    await wait_until(client, subjects.appmaster_heartbeat("*"), read_half)
    taken = await client.savepoint(first, "half", stop=True)
    assert taken.name == "half" and {"events", "by_user", "count", "write"} <= set(taken.steps)
    assert (await client.wait(first, timeout=30)).state == AppState.TERMINATED
    assert not os.path.exists(output) or os.path.getsize(output) == 0  # the counts come at the end

    with pytest.raises(RequestError, match="only a running app can take a savepoint"):
        await client.savepoint(first, "again")
    await publish(url, EVENTS // 2, EVENTS)
    second = await client.submit(pack(APP), args(output, 2), config={"from_savepoint": "half"})
    final = await client.wait(second, timeout=60)
    assert final.state == AppState.SUCCEEDED, final.error
    expected = expected_counts(format=2)
    assert counts(output) == expected

    # the sink's state is its file's: resuming it cuts the file back to the savepoint's
    rescaled = await client.submit(pack(APP), args(output, 4), config={"from_savepoint": "half"})
    final = await client.wait(rescaled, timeout=60)
    assert final.state == AppState.SUCCEEDED, final.error
    assert counts(output) == expected  # the counts of 2 tasks divided over 3 by key group

    renamed = await client.submit(pack(APP), args(tmp_path / "other.jsonl", 3), config={"from_savepoint": "half"})
    refused = await client.wait(renamed, timeout=60)
    assert refused.state == AppState.FAILED and refused.error.error_type == "SavepointMismatch"
    assert "'total'" in refused.error.message and "'count'" in refused.error.message


async def test_a_savepoint_that_does_not_exist_fails_the_app_clearly(cluster, client, tmp_path):
    await ensure_stream_async(client.bus.nc, "EV", ["ev.*"], 120, "file")
    await publish(cluster.url, 0, 10)
    app_id = await client.submit(pack(APP), args(tmp_path / "o.jsonl", 1), config={"from_savepoint": "nope"})
    final = await client.wait(app_id, timeout=60)
    assert final.state == AppState.FAILED and final.error.error_type == "SavepointNotFound"
    assert "'nope'" in final.error.message
