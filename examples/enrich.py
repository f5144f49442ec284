"""Enrich orders from a service: each order asks a NATS request-reply service for its
customer, with up to ``--concurrency`` requests in flight per task (``map_async``).

    gearbus run [--runner test|local|cluster|spark] examples/enrich.py --input orders.jsonl \\
        --output enriched.jsonl --nats URL [--service customers.lookup] [--concurrency 100]
        [--parallelism 2] [--unordered] [--timeout-ms MS]
    gearbus run examples/enrich.py --jetstream ORDERS [--until now|SEQ] --output ... --nats URL

Orders: ``{"id": int, "customer": str, ...}``, the lines of a JSON Lines file, or the
messages of a JetStream stream (all its subjects; by default up to its last message when
the app starts; ``--until SEQ`` waits for stream sequence SEQ). The service answers a request whose
payload is a customer id with that customer's JSON object; each output line is the order
with ``"customer"`` replaced by that object, in input order per task (``--unordered``:
as answers come). With ``--timeout-ms``, an order whose answer takes longer gets
``"customer": null`` instead of failing the app.
"""

from __future__ import annotations

import argparse
import json

from gearbus import NatsRequester, Pipeline


class Lookup:
    """The order with its customer, asked of the service (one connection per task, or
    per Spark partition, opened at the first call)."""

    def __init__(self, servers: str, subject: str):
        self.customers = NatsRequester(servers, subject, timeout_s=30)

    async def __call__(self, order: dict) -> dict:
        answer = await self.customers.request(str(order["customer"]).encode())
        return {**order, "customer": json.loads(answer)}


def without_customer(order: dict) -> dict:
    return {**order, "customer": None}


def application(args: list[str]) -> Pipeline:
    parser = argparse.ArgumentParser(prog="enrich")
    orders = parser.add_mutually_exclusive_group(required=True)
    orders.add_argument("--input", help="JSON Lines file of orders")
    orders.add_argument("--jetstream", metavar="STREAM", help="a JetStream stream of orders (JSON messages)")
    parser.add_argument("--until", default="now", help="--jetstream: read up to this stream sequence "
                                                       "(default: its last message when the app starts)")
    parser.add_argument("--output", required=True, help="JSON Lines file to write")
    parser.add_argument("--nats", required=True, help="the service's NATS URL(s), comma-separated")
    parser.add_argument("--service", default="customers.lookup", help="the service's subject")
    parser.add_argument("--concurrency", type=int, default=100, help="requests in flight per task (default 100)")
    parser.add_argument("--parallelism", type=int, default=2, help="tasks (default 2)")
    parser.add_argument("--unordered", action="store_true", help="write orders as their answers come")
    parser.add_argument("--timeout-ms", type=float, help="give up on an answer after this long")
    opts = parser.parse_args(args)
    if opts.concurrency < 1 or opts.parallelism < 1:
        parser.error("--concurrency and --parallelism must be at least 1")
    n = opts.parallelism
    pipeline = Pipeline("enrich", config={"executors": n}, parallelism=n)
    if opts.jetstream:
        until = opts.until if opts.until == "now" else int(opts.until)
        orders = pipeline.read_jetstream(opts.jetstream, until=until, parallelism=n, name="orders")
    else:
        orders = pipeline.read_jsonl(opts.input, parallelism=n, name="orders")
    (orders
        .map_async(Lookup(opts.nats, opts.service), concurrency=opts.concurrency,
                   ordered=not opts.unordered, timeout_ms=opts.timeout_ms,
                   on_timeout=without_customer if opts.timeout_ms else None, name="customer")
        .write_jsonl(opts.output, name="write"))
    return pipeline
