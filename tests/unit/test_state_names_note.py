"""The note about stateful steps with derived names: one line, once per pipeline, only for
the steps a changed pipeline would rename (derived names that share their base), pointing
at the user's own line that made each step."""

from __future__ import annotations

import json

import pytest

from gearbus import Pipeline
from gearbus.api.task import DataSink
from gearbus.artifact import load_artifact, load_local, pack
from gearbus.planner import fragile_state_steps, plan
from gearbus.runners import TestRunner

pytestmark = pytest.mark.unit

README_APP = '''from gearbus import Pipeline, TumblingWindows

def application(args):
    p = Pipeline("pageviews", parallelism=2)
    (p.read_jsonl(args[0], timestamp_fn=lambda e: e["ts"])
      .group_by(lambda e: e["member"])
      .window(TumblingWindows(10_000))
      .count()
      .write_jsonl(args[1]))
    return p
'''

TWO_COUNTS_APP = '''from gearbus import Pipeline, TumblingWindows

def application(args):
    p = Pipeline("two-counts", parallelism=2)
    events = p.read_jsonl(args[0], timestamp_fn=lambda e: e["ts"])
    per_member = events.group_by(lambda e: e["member"]).window(TumblingWindows(10_000)).count()
    overall = events.group_by(lambda e: "all").window(TumblingWindows(10_000)).count()
    per_member.merge(overall).write_jsonl(args[1])
    return p
'''


def _run(tmp_path, source: str, name: str, capsys) -> list[str]:
    """Run the app in ``source`` twice (each run plans it) and return the notes printed."""
    app = tmp_path / f"{name}.py"
    app.write_text(source)
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps({"member": m, "ts": i * 1000}) + "\n" for i, m in enumerate("abab")))
    for run in range(2):
        assert TestRunner().run(str(app), [str(events), str(tmp_path / f"out{run}.jsonl")]).state == "SUCCEEDED"
    return [line for line in capsys.readouterr().err.splitlines() if "derived names" in line]


def test_a_readme_style_app_gets_no_note(tmp_path, capsys):
    """One count, one source, one sink: no other step derives their names, so no change
    short of adding one more renames them."""
    assert _run(tmp_path, README_APP, "readme_app", capsys) == []


def test_two_counts_get_one_line_naming_the_users_lines_once(tmp_path, capsys):
    notes = _run(tmp_path, TWO_COUNTS_APP, "two_counts", capsys)
    assert len(notes) == 1, notes
    note = notes[0]
    assert note.startswith("gearbus: note: pipeline 'two-counts': ")
    assert "count (" in note and "two_counts.py:6)" in note and "count_1 (" in note and "two_counts.py:7)" in note
    assert "planner.py" not in note and "Warning" not in note and "Traceback" not in note


class Memory(DataSink):  # keeps nothing across a checkpoint
    def write(self, records):
        pass


def _counted(p: Pipeline, count_name: str | None = None):
    return p.from_collection([1, 2, 3], name="numbers").group_by(lambda v: v % 2).count(name=count_name)


def test_only_derived_names_that_share_their_base_are_fragile():
    alone = Pipeline("alone")
    _counted(alone).sink(Memory(), name="out")
    assert fragile_state_steps(alone, plan(alone)) == []

    beside_a_named = Pipeline("beside-a-named")
    named = _counted(beside_a_named, "count")
    derived = beside_a_named.from_collection([4], name="more").group_by(lambda v: v).count()
    named.merge(derived).sink(Memory(), name="out")
    # count_1 becomes count if the named one goes; both group_by steps hold a map-side combine's partials
    assert [s.name for s in fragile_state_steps(beside_a_named, plan(beside_a_named))] == \
        ["group_by", "group_by_1", "count_1"]

    stateless = Pipeline("stateless-family")
    numbers = stateless.from_collection([1], name="n")
    numbers.map(str).sink(Memory())
    numbers.map(repr).sink(Memory())
    assert fragile_state_steps(stateless, plan(stateless)) == []


def test_the_processes_that_run_the_app_do_not_say_it_again(tmp_path, capsys):
    """The AppMaster and every executor build the app from its artifact too: their logs
    would repeat the note once per process."""
    app = tmp_path / "two_counts_again.py"
    app.write_text(TWO_COUNTS_APP.replace('"two-counts"', '"two-counts-again"'))
    artifact, workdir = pack(str(app)), tmp_path / "work"
    workdir.mkdir()
    load_artifact(artifact.data, artifact.kind, artifact.entry, ["in.jsonl", "out.jsonl"], str(workdir))
    assert "derived names" not in capsys.readouterr().err
    load_local(str(app), ["in.jsonl", "out.jsonl"])
    assert "derived names" in capsys.readouterr().err
