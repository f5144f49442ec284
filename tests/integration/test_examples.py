"""Every example on every runner, with outputs checked against an independent
computation written here (not with gearbus)."""

from __future__ import annotations

import collections
import os
import random

import pytest

from gearbus.runners import ClusterRunner, LocalRunner, TestRunner
from shared.messages import AppState
from gearbus.client import Client
from tests.support.cluster import wait_for_workers
from tests.support.examples import (
    clicks,
    expected_pageviews,
    expected_sensors,
    expected_sessions,
    pageview_events,
    sensor_readings,
)
from tests.support.files import canonical, read_jsonl, write_jsonl
from tests.support.paths import EXAMPLES
from tests.support.services import CustomerService, expected_enriched, orders

RUNNERS = ["test", "local", "cluster"]


async def run_example(runner: str, example: str, args: list[str], request) -> None:
    path = os.path.join(EXAMPLES, example)
    if runner == "test":
        result = TestRunner().run(path, args)
        assert result.succeeded
        return
    if runner == "local":
        chosen = LocalRunner(workers=2)
    else:
        cluster = request.getfixturevalue("cluster_factory")(workers=2)
        async with Client(cluster.url, timeout=30) as client:
            await wait_for_workers(client, 2)
        chosen = ClusterRunner(cluster.url)
    try:
        await chosen.start(path, args)
        final = await chosen.wait(timeout=60)
    finally:
        await chosen.stop()
    assert final.state == AppState.SUCCEEDED, final.error


# --- pageviews --------------------------------------------------------------------


@pytest.mark.parametrize("runner", RUNNERS)
async def test_pageviews(runner, tmp_path, request):
    events = pageview_events(3000)
    source, output = write_jsonl(tmp_path / "events.jsonl", events), tmp_path / "out.jsonl"
    await run_example(runner, "pageviews.py", ["--input", source, "--output", str(output)], request)
    rows = read_jsonl(output)
    assert canonical(rows) == canonical(expected_pageviews(events))
    per_window = collections.defaultdict(int)
    for r in rows:
        per_window[(r["member"], r["window_start"])] += r["count"]
    assert sum(per_window.values()) == len(events)


# --- sensors ----------------------------------------------------------------------


@pytest.mark.parametrize("runner", RUNNERS)
async def test_sensors(runner, tmp_path, request):
    readings = sensor_readings()
    source, output, late = write_jsonl(tmp_path / "r.jsonl", readings), tmp_path / "avg.jsonl", tmp_path / "late.jsonl"
    await run_example(runner, "sensors.py", ["--input", source, "--output", str(output), "--max-delay-ms", "5000",
                                             "--allowed-lateness-ms", "60000", "--late-output", str(late),
                                             "--batch-records", "200"], request)
    rows, dropped = expected_sensors(readings, 5000, 60_000, 200)
    assert dropped and any(r["timing"] == "late" for r in rows)  # the data exercises both paths
    got = read_jsonl(output)
    for row in got:
        row["avg"] = round(row["avg"], 6)
    assert canonical(got) == canonical(rows)
    late_rows = [row for name in sorted(os.listdir(tmp_path)) if name.startswith("late")
                 for row in read_jsonl(tmp_path / name)]
    assert canonical(late_rows) == canonical(dropped)


# --- sessions ---------------------------------------------------------------------


@pytest.mark.parametrize("runner", RUNNERS)
async def test_sessions(runner, tmp_path, request):
    events = clicks()
    source, output = write_jsonl(tmp_path / "clicks.jsonl", events), tmp_path / "sessions.jsonl"
    await run_example(runner, "sessions.py", ["--input", source, "--output", str(output)], request)
    assert canonical(read_jsonl(output)) == canonical(expected_sessions(events, 30_000))


# --- wordcount --------------------------------------------------------------------


@pytest.mark.parametrize("runner", RUNNERS)
async def test_wordcount(runner, tmp_path, request):
    rng = random.Random(23)
    words = [f"w{i}" for i in range(300)] + ["naïve", "日本語", "😀"]
    lines = [" ".join(rng.choices(words, k=rng.randint(0, 15))) for _ in range(20_000)] + ["", "  "]
    source, output = tmp_path / "in.txt", tmp_path / "out.jsonl"
    source.write_text("\n".join(lines), encoding="utf-8")
    await run_example(runner, "wordcount.py", ["--input", str(source), "--output", str(output),
                                               "--combine-keys", "50"], request)
    expected = collections.Counter(w for line in lines for w in line.split())
    assert canonical(read_jsonl(output)) == canonical([{"word": w, "count": n} for w, n in expected.items()])


# --- enrich (map_async calling a service) -------------------------------------------


@pytest.mark.parametrize("runner", RUNNERS)
async def test_enrich(runner, tmp_path, request, nats_server):
    items = orders(3000)
    source, output = write_jsonl(tmp_path / "orders.jsonl", items), tmp_path / "enriched.jsonl"
    with CustomerService(nats_server.url) as service:
        await run_example(runner, "enrich.py", ["--input", source, "--output", str(output), "--nats", nats_server.url,
                                                "--concurrency", "20"], request)
    assert canonical(read_jsonl(output)) == canonical(expected_enriched(items))
    assert service.requests >= len(items)
