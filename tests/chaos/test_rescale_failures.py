"""An executor SIGKILLed while a rescale is under way: the rescale is either done or refused
(the app rolled back, or was rolling back when it was asked), the app recovers by itself,
and its counts are exact either way."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from gearbus.artifact import pack
from shared.bus import RequestError
from shared.messages import AppState
from tests.support import keyed_counts
from tests.support.user_counts import EVENTS, counts, expected_counts, publish, read_at_least, start_counting

pytestmark = pytest.mark.timeout(150)


@pytest.mark.parametrize("delay_s", [0.0, 0.3])
async def test_an_executor_killed_while_a_rescale_is_under_way_leaves_the_counts_exact(cluster, client, tmp_path,
                                                                                       delay_s):
    url, output = cluster.url, tmp_path / "counts.jsonl"
    app = await start_counting(client, url, output, EVENTS // 2)
    await read_at_least(client, app, EVENTS // 4)
    rescale = asyncio.create_task(client.rescale(app, {"count": 3}))
    await asyncio.sleep(delay_s)  # the request on its way, or its checkpoint and division under way
    victim = next(pid for pid, _, kind in cluster.processes() if kind == "executor")
    os.kill(victim, signal.SIGKILL)
    try:
        done = await rescale
        assert [n for name, n in done.processors.items() if "count" in name] == [3]
    except RequestError as refused:  # overtaken by the rollback, or asked while it was under way
        assert "the app rolled back" in refused.message or "rescale it once it runs" in refused.message, \
            refused.message
    await publish(url, EVENTS // 2, EVENTS)
    final = await client.wait(app, timeout=90)
    assert final.state == AppState.SUCCEEDED, final.error
    assert final.restarts == 1
    assert counts(output) == expected_counts()


async def test_on_disk_an_executor_killed_as_a_rescale_begins_takes_its_copies_with_it_and_counts_stay_exact(
        cluster, client, tmp_path):
    """The running count per key in the rocksdb backend: an executor SIGKILLed just after a
    rescale is asked. Its worker removes its scratch directory, local copies included, so
    the restore that follows finds only the other executor's: the key groups it held come
    from the checkpoint store, the others from the copies, and every count stays exact."""
    output = tmp_path / "counts.jsonl"
    app = await client.submit(pack(keyed_counts.APP), ["40", str(output), "2", "rocksdb"])
    first = await read_at_least(client, app, 300)
    rescale = asyncio.create_task(client.rescale(app, {"count": 3}))
    await asyncio.sleep(0.3)
    victim = next(pid for pid, _, kind in cluster.processes() if kind == "executor")
    os.kill(victim, signal.SIGKILL)
    try:
        await rescale
    except RequestError as refused:
        assert "the app rolled back" in refused.message or "rescale it once it runs" in refused.message, \
            refused.message
    await read_at_least(client, app, 300, after_checkpoint=first + 1)
    await client.savepoint(app, stop=True)
    assert keyed_counts.assert_counted_once(output, 40) > 600
    assert (await client.status(app)).restarts == 1
