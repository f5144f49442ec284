"""Checkpoints that cannot be stored (the bucket is gone) do not stop an app at once: it
runs on and reports the failures, and fails only past the tolerated number in a row."""

from __future__ import annotations

import pytest

from gearbus.artifact import pack
from shared import subjects
from shared.messages import AppState
from tests.support.cluster import wait_state, wait_until
from tests.support.paths import TICKER

pytestmark = pytest.mark.timeout(90)


async def test_a_vanished_checkpoint_bucket_is_reported_then_fails_the_app(client, tmp_path):
    app_id = await client.submit(pack(TICKER), ["--output", str(tmp_path / "ticks.jsonl"), "--rate", "200"],
                                 config={"checkpoint_interval_ms": 100, "checkpoint_failures_tolerated": 20})
    await wait_state(client, app_id, AppState.ACTIVE)

    async def status_when(predicate):
        async def probe():
            status = await client.status(app_id)
            return status if predicate(status) else None
        return await wait_until(client, subjects.appmaster_heartbeat("*"), probe)

    await status_when(lambda s: s.checkpoints and s.checkpoints.completed >= 1)
    await client.bus.js.delete_object_store(subjects.snapshot_bucket(app_id))
    failing = await status_when(lambda s: s.state != AppState.ACTIVE or (s.checkpoints and s.checkpoints.failed))
    assert failing.state == AppState.ACTIVE, "the app must run on while checkpoints fail"
    assert failing.checkpoints.last_failure
    final = await client.wait(app_id, timeout=60)
    assert final.state == AppState.FAILED and final.error.error_type == "CheckpointsFailing"
    assert "21 consecutive checkpoint failures" in final.error.message
