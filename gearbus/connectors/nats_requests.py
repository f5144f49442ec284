"""Ask a NATS request-reply service from a ``map_async`` function.

``nc.request`` of nats-py costs each call a random token (a system call), a
``wait_for`` and a callback; at thousands of calls a second on one task those are a
good part of the task's time, and they delay every answer queued behind them. A
:class:`NatsRequester` keeps one connection, one reply subscription on a wildcard inbox,
and a future per call, numbered by a counter. It copies and pickles without its
connection: each task (a copy of its own) and each event loop (a Spark partition's)
connects at its first call.
"""

from __future__ import annotations

import asyncio
import itertools

from gearbus.connectors.jetstream import NO_RESPONDERS_STATUS, connect, server_list


class NoRespondersError(RuntimeError):
    """No service is subscribed to the subject asked."""


class NatsRequester:
    """``await requester.request(payload)``: the service's answer on ``subject``, or a
    TimeoutError after ``timeout_s`` (``map_async``'s ``timeout_ms`` and ``on_timeout``
    can be shorter). ``creds``: a .creds or .nk file for a secured cluster."""

    def __init__(self, servers: str | list[str], subject: str, timeout_s: float = 30.0, creds: str | None = None):
        if not subject or " " in subject:
            raise ValueError(f"NatsRequester: {subject!r} is not a NATS subject")
        if timeout_s <= 0:
            raise ValueError(f"NatsRequester: timeout_s must be positive, got {timeout_s!r}")
        self.servers = server_list(servers)
        self.subject = subject
        self.timeout_s = timeout_s
        self.creds = creds
        self._forget()

    def _forget(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Task | None = None  # connects and subscribes; its result is the inbox prefix
        self._waiting: dict[str, asyncio.Future] = {}
        self._numbers = itertools.count()

    def __getstate__(self) -> dict:
        return {"servers": self.servers, "subject": self.subject, "timeout_s": self.timeout_s, "creds": self.creds}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._forget()

    async def request(self, payload: bytes) -> bytes:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a loop of its own: a connection of its own
            self._forget()
            self._loop = loop
        if self._ready is None:
            self._ready = loop.create_task(self._connect())
        try:
            prefix = await self._ready
        except BaseException:
            self._ready = None  # the next call tries again
            raise
        inbox = prefix + str(next(self._numbers))
        answer = self._waiting[inbox] = loop.create_future()
        expiry = loop.call_later(self.timeout_s, self._expire, inbox)
        try:
            await self._nc.publish(self.subject, payload, reply=inbox)
            return await answer
        finally:
            expiry.cancel()
            self._waiting.pop(inbox, None)

    async def _connect(self) -> str:
        self._nc = await connect(self.servers, name=f"gearbus-requests-{self.subject}", creds=self.creds)
        prefix = self._nc.new_inbox() + "."
        await self._nc.subscribe(prefix + "*", cb=self._on_answer)
        return prefix

    async def _on_answer(self, msg) -> None:
        answer = self._waiting.pop(msg.subject, None)
        if answer is None or answer.done():  # its caller gave up
            return
        if msg.headers and msg.headers.get("Status") == NO_RESPONDERS_STATUS and not msg.data:
            answer.set_exception(NoRespondersError(f"no service answers requests on {self.subject!r}"))
        else:
            answer.set_result(msg.data)

    def _expire(self, inbox: str) -> None:
        answer = self._waiting.pop(inbox, None)
        if answer is not None and not answer.done():
            answer.set_exception(TimeoutError(f"no answer on {self.subject!r} within {self.timeout_s:g} s"))


__all__ = ["NatsRequester", "NoRespondersError"]
