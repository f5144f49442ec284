"""The Nexmark query files on the test runner, checked against the DuckDB oracle over the
events each run dumps, and the query files' command line."""

from __future__ import annotations

import os

import pytest

from gearbus.artifact import ArtifactError, load_pipeline
from gearbus.nexmark import GeneratorConfig, write_events
from gearbus.runners import TestRunner
from tests.support.nexmark import assert_same_rows, check_q12, oracle, read_output
from tests.support.paths import EXAMPLES

NEXMARK = os.path.join(EXAMPLES, "nexmark")
EVENTS = ["--events", "4000", "--rate", "100"]  # 40 s of event time: windows, slides and sessions


def query(name: str) -> str:
    return os.path.join(NEXMARK, f"{name}.py")


def check(name: str, output, events) -> None:
    rows = read_output(output)
    if name == "q12":
        check_q12(rows, events)
        return
    expected = oracle(name, events)
    assert expected, f"{name}: the oracle gives no rows; the test checks nothing"
    assert_same_rows(rows, expected)


@pytest.mark.parametrize("name", ["q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8", "q9", "q11", "q12"])
def test_each_query_gives_the_oracles_rows(name, tmp_path):
    output, events = tmp_path / "out.jsonl", tmp_path / "events.jsonl"
    TestRunner().run(query(name), EVENTS + ["--output", str(output), "--dump-events", str(events)])
    check(name, output, events)


@pytest.mark.parametrize("name", ["q3", "q4", "q5", "q7", "q8", "q9", "q11"])
def test_windowed_queries_over_more_tasks_and_another_interleaving_and_from_a_file(name, tmp_path):
    events = write_events(tmp_path / "events.jsonl", 3000, GeneratorConfig(seed=9, rate=50))
    generated, read = tmp_path / "generated.jsonl", tmp_path / "read.jsonl"
    TestRunner(seed=5).run(query(name), ["--events", "3000", "--rate", "50", "--seed", "9", "--parallelism", "3",
                                         "--output", str(generated)])
    check(name, generated, events)
    TestRunner(seed=6).run(query(name), ["--input", events, "--parallelism", "3", "--output", str(read)])
    check(name, read, events)


@pytest.mark.parametrize("name", ["q3", "q8", "q9"])
def test_all_events_from_one_source_split_by_kind(name, tmp_path):
    """--all-events: one source of whole events feeds every kind the query reads, from the
    generator and from a file, with the rows the per-kind sources give."""
    events = write_events(tmp_path / "events.jsonl", 3000, GeneratorConfig(seed=4, rate=50))
    generated, read = tmp_path / "generated.jsonl", tmp_path / "read.jsonl"
    pipeline = load_pipeline(query(name), ["--events", "3000", "--all-events", "--output", str(generated)])
    assert [s.name for s in pipeline.steps if s.kind == "source"] == ["events"]
    TestRunner(seed=2).run(query(name), ["--events", "3000", "--rate", "50", "--seed", "4", "--all-events",
                                         "--output", str(generated)])
    check(name, generated, events)
    TestRunner(seed=3).run(query(name), ["--input", events, "--all-events", "--parallelism", "3", "--output", str(read)])
    check(name, read, events)


@pytest.mark.parametrize("args, message", [
    ([], "say where the events come from"),
    (["--events", "10", "--input", "x.jsonl"], "not allowed with argument"),
    (["--input", "missing.jsonl"], "input file missing.jsonl does not exist"),
    (["--jetstream", "NEX", "--seed", "3"], "--rate, --seed and --base-time configure the generator"),
    (["--events", "10", "--follow"], "--servers, --follow and --until go with --jetstream"),
    (["--jetstream", "NEX", "--follow", "--until", "5"], "give one of them"),
    (["--jetstream", "NEX", "--until", "0"], "--until must be at least 1"),
    (["--rate", "100", "--dump-events", "d.jsonl"], "--dump-events writes the generated events: it needs --events"),
    (["--events", "0"], "--events must be at least 1"),
    (["--events", "10", "--parallelism", "0"], "--parallelism must be at least 1"),
    (["--events", "ten"], "invalid int value"),
])
def test_bad_arguments_are_argparse_errors(args, message, tmp_path):
    with pytest.raises(ArtifactError, match=r"arguments rejected \(exit code 2\)") as rejected:
        load_pipeline(query("q0"), args + ["--output", str(tmp_path / "out.jsonl")])
    assert "usage: q0" in str(rejected.value) and message in str(rejected.value)


def test_blackhole_runs_a_query_without_an_output_and_excludes_one(tmp_path):
    TestRunner().run(query("q5"), EVENTS + ["--blackhole"])
    with pytest.raises(ArtifactError, match="not allowed with argument"):
        load_pipeline(query("q5"), EVENTS + ["--blackhole", "--output", str(tmp_path / "out.jsonl")])


def test_rate_alone_makes_an_endless_generator(tmp_path):
    pipeline = load_pipeline(query("q0"), ["--rate", "1000", "--output", str(tmp_path / "out.jsonl")])
    source = next(s for s in pipeline.steps if s.kind == "source").data_source
    assert source.events is None and source.config.rate == 1000


@pytest.mark.parametrize("name, seed", [("q3", 3), ("q4", 4), ("q5", 1), ("q7", 5), ("q8", 6), ("q9", 7), ("q11", 2)])
def test_killed_executors_roll_back_and_the_generator_replays_exactly(name, seed, inprocess, tmp_path):
    output, events = tmp_path / "out.jsonl", tmp_path / "events.jsonl"
    pipeline = load_pipeline(query(name), EVENTS + ["--output", str(output), "--dump-events", str(events)])
    engine = inprocess(pipeline, seed=seed, checkpoint_every=2, batch_records=100)
    engine.run(kill_executor_after_frames=[40, 150])
    assert engine.state.restarts == 2
    check(name, output, events)
