"""The dashboard's REST API and /metrics against a real cluster running apps, read as an HTTP
client and a Prometheus scraper would."""

from __future__ import annotations

import asyncio
import sys
import time

from prometheus_client.parser import text_string_to_metric_families

from gearbus.artifact import pack
from shared.messages import AppState
from tests.support.cluster import wait_state
from tests.support.dashboard import Dashboard
from tests.support.paths import REPO, TICKER, WORDCOUNT
from tests.support.wordcount import CORPUS_LINES, write_corpus


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_rest_api_and_metrics_show_what_the_apps_did(cluster, client, tmp_path):
    text, output = tmp_path / "text.txt", tmp_path / "counts.jsonl"
    words = write_corpus(text)
    done = await client.submit(pack(WORDCOUNT), ["--input", str(text), "--output", str(output),
                                                 "--combine-keys", "1"])
    assert (await client.wait(done, timeout=60)).state == AppState.SUCCEEDED
    running = await client.submit(pack(TICKER), ["--output", str(tmp_path / "ticks.jsonl"), "--rate", "200"])
    await wait_state(client, running, AppState.ACTIVE)

    async with Dashboard(cluster.url) as dashboard:
        status, body = await dashboard.json("GET", "/api/v1/cluster")
        assert status == 200 and body["leader"] in body["masters"]
        assert len(body["workers"]) == 2 and body["slots"] == 8
        assert body["apps_by_state"]["SUCCEEDED"] == 1 and body["apps_by_state"]["ACTIVE"] == 1
        status, masters = await dashboard.json("GET", "/api/v1/masters")
        assert [m["leader"] for m in masters] == [True]
        status, apps = await dashboard.json("GET", "/api/v1/apps")
        assert {a["app_id"]: a["state"] for a in apps} == {done: "SUCCEEDED", running: "ACTIVE"}

        status, app = await dashboard.json("GET", f"/api/v1/apps/{done}")
        assert status == 200 and app["error"] is None and app["guarantee"] == "exactly-once"
        split, count, write = app["processors"]
        assert split["records_in"] == CORPUS_LINES and count["records_in"] == split["records_out"]
        assert write["records_in"] == len(words)
        assert [p["name"] for p in app["dag"]["processors"]] == [split["name"], count["name"], write["name"]]
        status, task = await dashboard.json("GET", f"/api/v1/apps/{done}/tasks/2/0")
        assert status == 200 and task["records_in"] == len(words) and task["finished"] is True
        status, processor = await dashboard.json("GET", f"/api/v1/apps/{done}/processors/1")
        assert processor == count
        status, checkpoints = await dashboard.json("GET", f"/api/v1/apps/{done}/checkpoints")
        assert checkpoints["completed"] >= 1
        history = checkpoints["history"]
        assert 1 <= len(history) <= 20 and [c["checkpoint_id"] for c in history] == sorted(
            c["checkpoint_id"] for c in history)
        last = history[-1]  # the final checkpoint: every task's snapshot after its end
        assert last["status"] == "completed" and last["checkpoint_id"] == checkpoints["last_id"]
        assert last["size_bytes"] == checkpoints["last_size_bytes"] == sum(p["size_bytes"] for p in last["processors"])
        assert {p["processor"]: p["tasks"] for p in last["processors"]} == {
            p["id"]: p["parallelism"] for p in app["dag"]["processors"]}
        assert app["submitted_ms"] <= last["trigger_ms"] <= app["finished_ms"]
        assert last["duration_ms"] >= 0 and last["alignment_ms"] >= 0 and last["failure"] == ""

        async def ticking(since: int) -> int:
            async with asyncio.timeout(30):
                while True:
                    status, numbers = await dashboard.json("GET", f"/api/v1/apps/{running}/processors/0")
                    # 404 until the AppMaster's first heartbeat with metrics
                    if status == 200 and numbers["records_out"] > since and numbers["records_out_per_s"] > 0:
                        return numbers["records_out"]
                    await asyncio.sleep(0.2)

        first = await ticking(0)
        assert await ticking(first) > first  # live figures move

        status, body, kind = await dashboard.request("GET", "/metrics")
        assert status == 200 and kind.startswith("text/plain")
        scraped = samples(body.decode())
        key = frozenset({"app": str(done), "app_name": "wordcount", "processor": "write", "task": "0"}.items())
        assert scraped[("gearbus_task_records_in_total", key)] == len(words)
        assert scraped[("gearbus_task_batch_seconds_count", key)] > 0
        assert scraped[("gearbus_apps", frozenset({"state": "ACTIVE"}.items()))] == 1
        assert sum(v for (name, _), v in scraped.items() if name == "gearbus_master_leader") == 1
        app_key = frozenset({"app": str(done), "app_name": "wordcount"}.items())
        assert scraped[("gearbus_app_last_checkpoint_id", app_key)] == last["checkpoint_id"]
        assert scraped[("gearbus_app_last_checkpoint_alignment_seconds", app_key)] == last["alignment_ms"] / 1000
        per_processor = {dict(labels)["processor"]: value for (name, labels), value in scraped.items()
                         if name == "gearbus_processor_last_checkpoint_size_bytes" and dict(labels)["app"] == str(done)}
        assert per_processor == {p["name"]: sum(c["size_bytes"] for c in last["processors"] if c["processor"] == p["id"])
                                 for p in app["dag"]["processors"]}

        status, spec = await dashboard.json("GET", "/openapi.json")
        assert "/api/v1/apps/{app_id}" in spec["paths"] and "post" in spec["paths"]["/api/v1/apps/{app_id}/kill"]

        status, killed = await dashboard.json("POST", f"/api/v1/apps/{running}/kill")
        assert status == 200 and killed["state"] == AppState.TERMINATED
        await wait_state(client, running, AppState.TERMINATED)
        status, again = await dashboard.json("POST", f"/api/v1/apps/{running}/kill")
        assert status == 409 and "already" in again["error"]


async def test_bad_requests_get_clear_errors(cluster):
    async with Dashboard(cluster.url) as dashboard:
        status, body = await dashboard.json("GET", "/api/v1/apps/999")
        assert status == 404 and "999" in body["error"]
        status, body = await dashboard.json("GET", "/api/v1/apps/abc")
        assert status == 400 and "app_id" in body["error"]
        status, body = await dashboard.json("GET", "/api/v1/workers/nobody")
        assert status == 404 and "nobody" in body["error"]
        status, body = await dashboard.json("GET", "/api/v1/apps/1/kill")
        assert status == 405  # kill is POST only


async def test_a_dashboard_without_nats_fails_fast_and_one_that_loses_it_says_so(cluster):
    """Without NATS it exits once its --connect-timeout is over (as every role; the retries
    themselves: test_role_environment)."""
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.dashboard", "--nats", "nats://127.0.0.1:1", "--port", "0",
        "--connect-timeout", "1", cwd=REPO, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(process.communicate(), 15)
    assert process.returncode == 1 and "nats://127.0.0.1:1" in err.decode()
    assert time.monotonic() - started < 10

    async with Dashboard(cluster.url) as dashboard:
        assert (await dashboard.json("GET", "/api/v1/cluster"))[0] == 200
        await asyncio.to_thread(cluster.nats.stop)
        status, body = await dashboard.json("GET", "/api/v1/cluster")
        assert status == 503 and body["error"].startswith("cluster unreachable")
        await asyncio.to_thread(cluster.nats.start)
        async with asyncio.timeout(30):  # the connection and the master come back: so do the answers
            while (await dashboard.json("GET", "/api/v1/cluster"))[0] != 200:
                await asyncio.sleep(0.2)
