"""A service for pipelines that call out (``map_async``, examples/enrich.py): a NATS
request-reply responder on a loop thread of its own, so sync tests (Spark) and async
ones alike can run it beside a pipeline, with the inputs and the expected outputs."""

from __future__ import annotations

import asyncio
import json

import nats

from shared.loop_thread import LoopThread

SUBJECT = "customers.lookup"


def customer(customer_id: str) -> dict:
    """What the service answers for a customer id."""
    return {"id": customer_id, "tier": "gold" if int(customer_id) % 3 == 0 else "basic"}


def orders(n: int) -> list[dict]:
    return [{"id": i, "customer": i % 17, "amount": i * 3 % 101} for i in range(n)]


def expected_enriched(items: list[dict]) -> list[dict]:
    return [{**order, "customer": customer(str(order["customer"]))} for order in items]


class CustomerService:
    """Answers ``SUBJECT`` requests with :func:`customer`, some customers later than others
    (up to 8 ms), so calls finish out of order, and the ``slow`` ones after 2 s; counts the
    requests."""

    def __init__(self, url: str, slow: frozenset[int] = frozenset()):
        self.url = url
        self.slow = slow
        self.requests = 0
        self.answering: set[asyncio.Task] = set()

    def __enter__(self) -> CustomerService:
        self.thread = LoopThread("customer-service")
        self.thread.call(self._start())
        return self

    async def _start(self) -> None:
        self.nc = await nats.connect(self.url, name="customer-service")
        loop = asyncio.get_running_loop()

        async def answer(msg) -> None:
            customer_id = int(msg.data)
            await asyncio.sleep(2 if customer_id in self.slow else customer_id % 5 * 0.002)
            await msg.respond(json.dumps(customer(msg.data.decode())).encode())

        async def on_request(msg) -> None:
            self.requests += 1
            task = loop.create_task(answer(msg))
            self.answering.add(task)
            task.add_done_callback(self.answering.discard)

        await self.nc.subscribe(SUBJECT, cb=on_request)
        await self.nc.flush()

    async def _stop(self) -> None:
        for task in self.answering:
            task.cancel()
        await asyncio.gather(*self.answering, return_exceptions=True)
        await self.nc.close()

    def __exit__(self, *exc) -> None:
        self.thread.call(self._stop())
        self.thread.stop()
