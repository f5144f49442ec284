"""An event loop on a thread of its own: how synchronous code (connectors, the Spark
driver, the executor's heartbeat) keeps a NATS connection alive beside a busy loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

STOP_GRACE_S = 1.0  # how long stop() lets the loop's cancelled work wind down
CLOSING_S = 3.0  # how long stop() gives its closing coroutine (a connection's close)


class LoopThread:
    """An asyncio event loop on a daemon thread of its own, for synchronous callers on
    another loop that must never wait on the network: a connector's methods run on the
    executor's event loop, so each connector instance keeps its NATS connection on such a
    loop; the executor's heartbeat keeps its own, so a blocked task loop cannot stop it.

    No caller waits for good: :meth:`stop` cancels what still runs (a caller blocked in
    :meth:`call` on another thread gets an error), and a call after it fails at once."""

    def __init__(self, name: str):
        self.name = name
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._stopped = False
        self.thread.start()

    def call(self, coro, timeout: float | None = None):
        """Run ``coro`` on the loop and wait for its result (never from the loop itself);
        TimeoutError once ``timeout`` seconds passed (``coro`` is cancelled), RuntimeError
        when the loop stopped (or stops meanwhile)."""
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"{self.name}: not done within {timeout:g} s") from None
        except concurrent.futures.CancelledError:
            raise RuntimeError(f"{self.name} was stopped while a call ran") from None

    def submit(self, coro):
        """Start ``coro`` on the loop without waiting (a concurrent.futures.Future)."""
        if self._stopped:
            coro.close()
            raise RuntimeError(f"{self.name} is stopped")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self, closing=None, timeout: float = CLOSING_S) -> BaseException | None:
        """Run ``closing`` (say, a connection's close) for at most ``timeout`` seconds, then
        cancel what still runs on the loop, stop it and close it. Returns what ``closing``
        raised (a caller that is shutting down logs it and goes on), else None."""
        failure = None
        if closing is not None:
            try:
                self.call(closing, timeout)
            except Exception as exc:
                failure = exc
        if self._stopped:
            return failure
        self._stopped = True
        try:
            asyncio.run_coroutine_threadsafe(self._cancel_all(), self.loop).result(STOP_GRACE_S * 2)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError, RuntimeError):
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()
        return failure

    @staticmethod
    async def _cancel_all() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_GRACE_S)
