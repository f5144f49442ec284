"""An executor SIGKILLed while a rescale is under way: the rescale is either done or refused
(the app rolled back, or was rolling back when it was asked), the app recovers by itself,
and its counts are exact either way."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from shared.bus import RequestError
from shared.messages import AppState
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
