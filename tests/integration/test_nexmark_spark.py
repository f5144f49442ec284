"""The Nexmark queries on the Spark runner, from the generator and from an events file,
checked against the DuckDB oracle."""

from __future__ import annotations

import os

import pytest

from gearbus.nexmark import GeneratorConfig, write_events
from gearbus.runners.spark import SparkRunner
from shared.messages import AppState
from tests.support.nexmark import assert_same_rows, check_q12, oracle, read_output
from tests.support.paths import EXAMPLES
from tests.support.spark import shared_spark

pytestmark = pytest.mark.spark

NEXMARK = os.path.join(EXAMPLES, "nexmark")


def run(name: str, args: list[str]):
    return SparkRunner(spark=shared_spark()).run(os.path.join(NEXMARK, f"{name}.py"), args)


@pytest.mark.parametrize("name", ["q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8", "q9", "q11", "q12"])
def test_each_query_gives_the_oracles_rows(name, tmp_path):
    output, events = tmp_path / "out", tmp_path / "events"
    result = run(name, ["--events", "4000", "--rate", "100", "--output", str(output), "--dump-events", str(events)])
    assert result.state == AppState.SUCCEEDED, result.error
    if name == "q12":
        check_q12(read_output(output), events)
    else:
        assert_same_rows(read_output(output), oracle(name, events))


def test_a_query_reads_an_events_file_and_names_a_bad_line(tmp_path):
    events = write_events(tmp_path / "events.jsonl", 3000, GeneratorConfig(seed=2, rate=100))
    result = run("q5", ["--input", events, "--output", str(tmp_path / "out")])
    assert result.state == AppState.SUCCEEDED, result.error
    assert_same_rows(read_output(tmp_path / "out"), oracle("q5", events))

    with open(events, "a", encoding="utf-8") as f:
        f.write('{"event_type": 2, "person": null, "auction": null, "bid": {"auction": 1}}\n')
    result = run("q5", ["--input", events, "--output", str(tmp_path / "bad")])
    assert result.state == AppState.FAILED
    assert f"{events}:3001: not a Nexmark event: the bid has missing bidder" in result.error.message


def test_a_blackhole_run_succeeds_without_an_output():
    result = run("q5", ["--events", "3000", "--rate", "100", "--blackhole"])
    assert result.state == AppState.SUCCEEDED, result.error
