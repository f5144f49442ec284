"""Replacing a processor's code in a running app on a real cluster (`gearbus replace`): the
new code takes over at a checkpoint with the state of the steps it keeps, and the output is
exact; new code that fails on its first records is rolled back and the app goes on with the
old; a replacement that cannot be made is refused with the reason, the app untouched."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from gearbus.artifact import pack
from shared.bus import RequestError
from shared.messages import AppState
from shared import subjects
from tests.support.cli import gearbus
from tests.support.cluster import wait_until
from tests.support.user_counts import APP, EVENTS, args, counts, expected_counts, publish, read_at_least, start_counting

pytestmark = pytest.mark.timeout(150)


async def replace_while_events_flow(client, url: str, app: int, *command: str) -> tuple[int, str, str]:
    """``gearbus replace`` of ``app``; once the new code took over (a new epoch), the rest
    of the events are published: its trial ends at a checkpoint covering records it
    processed (the counting processor's come at the end: the app's final checkpoint). The
    command's (exit code, stdout, stderr)."""
    replacing = asyncio.create_task(gearbus("replace", "--nats", url, *command))
    await wait_epoch(client, app, 1)
    await publish(url, EVENTS // 2, EVENTS)
    return await replacing


async def wait_epoch(client, app: int, epoch: int) -> None:
    async def reached():
        status = await client.status(app)
        return status.checkpoints is not None and status.checkpoints.epoch >= epoch

    await wait_until(client, subjects.appmaster_heartbeat("*"), reached, timeout=60)


async def test_a_replaced_processor_goes_on_with_its_state_in_the_new_code_exactly(cluster, client, tmp_path):
    url, output = cluster.url, tmp_path / "counts.jsonl"
    app = await start_counting(client, url, output, EVENTS // 2)
    await read_at_least(client, app, EVENTS // 4)
    code, out, err = await replace_while_events_flow(client, url, app, "--json", str(app), "format", APP,
                                                     *args(output, version=2))
    assert code == 0, err
    done = json.loads(out)
    assert (done["version"], done["processor"], done["dropped_state"]) == (2, "count+format", [])
    final = await client.wait(app, timeout=90)
    assert final.state == AppState.SUCCEEDED, final.error
    assert final.restarts == 0  # a replacement is not a failure
    assert counts(output) == expected_counts(format=2)  # the counts went on in the new code
    assert [(v.version, v.state, v.processor, v.step) for v in final.versions] == \
        [(1, "running", -1, ""), (2, "running", 1, "format")]


async def test_new_code_failing_on_its_first_records_is_rolled_back_and_the_app_goes_on(cluster, client, tmp_path):
    url, output = cluster.url, tmp_path / "counts.jsonl"
    app = await start_counting(client, url, output, EVENTS // 2)
    await read_at_least(client, app, 10)
    with pytest.raises(RequestError, match="event time 1 is behind the watermark of count\\+format"):
        await client.replace(app, "format", pack(APP), args(output, version=2), at_ms=1)
    for asked, reason in (("nope", "no step named 'nope'"),  # refused before anything changes
                          ("count", r"drop the state of step\(s\) 'count' \(WindowAggregateOp, gone\)")):
        with pytest.raises(RequestError, match=reason):
            await client.replace(app, asked if asked == "nope" else "format", pack(APP), args(output, version=3))
    code, _, err = await replace_while_events_flow(client, url, app, str(app), "by_user", APP,
                                                   *args(output, version=5))
    assert code != 0 and "version 2 rolled back to version 1" in err and "version 5 cannot key event" in err, err
    final = await client.wait(app, timeout=90)
    assert final.state == AppState.SUCCEEDED, final.error
    assert counts(output) == expected_counts()  # all by the old code, exactly once
    [first, failed] = final.versions
    assert (first.state, failed.state, failed.processor) == ("running", "rolled back", 0)
    assert "version 5 cannot key event" in failed.error
    code, out, _ = await gearbus("status", "--nats", url, str(app))
    assert "v2 rolled back" in out and "processor 0 (step by_user)" in out, out


async def test_a_replacement_at_an_event_time_takes_over_once_the_watermark_passed_it(cluster, client, tmp_path):
    url, output = cluster.url, tmp_path / "counts.jsonl"
    app = await start_counting(client, url, output, EVENTS // 4)
    await read_at_least(client, app, EVENTS // 8)
    at_ms = int(time.time() * 1000) + 1000  # events are stamped when the stream stores them
    replacing = asyncio.create_task(gearbus("replace", "--nats", url, "--json", "--at", str(at_ms), str(app),
                                            "format", APP, *args(output, version=2)))
    await publish(url, EVENTS // 4, EVENTS // 2)  # before the time: held by nothing
    await asyncio.sleep(max(0.0, at_ms / 1000 - time.time()))  # the event time to wait for is the clock's
    await publish(url, EVENTS // 2, EVENTS // 2 + 50)  # after it: the watermark passes it, the new code takes over
    await wait_epoch(client, app, 2)  # epoch 1 held records from the time on; from 2 the new code runs
    await publish(url, EVENTS // 2 + 50, EVENTS)  # (the counts reach the new code at the end: its trial ends there)
    code, out, err = await replacing
    assert code == 0, err
    assert json.loads(out)["version"] == 2
    final = await client.wait(app, timeout=90)
    assert final.state == AppState.SUCCEEDED, final.error
    assert counts(output) == expected_counts(format=2)
    assert [v.state for v in final.versions] == ["running", "running"]
