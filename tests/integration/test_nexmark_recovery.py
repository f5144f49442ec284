"""Nexmark queries with state (Q3's keyed state, Q5's windows, Q8's window join) reading
their events from JetStream on a real cluster, with an executor SIGKILLed mid-run after
three checkpoints; for Q3 the executor, or the AppMaster, is SIGKILLed as the AppMaster
starts compacting a checkpoint (the rollback waits for the compaction and restores what it
wrote; a relaunched AppMaster finds the snapshots it was replacing intact). The app
recovers and its output still equals the DuckDB oracle's rows, nothing lost and nothing
twice."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from gearbus.artifact import pack
from gearbus.nexmark import GeneratorConfig, publish_events, write_events
from shared.messages import AppState
from tests.support.cluster import a_compaction_starts, kill_an_executor_after_a_checkpoint, wait_state
from tests.support.nexmark import assert_same_rows, oracle, read_output
from tests.support.paths import EXAMPLES

EVENTS = 30_000
CONFIG = GeneratorConfig(seed=11, rate=1_000)  # 30 s of event time: many windows


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name, victim, backend", [("q3", "executor", "memory"), ("q3", "executor", "rocksdb"),
                                                   ("q3", "appmaster", "memory"), ("q5", "executor", "rocksdb"),
                                                   ("q8", "executor", "memory")])
async def test_a_query_reading_jetstream_is_exact_through_a_killed_process(name, victim, backend, cluster, client,
                                                                          tmp_path):
    """q3 (a join and keyed state) killed as a compaction starts, with each state backend;
    q5 (sliding windows) on disk and q8 (a window join) in memory killed after checkpoints."""
    stream = f"NEXMARK_{name.upper()}"
    # A third of the events first; the app reads up to the last one, so it waits for the rest,
    # which come after the kill (ids deduplicate the ones already stored).
    assert await asyncio.to_thread(publish_events, cluster.url, stream, EVENTS // 3, CONFIG) == (EVENTS // 3, 0)
    events = await asyncio.to_thread(write_events, tmp_path / "events.jsonl", EVENTS, CONFIG)
    output = tmp_path / "out.jsonl"
    app_id = await client.submit(pack(os.path.join(EXAMPLES, "nexmark", f"{name}.py")),
                                 ["--jetstream", stream, "--until", str(EVENTS), "--parallelism", "2",
                                  "--output", str(output)],
                                 config={"checkpoint_interval_ms": 300, "state_backend": backend})
    await wait_state(client, app_id, AppState.ACTIVE)
    if name == "q3":
        await a_compaction_starts(client, app_id)
        os.kill(next(pid for pid, _, kind in cluster.processes() if kind == victim), signal.SIGKILL)
    else:
        await kill_an_executor_after_a_checkpoint(cluster, client, app_id, checkpoints=3)
    stored = await asyncio.to_thread(publish_events, cluster.url, stream, EVENTS, CONFIG)
    assert stored == (EVENTS - EVENTS // 3, EVENTS // 3)
    final = await client.wait(app_id, timeout=180)
    assert final.state == AppState.SUCCEEDED, final.error
    assert final.restarts >= 1 or victim == "appmaster"  # a relaunched AppMaster adopts the executors
    assert_same_rows(read_output(output), oracle(name, events))
