"""Replacing a processor's code in a running app on a real cluster (`gearbus replace`): the
new code takes over at a checkpoint with the state of the steps it keeps, and the output is
exact; new code that fails on its first records is rolled back and the app goes on with the
old; a replacement that cannot be made is refused with the reason, the app untouched."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import signal
import time

import pytest

from gearbus.artifact import pack
from gearbus.connectors.jetstream import ensure_stream_async
from shared.bus import RequestError
from shared.messages import AppState
from shared import subjects
from tests.support.cli import gearbus
from tests.support.cluster import wait_until
from tests.support.dashboard import Dashboard
from tests.support.logs import logged
from tests.support.paths import APPS
from tests.support.user_counts import (APP, EVENTS, USERS, args, counts, expected_counts, publish, read_at_least,
                                       start_counting)

pytestmark = pytest.mark.timeout(150)
VERSIONED = os.path.join(APPS, "versioned_counts.py")


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


async def test_with_an_event_time_events_before_it_are_counted_by_the_old_code_and_the_rest_by_the_new(
        cluster, client, tmp_path):
    """An event's number is its event time: the old code holds back events from the time
    asked on until the watermark passes it; the new code counts them, and the rest."""
    url, output, at = cluster.url, tmp_path / "rows.jsonl", 2 * EVENTS // 3
    app = await start_versioned(client, url, output, "--event-time")
    replacing = asyncio.create_task(gearbus("replace", "--nats", url, "--json", "--at", str(at), str(app), "count",
                                            VERSIONED, *args(output, version=2), "--event-time"))
    await wait_epoch(client, app, 1)  # the old code holds events from `at` on
    await publish(url, EVENTS // 3, at + 50)  # the watermark passes `at`: the new code takes over
    await wait_epoch(client, app, 2)
    await publish(url, at + 50, EVENTS)
    code, out, err = await replacing
    assert code == 0, err
    assert json.loads(out)["version"] == 2
    final = await client.wait(app, timeout=90)
    assert final.state == AppState.SUCCEEDED, final.error
    rows = counted_once(output)
    assert [r["n"] for r in rows if r["version"] != (2 if r["n"] >= at else 1)] == []
    # both epochs (the hold, the switch) restored only the counting processor's tasks: the others went on in place
    restored = [fields["task_id"] for fields in logged(cluster.log_dir, "task_restored")]
    assert len(restored) == 4 and all(task.startswith("count") for task in restored), restored
    assert {fields["epoch"] for fields in logged(cluster.log_dir, "tasks_kept_running")} == {1, 2}


async def test_a_rescaled_and_replaced_app_shows_both_to_a_late_dashboard_and_survives_its_appmaster(cluster, client,
                                                                                                  tmp_path):
    """A running count, a row per event: the counting processor is rescaled (its count goes
    on, not from zero), then replaced while events flow (its state carried over: the counts
    go on); a dashboard started only then shows both on its timeline at the times they
    happened, and charts from before it started. Then the AppMaster is killed: the
    relaunched one runs the new code at the new parallelism from what it reads back, goes
    on with the timeline, and every event is counted once."""
    url, output = cluster.url, tmp_path / "rows.jsonl"
    app = await start_versioned(client, url, output)

    async def counting():  # what the counting processor took in so far, once its tasks reported some
        return next(p for p in (await client.status(app)).processors if p.processor == 1).records_in

    counted = await wait_until(client, subjects.appmaster_heartbeat("*"), counting)
    asked_rescale = time.time() * 1000
    await client.rescale(app, {"count": 3})
    rescaled = time.time() * 1000
    after = next(p for p in (await client.status(app)).processors if p.processor == 1)
    assert after.parallelism == 3 and after.records_in >= counted > 0  # carried over, not restarted from zero
    replacing = asyncio.create_task(gearbus("replace", "--nats", url, "--json", str(app), "count", VERSIONED,
                                            *args(output, version=2)))
    await wait_epoch(client, app, 2)
    await publish(url, EVENTS // 3, 2 * EVENTS // 3)
    code, out, err = await replacing
    assert code == 0, err
    replaced = time.time() * 1000
    done = json.loads(out)
    assert (done["version"], done["processor"], done["dropped_state"]) == (2, "count", [])
    assert (await client.status(app)).restarts == 0  # a replacement is not a failure
    name, rescale = after.name, f"{after.name} 2 → 3"
    pending, running = (f"{name} (step count): version 2 {state}" for state in ("pending", "running"))
    async with Dashboard(url) as dashboard:
        started = time.time() * 1000
        status, timeline = await dashboard.json("GET", f"/api/v1/apps/{app}/timeline")
        assert status == 200, timeline
        changes = [(e["kind"], e["detail"]) for e in timeline if e["kind"] in ("rescale", "replace")]
        assert changes == [("rescale", rescale), ("replace", pending), ("replace", running)], timeline
        at = {e["detail"]: e["t_ms"] for e in timeline}
        assert asked_rescale <= at[rescale] <= rescaled <= at[pending] <= at[running] <= replaced < started
        status, series = await dashboard.json("GET", f"/api/v1/apps/{app}/series")
        assert status == 200 and series["samples"][0]["t_ms"] < asked_rescale, series["samples"][:1]
        assert name in {p["name"] for p in series["processors"]}
    os.kill(next(pid for pid, _, kind in cluster.processes() if kind == "appmaster"), signal.SIGKILL)
    await publish(url, 2 * EVENTS // 3, EVENTS)
    final = await client.wait(app, timeout=90)
    assert final.state == AppState.SUCCEEDED, final.error
    rows = counted_once(output)
    assert {r["version"] for r in rows if r["n"] >= 2 * EVENTS // 3} == {2}  # the relaunched AppMaster's code
    assert {r["version"] for r in rows if r["n"] < EVENTS // 6} == {1}
    assert [p.parallelism for p in final.processors if p.processor == 1] == [3]
    assert [(v.version, v.state, v.processor, v.step) for v in final.versions] == \
        [(1, "replaced", -1, ""), (2, "running", 1, "count")]
    events = [(e.kind, e.detail) for e in final.events]  # the first AppMaster's, kept by the relaunched one
    assert events.index(("replace", running)) < next(
        i for i, (_, detail) in enumerate(events) if detail.startswith("AppMaster relaunched (attempt 1)")), events
    code, out, err = await gearbus("status", "--nats", url, str(app))
    assert code == 0, err
    assert re.search(r"v1 replaced .*as submitted", out) and re.search(r"v2 running .*step count", out), out


async def start_versioned(client, url: str, output, *more: str) -> int:
    """tests/apps/versioned_counts.py (version 1) counting the first third of the events,
    a sixth of them read: its id."""
    await ensure_stream_async(client.bus.nc, "EV", ["ev.*"], 120, "file")
    await publish(url, 0, EVENTS // 3)
    app = await client.submit(pack(VERSIONED), args(output, version=1) + list(more))
    await read_at_least(client, app, EVENTS // 6)
    return app


def counted_once(output) -> list[dict]:
    """The rows versioned_counts wrote: each event's, once, each user's counts 1, 2, ..."""
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(r["n"] for r in rows) == list(range(EVENTS))
    per_user = collections.Counter(f"u{n % USERS}" for n in range(EVENTS))
    assert sorted((r["user"], r["count"]) for r in rows) == \
        sorted((u, c) for u, total in per_user.items() for c in range(1, total + 1))
    return rows
