"""The executor's heartbeat, on a thread and NATS connection of its own.

Tasks run user code on the executor's event loop; a batch that takes seconds (a slow
sink, a heavy function) must not look like a dead process, or the app would roll back
again and again for being slow. So heartbeats go from this thread: they prove the process
lives, and say how long the task loop has not turned (``loop_blocked_s`` is logged).

The AppMaster's answers decide: "fenced" means this executor was declared lost and
replaced — it must stop at once, and if its task loop does not let it within
``FENCE_GRACE_S`` the process exits from here; an AppMaster silent past the deadline
means the app is gone, and the executor stops.

The thread also watches the worker that launched the process. When it dies, nobody is
left to report this executor's end, and the AppMaster would wait for missed heartbeats
(seconds) before replacing it; so the executor reports its own end (``orphaned``) on this
connection and exits at once, whatever its task loop is doing.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

import structlog

from shared.bus import Bus, RequestError
from shared.loop_thread import LoopThread
from shared.messages import ErrorCode, ExecutorHeartbeat, Message
from shared.security import Security

log = structlog.get_logger()

FENCE_GRACE_S = 2.0  # a fenced executor whose task loop does not stop within this exits hard
LOOP_BLOCKED_WARN_S = 2.0  # a task loop that has not turned for this long is logged
PARENT_POLL_S = 0.05  # how often the thread looks whether the worker still lives


class Heartbeat:
    """Beats every ``interval`` until stopped; ``beat()`` builds the message (it reads task
    counters: plain attribute reads, safe from this thread)."""

    def __init__(self, servers: list[str], name: str, subject: str, beat: Callable[[], ExecutorHeartbeat],
                 interval: float, deadline_s: float, on_fenced: Callable[[str], None],
                 on_appmaster_gone: Callable[[float, str], None], fenced_exit_code: int,
                 parent_pid: int | None = None, orphaned: Callable[[], tuple[str, Message, int]] | None = None,
                 security: Security = Security()):
        """``parent_pid``: the worker; when it is gone, publish ``orphaned()``'s (subject,
        message) and exit with its code."""
        self.servers, self.name, self.subject, self.beat = servers, name, subject, beat
        self.security = security
        self.parent_pid, self.orphaned = parent_pid, orphaned
        self.interval = interval
        self.deadline_s = deadline_s
        self.on_fenced, self.on_appmaster_gone = on_fenced, on_appmaster_gone
        self.fenced_exit_code = fenced_exit_code
        self.loop_seen = time.monotonic()  # the task loop's last turn (set from that loop)
        self._thread: LoopThread | None = None
        self._running = None

    def start(self, main_loop: asyncio.AbstractEventLoop) -> None:
        self._main_loop = main_loop
        self._thread = LoopThread(f"{self.name}-heartbeat")
        self._running = self._thread.submit(self._run())

    def loop_turned(self) -> None:
        """Called on the task loop now and then: it is not blocked."""
        self.loop_seen = time.monotonic()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._running.cancel()
        self._thread.stop()
        self._thread = None

    async def _run(self) -> None:
        bus = Bus(self.servers, name=self.name, security=self.security)
        await bus.connect()
        answered, warned = time.monotonic(), False
        watch = asyncio.create_task(self._watch_parent(bus)) if self.parent_pid and self.orphaned else None
        try:
            while True:
                blocked = time.monotonic() - self.loop_seen
                if blocked > LOOP_BLOCKED_WARN_S and not warned:
                    log.warning("task_loop_blocked", blocked_s=round(blocked, 1))
                warned = blocked > LOOP_BLOCKED_WARN_S
                try:
                    await bus.request(self.subject, self.beat(), timeout=max(self.interval, 0.5))
                    answered = time.monotonic()
                except RequestError as exc:
                    if exc.code == ErrorCode.FENCED:
                        self._fenced(exc.message)
                        return
                    silent = time.monotonic() - answered
                    if silent > self.deadline_s:
                        self._main_loop.call_soon_threadsafe(self.on_appmaster_gone, silent, exc.message)
                        return
                await asyncio.sleep(self.interval)
        finally:
            if watch is not None:
                watch.cancel()
            await bus.close()

    async def _watch_parent(self, bus: Bus) -> None:
        while os.getppid() == self.parent_pid:
            await asyncio.sleep(PARENT_POLL_S)
        subject, message, exit_code = self.orphaned()
        log.error("worker_gone", worker_pid=self.parent_pid)
        try:
            await bus.publish(subject, message)
            await asyncio.wait_for(bus.nc.flush(), 1.0)
        finally:
            os._exit(exit_code)

    def _fenced(self, reason: str) -> None:
        """Stop through the task loop; if it is stuck, exit the process from here."""
        log.error("fenced", reason=reason)
        self._main_loop.call_soon_threadsafe(self.on_fenced, reason)
        time.sleep(FENCE_GRACE_S)
        log.error("fenced_exit", reason="the task loop did not stop in time")
        os._exit(self.fenced_exit_code)
