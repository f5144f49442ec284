"""map_async on a real cluster, calling a service started here: unordered results with a
timeout that gives a default, a call that fails the app naming the step and record, and
orders read from JetStream staying exact through a killed executor (the ordered run from
a file is examples/enrich.py's, in test_examples)."""

from __future__ import annotations

import json
import os

import nats
import pytest

from gearbus.artifact import pack
from shared.messages import AppState
from tests.support.files import canonical, read_jsonl, write_jsonl
from tests.support.paths import EXAMPLES
from tests.support.cluster import kill_an_executor_after_a_checkpoint, wait_state
from tests.support.services import CustomerService, customer, expected_enriched, orders

ENRICH = os.path.join(EXAMPLES, "enrich.py")
SLOW = frozenset({4, 11})


async def test_unordered_calls_with_a_timeout_and_a_failing_call(client, nats_server, tmp_path):
    items = orders(1500)
    source, output = write_jsonl(tmp_path / "orders.jsonl", items), tmp_path / "enriched.jsonl"
    args = ["--input", source, "--nats", nats_server.url, "--concurrency", "50"]
    with CustomerService(nats_server.url, slow=SLOW):
        app_id = await client.submit(pack(ENRICH), args + ["--output", str(output), "--unordered",
                                                           "--timeout-ms", "500"])
        final = await client.wait(app_id, timeout=60)
    assert final.state == AppState.SUCCEEDED, final.error
    expected = [{**o, "customer": None if o["customer"] in SLOW else customer(str(o["customer"]))} for o in items]
    assert canonical(read_jsonl(output)) == canonical(expected)

    app_id = await client.submit(pack(ENRICH), args + ["--output", str(tmp_path / "never.jsonl"),
                                                       "--service", "nobody.answers"])
    final = await client.wait(app_id, timeout=60)
    assert final.state == AppState.FAILED
    assert final.error.error_type == "NoRespondersError"
    assert "(step 'customer' on record {'id': " in final.error.message
    assert final.error.where.startswith("task orders+customer[")


@pytest.mark.timeout(180)
async def test_orders_from_jetstream_are_enriched_exactly_once_through_a_killed_executor(cluster, client, tmp_path):
    """Calls are in flight at every checkpoint (a slow customer takes 2 s) and at the kill;
    the orders after the first third come once the executor is dead, and the app reads
    up to the last one."""
    items = orders(3000)
    nc = await nats.connect(cluster.url)
    js = nc.jetstream()
    await js.add_stream(name="ORDERS", subjects=["orders.>"])

    async def publish(part: list[dict]) -> None:
        for order in part:
            await js.publish(f"orders.{order['id'] % 4}", json.dumps(order).encode(),
                             headers={"Nats-Msg-Id": f"order-{order['id']}"})

    output = tmp_path / "enriched.jsonl"
    try:
        await publish(items[:1000])
        with CustomerService(cluster.url, slow=frozenset({5})):
            app_id = await client.submit(pack(ENRICH), ["--jetstream", "ORDERS", "--until", str(len(items)),
                                                        "--nats", cluster.url, "--concurrency", "40",
                                                        "--output", str(output)],
                                         config={"checkpoint_interval_ms": 300})
            await wait_state(client, app_id, AppState.ACTIVE)
            await kill_an_executor_after_a_checkpoint(cluster, client, app_id)
            await publish(items)  # the rest: the first third's ids are duplicates the stream drops
            final = await client.wait(app_id, timeout=150)
    finally:
        await nc.close()
    assert final.state == AppState.SUCCEEDED, final.error
    assert final.restarts >= 1
    assert canonical(read_jsonl(output)) == canonical(expected_enriched(items))
