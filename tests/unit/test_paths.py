"""One meaning for a relative file path: the directory of whoever submitted the app. The
client builds the pipeline in its own directory; a process that rebuilds it from the
artifact elsewhere builds it as if there (the submission carries the directory); the plan
and `gearbus status` show the absolute paths; a file a task cannot open fails it naming
the step, the path and the worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gearbus import JsonLinesSink, JsonLinesSource, Pipeline, TextFileSource, submitter_path
from gearbus.api.paths import submitted_from
from gearbus.api.task import TaskContext
from gearbus.artifact import load_artifact, pack
from gearbus.cli import format_status
from gearbus.planner import describe, plan
from gearbus.runners import TestRunner
from shared.messages import AppDag, AppState, AppSummary, ProcessorInfo
from tests.support.files import read_jsonl, write_jsonl

APP = """
from gearbus import Pipeline


def application(args):
    p = Pipeline("doubling")
    p.read_jsonl(args[0], name="numbers").map(lambda n: 2 * n, name="double").write_jsonl(args[1], name="doubled")
    return p
"""
WORKER = "worker worker-7 (host node-a)"


@pytest.fixture
def user(tmp_path, monkeypatch):
    """The submitter's directory with an input in it; the test runs elsewhere."""
    directory = tmp_path / "user"
    directory.mkdir()
    write_jsonl(directory / "in.jsonl", range(10))
    (directory / "doubling.py").write_text(APP)
    elsewhere = tmp_path / "worker"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return directory


def test_a_relative_path_is_taken_in_this_directory_or_the_submitters(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert TextFileSource("in.txt").path == str(tmp_path / "in.txt")
    assert JsonLinesSink("out/../counts.jsonl").path == str(tmp_path / "counts.jsonl")
    with submitted_from("/home/ann/project"):
        assert JsonLinesSource("data/in.jsonl").path == "/home/ann/project/data/in.jsonl"
        assert JsonLinesSink("/srv/out.jsonl").path == "/srv/out.jsonl"  # an absolute path stays
        assert submitter_path("notes.txt") == "/home/ann/project/notes.txt"
    assert submitter_path("notes.txt") == str(tmp_path / "notes.txt")


def test_an_app_rebuilt_from_its_artifact_elsewhere_reads_and_writes_in_the_submitters_directory(user, tmp_path):
    artifact = pack(str(user / "doubling.py"))
    workdir = tmp_path / "artifact"
    workdir.mkdir()
    app = load_artifact(artifact.data, artifact.kind, artifact.entry, ["in.jsonl", "out/doubled.jsonl"],
                        str(workdir), submitter_dir=str(user))
    files = {step: path for p in describe(app)["processors"] for step, path in p.get("files", {}).items()}
    assert files == {"numbers": str(user / "in.jsonl"), "doubled": str(user / "out" / "doubled.jsonl")}
    assert TestRunner().run(app).succeeded
    assert sorted(read_jsonl(user / "out" / "doubled.jsonl")) == [2 * n for n in range(10)]
    assert os.listdir(os.getcwd()) == []  # nothing where the rebuilding process runs


def test_a_file_step_made_at_the_top_of_the_module_is_in_the_submitters_directory_too(user, tmp_path):
    (user / "top.py").write_text(
        "from gearbus import JsonLinesSink, Pipeline\n"
        "SINK = JsonLinesSink('out.jsonl')\n"
        "def application(args):\n"
        "    p = Pipeline('top')\n"
        "    p.from_collection([1], name='one').sink(SINK, name='out')\n"
        "    return p\n")
    artifact = pack(str(user / "top.py"))
    workdir = tmp_path / "artifact-top"
    workdir.mkdir()
    app = load_artifact(artifact.data, artifact.kind, artifact.entry, [], str(workdir), submitter_dir=str(user))
    files = {step: path for p in describe(app)["processors"] for step, path in p.get("files", {}).items()}
    assert files == {"out": str(user / "out.jsonl")}


def test_the_test_runner_takes_relative_paths_in_the_directory_it_runs_in(user, monkeypatch):
    monkeypatch.chdir(user)
    assert TestRunner().run("doubling.py", ["in.jsonl", "doubled.jsonl"]).succeeded
    assert sorted(read_jsonl(user / "doubled.jsonl")) == [2 * n for n in range(10)]


def test_gearbus_plan_shows_the_absolute_paths(user):
    done = subprocess.run([sys.executable, "-m", "gearbus.cli", "plan", "doubling.py", "in.jsonl", "out.jsonl"],
                          cwd=user, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (processor,) = json.loads(done.stdout)["processors"]
    assert processor["files"] == {"numbers": str(user / "in.jsonl"), "doubled": str(user / "out.jsonl")}


def test_gearbus_status_shows_each_steps_file():
    dag = AppDag([ProcessorInfo(0, "numbers+double", 2, "ChainSourceTask", {"numbers": "/home/ann/in.jsonl"}),
                  ProcessorInfo(1, "doubled", 1, "ChainTask", {"doubled": "/home/ann/out.jsonl"})])
    shown = format_status(AppSummary(app_id=3, name="doubling", state=AppState.ACTIVE, submitted_ms=0,
                                     dag=dag)).splitlines()
    assert "  file of step numbers: /home/ann/in.jsonl" in shown
    assert "  file of step doubled: /home/ann/out.jsonl" in shown


def context(pipeline: Pipeline, worker: str = WORKER, processor: int = 0) -> TaskContext:
    return TaskContext(1, pipeline.name, plan(pipeline, "test").graph.processors[processor], 0, 0, worker=worker)


def test_an_input_a_worker_cannot_read_names_the_step_the_path_and_the_worker(tmp_path):
    missing = tmp_path / "missing.jsonl"
    p = Pipeline("reading")
    p.read_jsonl(str(missing), name="numbers").map(abs, name="positive").write_jsonl(str(tmp_path / "o"), name="o")
    with pytest.raises(FileNotFoundError) as raised:
        TextFileSource(missing).open(context(p))
    assert str(raised.value) == f"step 'numbers' cannot read {missing} on {WORKER}: No such file or directory"
    with pytest.raises(IsADirectoryError) as raised:
        TextFileSource(tmp_path).open(context(p))
    assert str(raised.value) == f"step 'numbers' cannot read {tmp_path} on {WORKER}: Is a directory"


def test_the_test_runner_reports_an_unreadable_input_naming_the_step_and_the_path(tmp_path):
    missing = tmp_path / "missing.txt"
    p = Pipeline("reading")
    p.read_text(str(missing), name="lines").write_jsonl(str(tmp_path / "out.jsonl"), name="copy")
    result = TestRunner().run(p, raise_on_failure=False)
    assert f"step 'lines' cannot read {missing}: No such file or directory" in result.error.message


def test_a_sink_makes_its_missing_directory_and_names_the_step_when_it_cannot(tmp_path):
    p = Pipeline("writing")
    p.from_collection([1], name="one").write_jsonl(str(tmp_path / "new" / "dir" / "out.jsonl"), name="kept")
    sink = plan(p, "test").graph.processors[0].config["ops"][-1].data_sink
    sink.open(context(p))
    sink.close()
    assert (tmp_path / "new" / "dir" / "out.jsonl").exists()

    (tmp_path / "a_file").write_text("")
    blocked = tmp_path / "a_file" / "out.jsonl"
    p = Pipeline("writing")
    p.from_collection([1], name="one").write_jsonl(str(blocked), name="kept")
    sink = plan(p, "test").graph.processors[0].config["ops"][-1].data_sink
    with pytest.raises(FileExistsError) as raised:
        sink.open(context(p))
    assert str(raised.value).startswith(f"step 'kept' cannot write {blocked} on {WORKER}: ")
