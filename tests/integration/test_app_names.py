"""An application named like a framework package (gearbus, services, shared) cannot stand
in for the framework on a real cluster: the command line and the ClusterRunner refuse it
before anything is uploaded, the master refuses it from any client, and a zip that holds
a framework package beside the app fails to load, naming it, instead of shadowing it. A
user's own ``services`` or ``shared`` folder where gearbus starts is not the framework's
either: the roles start with the working directory off their import path."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from gearbus.artifact import Artifact, ArtifactError
from gearbus.runners import ClusterRunner
from shared.bus import RemoteError
from shared.messages import AppState
from tests.support.cli import gearbus
from tests.support.files import zipped

APP = """
from gearbus import Pipeline


def application(args):
    p = Pipeline("numbers")
    p.from_collection(range(10), name="numbers").write_jsonl(args[0], name="out")
    return p
"""
CLASH = "the application name 'shared' clashes with gearbus's own package 'shared'"


async def test_an_app_package_named_shared_is_refused_at_submit(cluster, client, tmp_path):
    app = tmp_path / "shared"
    app.mkdir()
    (app / "__init__.py").write_text(APP)
    out = str(tmp_path / "out.jsonl")

    code, _, err = await gearbus("submit", "--nats", cluster.url, str(app), out)
    assert code == 2 and CLASH in err, err

    runner = ClusterRunner(cluster.url)
    with pytest.raises(ArtifactError, match=CLASH):
        await runner.start(str(app), [out])
    await runner.stop()

    with pytest.raises(RemoteError, match="SubmitApplication.entry 'shared' clashes with gearbus's own package") as refused:
        await client.submit(Artifact(zipped({"shared/__init__.py": APP}), "zip", "shared"), [out])
    assert refused.value.code == "bad_request"
    assert await client.list() == []


async def test_a_zip_holding_a_framework_package_fails_to_load_naming_it(client, tmp_path):
    data = zipped({"numbers_app/__init__.py": APP, "shared/__init__.py": "raise SystemExit('shadowed')\n"})
    app_id = await client.submit(Artifact(data, "zip", "numbers_app"), [str(tmp_path / "out.jsonl")])
    summary = await client.wait(app_id, timeout=60)
    assert summary.state == AppState.FAILED, summary
    assert summary.error.error_type == "ArtifactError", summary.error
    assert "artifact zip member 'shared/__init__.py'" in summary.error.message and CLASH in summary.error.message
    assert not (tmp_path / "out.jsonl").exists()


async def test_user_folders_named_like_the_framework_where_gearbus_runs_stay_the_users(tmp_path):
    project = tmp_path / "project"
    for name in ("services", "shared"):
        (project / name).mkdir(parents=True)
        (project / name / "__init__.py").write_text("raise SystemExit('the user package shadowed the framework')\n")
    (project / "numbers_app.py").write_text(APP)
    gearbus_command = os.path.join(os.path.dirname(sys.executable), "gearbus")
    process = await asyncio.create_subprocess_exec(
        gearbus_command, "run", "--json", "numbers_app.py", "out.jsonl", cwd=project,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode == 0, err.decode()
    assert json.loads(out)["state"] == AppState.SUCCEEDED
    assert sorted(json.loads(line) for line in (project / "out.jsonl").read_text().splitlines()) == list(range(10))
