"""map_async on a real cluster, calling a service started here: unordered results with a
timeout that gives a default, and a call that fails the app naming the step and record
(the ordered run is examples/enrich.py's, in test_examples)."""

from __future__ import annotations

import os

from gearbus.artifact import pack
from shared.messages import AppState
from tests.support.files import canonical, read_jsonl, write_jsonl
from tests.support.paths import EXAMPLES
from tests.support.services import CustomerService, customer, orders

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
