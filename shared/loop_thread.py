"""An event loop on a thread of its own: how synchronous code (connectors, the Spark
driver, the executor's heartbeat) keeps a NATS connection alive beside a busy loop."""

from __future__ import annotations

import asyncio
import threading


class LoopThread:
    """An asyncio event loop on a daemon thread of its own, for synchronous callers on
    another loop that must never wait on the network: a connector's methods run on the
    executor's event loop, so each connector instance keeps its NATS connection on such a
    loop; the executor's heartbeat keeps its own, so a blocked task loop cannot stop it."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def call(self, coro):
        """Run ``coro`` on the loop and wait for its result (never from the loop itself)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def submit(self, coro):
        """Start ``coro`` on the loop without waiting (a concurrent.futures.Future)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()
