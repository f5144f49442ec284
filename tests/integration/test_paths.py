"""Relative file paths on a real cluster mean the submitter's directory, not the workers':
an app submitted (``gearbus submit``, ``gearbus run --runner cluster``) from a directory
other than the one the workers run in reads its input and writes its output there, exact;
an unbounded app's output lands there too; `gearbus status` shows the absolute paths; an
input no worker can read fails the app naming the step, the path and the worker."""

from __future__ import annotations

import json
import os
import uuid

import pytest

from gearbus.artifact import pack
from shared.messages import AppState
from tests.support.cli import gearbus
from tests.support.files import read_jsonl, write_jsonl
from tests.support.paths import TICKER
from tests.support.ticker import read_ticks, wait_for_ticks

APP = """
from gearbus import Pipeline


def application(args):
    p = Pipeline("doubling")
    p.read_jsonl(args[0], name="numbers").map(lambda n: 2 * n, name="double").write_jsonl(args[1], name="doubled")
    return p
"""
NUMBERS = list(range(500))


@pytest.fixture
def user(tmp_path):
    """The submitter's directory (not the workers': they run in this process's), holding the
    app and its input; outputs get names no other test uses, to look for them in the workers'."""
    directory = tmp_path / "user"
    directory.mkdir()
    (directory / "doubling.py").write_text(APP)
    write_jsonl(directory / "in.jsonl", NUMBERS)
    assert os.path.realpath(os.getcwd()) != os.path.realpath(directory)
    return directory


def output_name() -> str:
    return f"doubled-{uuid.uuid4().hex}.jsonl"


def only_in(directory, relative: str) -> list:
    """The rows of ``relative`` in ``directory``, after checking the workers' directory has no such file."""
    assert not os.path.exists(relative), f"{relative} was written in the workers' directory {os.getcwd()}"
    return read_jsonl(directory / relative)


async def test_gearbus_submit_reads_and_writes_in_the_submitters_directory(shared_cluster, shared_client, user):
    out = os.path.join("out", output_name())  # a directory that does not exist yet
    code, stdout, err = await gearbus("submit", "--nats", shared_cluster.url, "--json", "doubling.py", "in.jsonl", out,
                                      cwd=user)
    assert code == 0, err
    app_id = json.loads(stdout)["app_id"]
    summary = await shared_client.wait(app_id, timeout=60)
    assert summary.state == AppState.SUCCEEDED, summary.error
    assert sorted(only_in(user, out)) == [2 * n for n in NUMBERS]

    code, shown, err = await gearbus("status", "--nats", shared_cluster.url, str(app_id))
    assert code == 0, err
    assert f"file of step numbers: {user / 'in.jsonl'}" in shown
    assert f"file of step doubled: {user / out}" in shown


async def test_gearbus_run_on_the_cluster_reads_and_writes_in_the_submitters_directory(shared_cluster, user):
    out = output_name()
    code, stdout, err = await gearbus("run", "--runner", "cluster", "--nats", shared_cluster.url, "--json",
                                      "doubling.py", "in.jsonl", out, cwd=user)
    assert code == 0, err
    assert json.loads(stdout)["state"] == AppState.SUCCEEDED
    assert sorted(only_in(user, out)) == [2 * n for n in NUMBERS]


async def test_an_unbounded_apps_output_lands_in_the_submitters_directory(shared_cluster, shared_client, user):
    out = f"ticks-{uuid.uuid4().hex}.jsonl"
    code, stdout, err = await gearbus("submit", "--nats", shared_cluster.url, "--json", TICKER, "--output", out,
                                      cwd=user)
    assert code == 0, err
    app_id = json.loads(stdout)["app_id"]
    try:
        await wait_for_ticks(shared_client, user / out, beyond=20, timeout=60)
    finally:
        await shared_client.kill(app_id)
    assert not os.path.exists(out), f"{out} was written in the workers' directory {os.getcwd()}"


async def test_an_input_no_worker_can_read_fails_the_app_naming_the_step_the_path_and_the_worker(shared_client,
                                                                                                 tmp_path):
    app = tmp_path / "doubling.py"
    app.write_text(APP)
    missing = f"missing-{uuid.uuid4().hex}.jsonl"
    app_id = await shared_client.submit(pack(str(app)), [missing, output_name()], config={"max_restarts": 1})
    summary = await shared_client.wait(app_id, timeout=60)
    assert summary.state == AppState.FAILED
    message = summary.error.message
    # submitted from this process's directory: the path is in it, on whichever worker ran the task
    assert f"step 'numbers' cannot read {os.path.join(os.getcwd(), missing)} on worker worker-" in message, message
    assert "(host " in message and "No such file or directory" in message, message


async def test_gearbus_replace_from_the_submitters_directory_keeps_the_sinks_file(shared_cluster, shared_client,
                                                                                  user):
    """The new code's sink is the one file, so it takes over the running one's state (a
    sink restored with another path's state refuses it, and the replacement rolls back)."""
    url, out = shared_cluster.url, f"ticks-{uuid.uuid4().hex}.jsonl"
    code, stdout, err = await gearbus("submit", "--nats", url, "--json", TICKER, "--output", out, cwd=user)
    assert code == 0, err
    app_id = json.loads(stdout)["app_id"]
    try:
        await wait_for_ticks(shared_client, user / out, beyond=20, timeout=60)
        code, _, err = await gearbus("replace", "--nats", url, str(app_id), "write", TICKER, "--output", out, cwd=user)
        assert code == 0, err
        assert [v.version for v in (await shared_client.status(app_id)).versions if v.state == "running"][-1] == 2
        ticks = await wait_for_ticks(shared_client, user / out, beyond=max(read_ticks(user / out)) + 20, timeout=60)
    finally:
        await shared_client.kill(app_id)
    assert len(ticks) == len(set(ticks))  # each once, through the takeover
