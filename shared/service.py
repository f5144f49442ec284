"""The process lifecycle every role shares: start, run until stopped or until the first
background task fails, SIGTERM/SIGINT to a graceful close, and drain NATS on the way out."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Coroutine, Sequence

import structlog

from shared.bus import DEFAULT_CONNECT_TIMEOUT_S, Bus
from shared.security import Security

log = structlog.get_logger()

EXIT_START_FAILED = 2


class Service:
    """Base of master, worker, appmaster and executor.

    Subclasses implement :meth:`setup` (subscriptions, registration) and may extend
    :meth:`shutdown`. Background loops go through :meth:`spawn`, so a loop that
    fails ends :meth:`run` with a non-zero exit code instead of dying unseen.
    """

    role = "service"

    def __init__(self, servers: str | Sequence[str], node_id: str, security: Security = Security()):
        self.node_id = node_id
        self.bus = Bus(servers, name=f"gearbus-{self.role}-{node_id}", security=security)
        self._background: set[asyncio.Task] = set()
        self._stopping: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self._started = False
        self._closed = False
        self.exit_code = 0

    async def setup(self) -> None:
        """Subscribe and register; called once by :meth:`start` after connecting."""

    async def shutdown(self) -> None:
        """Role-specific graceful shutdown, before background tasks are cancelled."""

    async def start(self, timeout: float = 90.0, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
        """Connect (waiting up to ``connect_timeout`` for NATS, retrying with backoff), then
        set up within ``timeout``."""
        if self._started:
            return
        self._started = True
        self._stopping = asyncio.Event()
        await self.bus.connect(patience_s=connect_timeout)
        await asyncio.wait_for(self.setup(), timeout)
        log.info("service_started", role=self.role)

    def spawn(self, coro: Coroutine, name: str) -> asyncio.Task:
        """Run background work owned by this service; its failure stops the service."""
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._on_background_done)
        return task

    def _on_background_done(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and self._failure is None:
            self._failure = exc
            log.error("background_task_failed", task=task.get_name(), error=repr(exc), exc_info=exc)
            self.stop(exit_code=1)

    def stop(self, exit_code: int = 0) -> None:
        """Ask :meth:`run` to close the service (safe to call from handlers)."""
        if exit_code and not self.exit_code:
            self.exit_code = exit_code
        if self._stopping is not None:
            self._stopping.set()

    async def run(self, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> int:
        """Start, serve until stopped (signal, :meth:`stop`, background failure), close."""
        loop = asyncio.get_running_loop()
        try:
            await self.start(connect_timeout=connect_timeout)
        except Exception as exc:
            # NATS not reachable needs no traceback: the error names the URL and the deadline
            log.error("service_start_failed", error=f"{type(exc).__name__}: {exc}",
                      exc_info=None if isinstance(exc, ConnectionError) else exc)
            self.exit_code = EXIT_START_FAILED
            await self.close()
            return self.exit_code
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        await self._stopping.wait()
        await self.close()
        return self.exit_code

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.wait_for(self.shutdown(), timeout=10)
        except Exception as exc:
            log.warning("shutdown_incomplete", error=repr(exc))
        for task in list(self._background):
            task.cancel()
        if self._background:
            await asyncio.wait(list(self._background), timeout=5)
        await self.bus.close()
        log.info("service_closed", role=self.role, exit_code=self.exit_code)


def run_service(service: Service, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> int:
    """Run a service on a fresh event loop (uvloop when installed) and return its exit code
    (EXIT_START_FAILED when NATS was not reachable within ``connect_timeout`` seconds)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(service.run(connect_timeout))
    return uvloop.run(service.run(connect_timeout))


def role_command(module: str) -> list[str]:
    """The command that starts a role's process: ``python -P -m <module>``. ``-P`` keeps the
    working directory off ``sys.path``: a user's own ``services`` or ``shared`` folder where
    gearbus was started must not stand in for the framework's packages."""
    return [sys.executable, "-P", "-m", module]
