"""Nexmark queries on an embedded cluster, and over events published into JetStream, checked
against the DuckDB oracle."""

from __future__ import annotations

import os

import pytest

from gearbus.nexmark import GeneratorConfig, publish_events, write_events
from gearbus.runners import LocalRunner, TestRunner
from shared.messages import AppState
from tests.support.nexmark import assert_same_rows, check_q12, oracle, read_output
from tests.support.paths import EXAMPLES

NEXMARK = os.path.join(EXAMPLES, "nexmark")


#: Every query; half read one source of every event split by kind (--all-events), whose
#: branches run at the source's senders.
LOCAL_RUNS = [("q0", False), ("q1", True), ("q2", False), ("q3", True), ("q4", True), ("q5", False),
              ("q7", False), ("q8", True), ("q9", True), ("q11", False), ("q12", True)]


@pytest.mark.parametrize("name, all_events", LOCAL_RUNS)
async def test_every_query_on_the_local_runner(name, all_events, tmp_path):
    output, events = tmp_path / "out.jsonl", tmp_path / "events.jsonl"
    runner = LocalRunner(workers=2)
    try:
        await runner.start(os.path.join(NEXMARK, f"{name}.py"),
                           ["--events", "4000", "--rate", "100", "--output", str(output), "--dump-events", str(events)]
                           + ["--all-events"] * all_events)
        final = await runner.wait(timeout=90)
    finally:
        await runner.stop()
    assert final.state == AppState.SUCCEEDED, final.error
    if name == "q12":
        check_q12(read_output(output), events)
    else:
        assert_same_rows(read_output(output), oracle(name, events))


def test_queries_read_the_events_published_into_jetstream(nats_server, tmp_path):
    config = GeneratorConfig(seed=4, rate=100)
    assert publish_events(nats_server.url, "NEXMARK", 4000, config, partitions=3) == (4000, 0)
    assert publish_events(nats_server.url, "NEXMARK", 4000, config, partitions=3) == (0, 4000)  # ids deduplicate
    events = write_events(tmp_path / "events.jsonl", 4000, config)
    for name, all_events in (("q5", False), ("q12", False), ("q8", True)):
        output = tmp_path / f"{name}.jsonl"
        TestRunner().run(os.path.join(NEXMARK, f"{name}.py"), ["--jetstream", "NEXMARK", "--servers", nats_server.url,
                                                             "--parallelism", "3", "--output", str(output)]
                         + ["--all-events"] * all_events)  # every subject read once, split by kind
        if name == "q12":
            check_q12(read_output(output), events)
        else:
            assert_same_rows(read_output(output), oracle(name, events))
