"""Nexmark queries with state (Q3's keyed state, Q5's windows, Q8's window join) reading
their events from JetStream on a real cluster, with an executor SIGKILLed mid-run after
three checkpoints, or for Q3 once the AppMaster compacted a checkpoint (so its restore
reads a compacted snapshot and the incremental ones since): the app rolls back and its
output still equals the DuckDB oracle's rows, nothing lost and nothing twice."""

from __future__ import annotations

import asyncio
import os

import pytest

from gearbus.artifact import pack
from gearbus.nexmark import GeneratorConfig, publish_events, write_events
from shared.messages import AppState
from tests.support.cluster import kill_an_executor_after_a_checkpoint, wait_for_compaction, wait_state
from tests.support.nexmark import assert_same_rows, oracle, read_output
from tests.support.paths import EXAMPLES

EVENTS = 60_000
CONFIG = GeneratorConfig(seed=11, rate=1_000)  # 60 s of event time: many windows


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["q3", "q5", "q8"])
async def test_a_query_reading_jetstream_is_exact_through_a_killed_executor(name, cluster, client, tmp_path):
    stream = f"NEXMARK_{name.upper()}"
    # A third of the events first; the app reads up to the last one, so it waits for the rest,
    # which come after the kill (ids deduplicate the ones already stored).
    assert await asyncio.to_thread(publish_events, cluster.url, stream, EVENTS // 3, CONFIG) == (EVENTS // 3, 0)
    events = await asyncio.to_thread(write_events, tmp_path / "events.jsonl", EVENTS, CONFIG)
    output = tmp_path / "out.jsonl"
    app_id = await client.submit(pack(os.path.join(EXAMPLES, "nexmark", f"{name}.py")),
                                 ["--jetstream", stream, "--until", str(EVENTS), "--parallelism", "2",
                                  "--output", str(output)],
                                 config={"checkpoint_interval_ms": 300})
    await wait_state(client, app_id, AppState.ACTIVE)
    if name == "q3":
        await wait_for_compaction(client, app_id)
    await kill_an_executor_after_a_checkpoint(cluster, client, app_id, checkpoints=3)
    stored = await asyncio.to_thread(publish_events, cluster.url, stream, EVENTS, CONFIG)
    assert stored == (EVENTS - EVENTS // 3, EVENTS // 3)
    final = await client.wait(app_id, timeout=180)
    assert final.state == AppState.SUCCEEDED, final.error
    assert final.restarts >= 1
    assert_same_rows(read_output(output), oracle(name, events))
