"""Checkpoints that cannot be stored (the bucket is gone) do not stop an app at once: it
runs on and reports the failures, and fails only past the tolerated number in a row. State
that cannot be checkpointed fails the app naming the step, the key and the type, on the
cluster as in the TestRunner."""

from __future__ import annotations

import os
import re

import pytest

from gearbus.artifact import pack
from gearbus.runners import TestRunner
from shared import subjects
from shared.messages import AppState
from tests.support.cluster import wait_state, wait_until
from tests.support.paths import APPS, TICKER

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


@pytest.mark.parametrize("held, error_type, says", [
    ("lock", "UnserialisableState", "step 'hold' holds a lock for key 0, which a checkpoint cannot copy"),
    ("function", "CheckpointsFailing", "the state of hold+write[0] cannot be serialised (step 'hold', entry (0, "),
])
async def test_state_that_cannot_be_checkpointed_fails_alike_on_the_cluster_and_the_test_runner(
        client, tmp_path, held, error_type, says):
    """The TestRunner drives the executors' task lifecycle: the same app fails the same way."""
    app = os.path.join(APPS, "unpicklable_state.py")
    local = TestRunner().run(app, [str(tmp_path / "local.jsonl"), held], raise_on_failure=False)
    app_id = await client.submit(pack(app), [str(tmp_path / "cluster.jsonl"), held])
    final = await client.wait(app_id, timeout=60)
    assert local.state == final.state == AppState.FAILED
    assert local.error.error_type == final.error.error_type == error_type
    assert says in final.error.message
    assert without_addresses(local.error.message) == without_addresses(final.error.message)


def without_addresses(message: str) -> str:
    return re.sub(r" at 0x[0-9a-f]+", "", message)
