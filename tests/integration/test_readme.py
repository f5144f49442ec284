"""The README's walk through an app that keeps running, as a user types it: a cluster started
by the README's own recipe (nats-server, a master, a worker: the lines of its code block, on
a free port), a producer feeding a JetStream stream, the app submitted from the user's own
directory with a relative output path, then status, state, rescale, replace with the v2
file and kill, each the command the README shows. The output must count every click
exactly once throughout."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from gearbus.client import Client
from gearbus.natsserver import free_port, wait_listening
from shared import subjects
from shared.messages import AppState
from tests.support.cluster import wait_for_workers, wait_until
from tests.support.files import read_jsonl
from tests.support.paths import EXAMPLES, REPO

CLICKS = 1500
README = os.path.join(REPO, "README.md")


async def command(cwd, env, *argv: str, timeout: float = 90) -> str:
    """Run a command of the README from the user's directory; its stdout, or the failure."""
    process = await asyncio.create_subprocess_exec(*argv, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode == 0, f"{' '.join(argv)} exited {process.returncode}:\n{err.decode()}"
    return out.decode()


def readme() -> str:
    with open(README, encoding="utf-8") as f:
        return f.read()


def readme_says(*fragments: str) -> None:
    missing = [fragment for fragment in fragments if fragment not in readme()]
    assert not missing, f"the README no longer shows {missing}: keep it and this test in step"


def cluster_recipe(port: int, store: str) -> list[list[str]]:
    """The commands of the README's code block that starts nats-server, as a fresh shell in
    the repository runs them (its comments dropped), on ``port`` and with the JetStream
    store in ``store``."""
    blocks = re.findall(r"```bash\n(.*?)```", readme(), re.S)
    recipe = next((b for b in blocks if "nats-server -js" in b), None)
    assert recipe, "the README has no code block starting a nats-server"
    commands = []
    for line in recipe.splitlines():
        line = line.split(" #")[0].strip().replace("4222", str(port)).replace("/tmp/gearbus-js", store)
        if line:
            commands.append(shlex.split(line))
    return commands


@contextlib.contextmanager
def started(commands: list[list[str]], port: int, logs):
    """Each command in the background, from the repository; stopped at the end."""
    processes = []
    try:
        for n, argv in enumerate(commands):
            with open(logs / f"recipe-{n}.log", "wb") as log:
                processes.append(subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
            if n == 0:  # the server first, as the user waits for its prompt
                wait_listening(processes[0], port, timeout=10)
        yield processes
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.mark.timeout(240)
async def test_the_readme_unbounded_app(tmp_path):
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    recipe = cluster_recipe(port, str(tmp_path / "jetstream"))
    assert [argv[0] for argv in recipe] == [".venv/bin/nats-server", ".venv/bin/python", ".venv/bin/python"]
    assert os.path.isfile(os.path.join(REPO, ".venv/bin/nats-server")), "the recipe's venv is not where the README says"
    with started(recipe, port, tmp_path):
        async with Client(url, timeout=30) as client:
            await wait_for_workers(client, 1)
            await walk_through(client, url, tmp_path)


async def walk_through(client: Client, url: str, tmp_path) -> None:
    readme_says("python examples/click_producer.py", "gearbus submit examples/clicks.py --output clicks.jsonl",
                "gearbus status 1", "gearbus state 1 count '\"u3\"'", "gearbus rescale 1 count=3",
                "gearbus replace 1 count examples/clicks_v2.py --output clicks.jsonl", "gearbus kill 1")
    home = tmp_path  # the user's directory: not the repository's, not the workers'
    os.symlink(EXAMPLES, home / "examples")
    env = dict(os.environ, GEARBUS_NATS_URL=url)
    gearbus = [sys.executable, "-m", "gearbus.cli"]

    producer = await asyncio.create_subprocess_exec(
        sys.executable, "examples/click_producer.py", "--rate", "150", "--count", str(CLICKS), cwd=home, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        app_id = int(await command(home, env, *gearbus, "submit", "examples/clicks.py", "--output", "clicks.jsonl"))
        output = home / "clicks.jsonl"

        async def rows_written():
            return output.exists() and len(read_jsonl(output)) > 0

        await wait_until(client, subjects.checkpoint_complete(app_id), rows_written, timeout=60)
        assert "ACTIVE" in await command(home, env, *gearbus, "status", str(app_id))
        held = json.loads(await command(home, env, *gearbus, "state", str(app_id), "count", '"u3"', "--json"))
        assert held, "gearbus state showed nothing for a user who clicked"

        await command(home, env, *gearbus, "rescale", str(app_id), "count=3")
        await command(home, env, *gearbus, "replace", str(app_id), "count", "examples/clicks_v2.py",
                      "--output", "clicks.jsonl")
        out, err = await asyncio.wait_for(producer.communicate(), 60)
        assert producer.returncode == 0, err.decode()
        assert f"published {CLICKS} clicks" in out.decode()

        async def all_counted():
            return len(read_jsonl(output)) >= CLICKS

        await wait_until(client, subjects.checkpoint_complete(app_id), all_counted, timeout=60)
        await command(home, env, *gearbus, "kill", str(app_id))
    finally:
        if producer.returncode is None:
            producer.kill()
            await producer.wait()

    rows = read_jsonl(output)
    per_user = collections.defaultdict(list)
    for row in rows:
        per_user[row["user"]].append(row["clicks"])
    assert len(rows) == CLICKS, f"{len(rows)} rows for {CLICKS} clicks"
    for user, counts in per_user.items():
        assert sorted(counts) == list(range(1, len(counts) + 1)), f"{user}'s counts are not 1..n once each"
    assert {row["version"] for row in rows} == {1, 2}, "the replacement's rows are missing"
    assert (await client.wait(app_id, timeout=30)).state == AppState.TERMINATED
