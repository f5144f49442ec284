"""Joins and keyed state on a real cluster: exact results of interval and window joins
and a running total per key, and the live size of keyed state in the app's status, the
dashboard's /metrics and ``gearbus status``."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

from gearbus.artifact import pack
from shared.messages import AppState
from tests.support.cluster import wait_state
from tests.support.dashboard import Dashboard
from tests.support.files import read_jsonl, write_jsonl
from tests.support.paths import APPS, REPO

ORDERS = os.path.join(APPS, "orders.py")
KEYED_COUNTS = os.path.join(APPS, "keyed_counts.py")


def jittered(events: list[dict], rng: random.Random) -> list[dict]:
    """In time order, moved by less than the app's 100 ms of out-of-orderness."""
    return sorted(events, key=lambda e: e["t"] + rng.randrange(100))


async def test_joins_and_keyed_state_give_exact_results_on_the_cluster(client, tmp_path):
    rng = random.Random(7)
    orders = [{"order": i, "customer": i % 13, "t": 1_000_000 + i * 37} for i in range(600)]
    payments = [{"payment": f"p{i}", "order": o["order"], "amount": 1 + i % 9, "t": o["t"] + rng.randrange(-200, 1300)}
                for i, o in enumerate(orders * 2) if rng.random() < 0.7]
    shipments = [{"shipment": f"s{i}", "order": o["order"], "t": o["t"] + rng.randrange(0, 900)}
                 for i, o in enumerate(orders) if rng.random() < 0.6]
    paths = [write_jsonl(tmp_path / f"{name}.jsonl", jittered(events, rng))
             for name, events in (("orders", orders), ("payments", payments), ("shipments", shipments))]
    app_id = await client.submit(pack(ORDERS), [*paths, str(tmp_path)])
    final = await client.wait(app_id, timeout=90)
    assert final.state == AppState.SUCCEEDED, final.error

    by_order = {o["order"]: o for o in orders}
    paid = [(p["order"], p["payment"]) for p in payments if 0 <= p["t"] - by_order[p["order"]]["t"] <= 1000]
    assert Counter(map(tuple, read_jsonl(tmp_path / "paid.jsonl"))) == Counter(paid)

    shipped = Counter()
    for o in orders:
        same_window = [s["shipment"] for s in shipments
                       if s["order"] == o["order"] and s["t"] // 1000 == o["t"] // 1000]
        shipped.update((o["order"], s) for s in same_window or [None])
    assert Counter(map(tuple, read_jsonl(tmp_path / "shipped.jsonl"))) == shipped

    # A running total: each customer's totals are the prefix sums of its amounts, in some order.
    totals: dict[int, list[int]] = {}
    for row in read_jsonl(tmp_path / "totals.jsonl"):
        totals.setdefault(row["customer"], []).append(row["total"])
    amounts: dict[int, int] = Counter()
    payment_count: dict[int, int] = Counter()
    for order, payment in paid:
        customer = by_order[order]["customer"]
        amounts[customer] += next(p["amount"] for p in payments if p["payment"] == payment)
        payment_count[customer] += 1
    assert {c: (len(v), max(v)) for c, v in totals.items()} == {c: (payment_count[c], amounts[c]) for c in amounts}
    assert all(sorted(v) == v or len(set(v)) == len(v) for v in totals.values())

    join = next(p for p in final.processors if p.name == "paid")
    assert join.state_keys == 0 and join.finished_tasks == 2  # the final watermark emptied the join's state


async def test_live_keyed_state_is_counted_in_status_metrics_and_the_cli(cluster, client, tmp_path):
    app_id = await client.submit(pack(KEYED_COUNTS), ["50", str(tmp_path / "counts.jsonl")])
    await wait_state(client, app_id, AppState.ACTIVE)
    async with asyncio.timeout(30):
        while True:
            app = await client.status(app_id)
            counting = [p for p in app.processors if p.name.startswith("count")]
            if counting and counting[0].state_keys == 50:
                break
            await asyncio.sleep(0.2)
    assert counting[0].state_bytes > 0

    async with Dashboard(cluster.url) as dashboard:
        status, body, _ = await dashboard.request("GET", "/metrics")
    assert status == 200
    state = {s.name: s.value for family in text_string_to_metric_families(body.decode())
             for s in family.samples if s.labels.get("app") == str(app_id) and s.labels.get("processor", "").startswith("count")
             and s.name.startswith("gearbus_state_")}
    assert state["gearbus_state_keys"] == 50 and state["gearbus_state_bytes"] > 0

    shown = subprocess.run([sys.executable, "-m", "gearbus.cli", "status", str(app_id), "--nats", cluster.url],
                           capture_output=True, text=True, cwd=REPO, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert any("state 50 keys" in line for line in shown.stdout.splitlines()), shown.stdout
    await client.kill(app_id)
