"""The README's walk through an app that keeps running, as a user types it: a producer feeds
a JetStream stream, the app is submitted from the user's own directory with a relative
output path, then status, state, rescale, replace with the v2 file and kill, each the
command the README shows. The output must count every click exactly once throughout."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import sys

import pytest

from gearbus.client import Client
from shared import subjects
from shared.messages import AppState
from tests.support.cluster import wait_until
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


def readme_says(*fragments: str) -> None:
    with open(README, encoding="utf-8") as f:
        text = f.read()
    missing = [fragment for fragment in fragments if fragment not in text]
    assert not missing, f"the README no longer shows {missing}: keep it and this test in step"


@pytest.mark.timeout(240)
async def test_the_readme_unbounded_app(cluster, client: Client, tmp_path):
    readme_says("python examples/click_producer.py", "gearbus submit examples/clicks.py --output clicks.jsonl",
                "gearbus status 1", "gearbus state 1 count '\"u3\"'", "gearbus rescale 1 count=3",
                "gearbus replace 1 count examples/clicks_v2.py --output clicks.jsonl", "gearbus kill 1")
    home = tmp_path  # the user's directory: not the repository's, not the workers'
    os.symlink(EXAMPLES, home / "examples")
    env = dict(os.environ, GEARBUS_NATS_URL=cluster.url)
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
