"""The NATS connection every role uses: request/reply with deadlines and typed errors,
and handler dispatch by message type that never lets a bad message kill a service."""

from __future__ import annotations

import argparse
import asyncio
import collections
import io
import os
import re
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

import nats
import nats.errors
import nats.js.api
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.js.object_store import OBJ_CHUNKS_PRE_TEMPLATE, OBJ_DEFAULT_CHUNK_SIZE, OBJ_STREAM_TEMPLATE

from shared import digests
from shared.messages import Ack, ErrorCode, ErrorReply, Message, ProtocolError, decode
from shared.security import Security, nats_connect

log = structlog.get_logger()

M = TypeVar("M", bound=Message)
T = TypeVar("T")
Handler = Callable[[Message], Awaitable[Message | None]]

NATS_URL_ENV = "GEARBUS_NATS_URL"
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
CONNECT_TIMEOUT_ENV = "GEARBUS_CONNECT_TIMEOUT"
DEFAULT_CONNECT_TIMEOUT_S = 60.0  # a role waits this long for NATS at start (compose starts them together)
CONNECT_RETRY_MAX_S = 5.0  # the longest wait between a role's attempts to reach NATS at start
#: How nats-server refuses a publish this connection's credential may not make (the connection stays up;
#: nats-py lowercases the error's text, so subjects are matched lowercased).
_PUBLISH_REFUSED = re.compile(r'permissions violation for publish to "([^"]+)"', re.IGNORECASE)


def add_nats_argument(parser: argparse.ArgumentParser) -> None:
    """``--nats URL`` (repeatable), as every role takes it; :func:`nats_servers` reads it."""
    parser.add_argument("--nats", action="append", metavar="URL",
                        help=f"NATS server URL (repeatable; default ${NATS_URL_ENV}, comma-separated, "
                             f"or {DEFAULT_NATS_URL})")


def add_connect_timeout_argument(parser: argparse.ArgumentParser) -> None:
    """``--connect-timeout S``, as every long-running role takes it (``$GEARBUS_CONNECT_TIMEOUT``)."""
    parser.add_argument("--connect-timeout", type=positive_seconds, metavar="S",
                        default=os.environ.get(CONNECT_TIMEOUT_ENV, str(DEFAULT_CONNECT_TIMEOUT_S)),
                        help="how long to wait for NATS at start, retrying with backoff, before exiting non-zero "
                             f"(default ${CONNECT_TIMEOUT_ENV} or {DEFAULT_CONNECT_TIMEOUT_S:g})")


def positive_seconds(text: str) -> float:
    """A duration argument: a positive, finite number of seconds (argparse says which
    argument is wrong otherwise)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return seconds


def nats_servers(given: Sequence[str] | None, environ: Mapping[str, str] = os.environ) -> list[str]:
    """The NATS URLs a process connects to: those given on its command line, else those in
    ``$GEARBUS_NATS_URL`` (comma-separated), else the local default; the flag wins, as
    twelve-factor services and containers expect."""
    if given:
        return list(given)
    return [url.strip() for url in environ.get(NATS_URL_ENV, "").split(",") if url.strip()] or [DEFAULT_NATS_URL]


#: How long a request waits for its reply unless it says otherwise.
DEFAULT_REQUEST_TIMEOUT_S = 10.0

class RequestError(Exception):
    """Raised by a handler to answer with a specific ErrorReply code."""

    def __init__(self, code: str, message: str, retryable: bool = False):
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable


class RemoteError(RequestError):
    """The peer answered a request with an ErrorReply."""


class RequestTimeout(RequestError):
    """No reply arrived before the deadline."""

    def __init__(self, message: str):
        super().__init__(ErrorCode.UNAVAILABLE, message, retryable=True)


class NoResponders(RequestTimeout):
    """Nobody subscribes to the subject right now (e.g. no master is up yet)."""


def not_found(what: str) -> RequestError:
    return RequestError(ErrorCode.NOT_FOUND, what)


def bad_request(what: str) -> RequestError:
    return RequestError(ErrorCode.BAD_REQUEST, what)


#: What JetStream answers while a stream elects a new leader or a server is down: worth waiting out.
JETSTREAM_UNAVAILABLE = (nats.errors.TimeoutError, TimeoutError, nats.errors.NoRespondersError,
                         nats.js.errors.NoStreamResponseError, nats.js.errors.ServiceUnavailableError)


async def ride_out(op: Callable[[], Awaitable[T]], what: str, patience_s: float = 30.0) -> T:
    """``op()``, retried with backoff while JetStream is unavailable, for up to ``patience_s``
    seconds; then the last error. Losing a server of a cluster makes KV and object stores
    unavailable for seconds; work that can wait (checkpoint records, restores) should."""
    loop = asyncio.get_running_loop()
    deadline, delay = loop.time() + patience_s, 0.1
    while True:
        try:
            return await op()
        except JETSTREAM_UNAVAILABLE as exc:
            if loop.time() + delay > deadline:
                raise
            log.warning("jetstream_unavailable_retrying", what=what, error=repr(exc), retry_in_s=delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)


#: What one fetch of an object's chunks asks for, in bytes: far below a subscription's
#: pending limit, which a connection past it is cut off for.
OBJECT_FETCH_BYTES = 8 << 20
#: The largest chunk of an object written (see object_chunk_bytes).
MAX_OBJECT_CHUNK = 8 << 20


def object_chunk_bytes(nc) -> int:
    """The chunk size of the objects a role writes: as large as the server lets a message
    be, up to MAX_OBJECT_CHUNK (nats-py's default is 128 KiB). Each chunk is a JetStream
    publish whose acknowledgement the writer awaits, on an event loop that runs tasks in
    between: on a busy executor each wait took tens of milliseconds, and storing a
    snapshot of 1.5 MB took up to a second of a checkpoint's time."""
    return max(OBJ_DEFAULT_CHUNK_SIZE, min(nc.max_payload, MAX_OBJECT_CHUNK))


async def object_bytes(js, bucket: str, name: str) -> bytes:
    """Object ``name`` of object store ``bucket``, its digest checked; ObjectNotFoundError
    when it holds none. nats-py's ``ObjectStore.get`` appends each chunk to an immutable
    bytes (quadratic: 37 s for 100 MiB here) or, given a file, reads through a push
    consumer whose flow control paces it (2 s); its chunks fetched through a pull
    consumer, many at a time, take a quarter of that."""
    store = await js.object_store(bucket)
    info = await store.get_info(name)
    if info.is_link() or not info.size:
        buffer = io.BytesIO()
        await store.get(name, writeinto=buffer)
        return buffer.getvalue()
    config = nats.js.api.ConsumerConfig(ack_policy=nats.js.api.AckPolicy.NONE,
                                        deliver_policy=nats.js.api.DeliverPolicy.ALL, inactive_threshold=30.0)
    chunks = await js.pull_subscribe(OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=bucket, obj=info.nuid),
                                     stream=OBJ_STREAM_TEMPLATE.format(bucket=bucket), config=config)
    per_fetch = max(1, OBJECT_FETCH_BYTES // (info.options.max_chunk_size or OBJ_DEFAULT_CHUNK_SIZE))
    parts: list[bytes] = []
    try:
        while len(parts) < info.chunks:
            parts.extend(msg.data for msg in await chunks.fetch(min(per_fetch, info.chunks - len(parts)), timeout=10))
    finally:
        await chunks.unsubscribe()
    data = b"".join(parts)
    if digests.from_object_store(info.digest) != digests.sha256_hex(data):
        raise nats.js.errors.DigestMismatchError
    return data


async def unsubscribe_all(subscriptions: list) -> None:
    """Unsubscribe each subscription, ignoring ones the connection already dropped."""
    for sub in subscriptions:
        try:
            await sub.unsubscribe()
        except Exception as exc:
            log.debug("unsubscribe_failed", error=repr(exc))
    subscriptions.clear()


def _check_app(subject: str, message: Message, app_token: int | None) -> None:
    if app_token is None:
        return
    token = subject.split(".")[app_token]
    if str(getattr(message, "app_id", None)) != token:
        raise ProtocolError(f"{type(message).__name__} for app {getattr(message, 'app_id', None)} "
                            f"on a subject of app {token}: refused")


class Bus:
    """One NATS connection with gearbus's request, serve and listen conventions."""

    def __init__(self, servers: str | Sequence[str], name: str, security: Security = Security()):
        self.servers = [servers] if isinstance(servers, str) else list(servers)
        self.name = name
        self.security = security
        self.nc: nats.NATS | None = None
        self.counters: collections.Counter[str] = collections.Counter()
        self._inflight: set[asyncio.Task] = set()
        self._subs = []
        self._closing = False
        self._refusals: dict[str, set[asyncio.Future]] = {}  # subject, lowercased -> requests waiting on it

    async def connect(self, timeout: float = 10.0, reachable_within: float | None = None,
                      patience_s: float | None = None) -> None:
        """Connect, reconnecting for as long as the process lives once connected.
        ``reachable_within``: fail with ConnectionError naming the URLs when no server accepts
        a TCP connection that fast (clients and tools). ``patience_s``: a role's wait for its
        server: retried with backoff, each attempt's warning naming the URLs, then the same
        ConnectionError."""
        loop = asyncio.get_running_loop()
        deadline = None if patience_s is None else loop.time() + patience_s
        if deadline is not None:
            await self._wait_reachable(deadline, patience_s)
            reachable_within = max(deadline - loop.time(), timeout)
        elif reachable_within is not None:
            await self._check_reachable(reachable_within)

        async def on_error(exc):
            self.counters["connection_errors"] += 1
            log.warning("nats_error", error=repr(exc), nats=self.servers)
            refused = _PUBLISH_REFUSED.search(str(exc))
            for waiting in self._refusals.get(refused.group(1), ()) if refused else ():
                if not waiting.done():
                    waiting.set_result(str(exc))

        async def on_disconnect():
            if not self._closing:
                log.warning("nats_disconnected", nats=self.servers)

        async def on_reconnect():
            log.info("nats_reconnected", url=str(self.nc.connected_url.netloc) if self.nc.connected_url else "")

        connecting = nats_connect(
            self.servers,
            self.security,
            name=self.name,
            connect_timeout=timeout if reachable_within is None else reachable_within,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            error_cb=on_error,
            disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect,
            pending_size=64 * 1024 * 1024,
        )
        if reachable_within is None:
            self.nc = await connecting
            return
        try:  # something listens, but it may not speak NATS
            self.nc = await asyncio.wait_for(connecting, reachable_within)
        except asyncio.TimeoutError:
            raise ConnectionError(f"no NATS server answered at {', '.join(self.servers)} "
                                  f"within {reachable_within:g} s") from None

    async def _wait_reachable(self, deadline: float, patience_s: float) -> None:
        """Until a server accepts a TCP connection: attempts 0.1 s apart, doubling up to
        CONNECT_RETRY_MAX_S; a ConnectionError naming the URLs at ``deadline``."""
        loop, delay = asyncio.get_running_loop(), 0.1
        while True:
            try:
                return await self._check_reachable(min(max(deadline - loop.time(), 0.1), CONNECT_RETRY_MAX_S))
            except ConnectionError as exc:
                left = deadline - loop.time()
                if left <= 0:
                    raise ConnectionError(f"{exc}; gave up after {patience_s:g} s (--connect-timeout)") from None
                log.warning("nats_unreachable_retrying", error=str(exc), retry_in_s=round(min(delay, left), 2),
                            gives_up_in_s=round(left, 1))
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, CONNECT_RETRY_MAX_S)

    async def _check_reachable(self, within: float) -> None:
        errors = []
        for url in self.servers:
            parsed = urllib.parse.urlsplit(url if "://" in url else f"nats://{url}")
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(parsed.hostname or "127.0.0.1", parsed.port or 4222), within)
            except (OSError, asyncio.TimeoutError) as exc:
                errors.append(f"{url} ({exc.strerror if isinstance(exc, OSError) and exc.strerror else 'no answer'})")
                continue
            writer.close()
            return
        raise ConnectionError(f"cannot reach NATS at {', '.join(errors)}")

    @property
    def js(self):
        return self.nc.jetstream()

    @property
    def replicas(self) -> int:
        """Replicas for JetStream buckets: 3 on a cluster of three or more servers."""
        return 3 if len(self.nc.servers) >= 3 else 1

    async def jetstream_ready(self, timeout: float = 30.0) -> None:
        """Wait until JetStream answers (a new cluster elects its meta leader first);
        a server without JetStream is a clear error."""
        loop = asyncio.get_running_loop()
        deadline, unavailable_since = loop.time() + timeout, None
        while True:
            try:
                await self.js.account_info()
                return
            except nats.js.errors.ServiceUnavailableError:
                unavailable_since = unavailable_since or loop.time()
                if loop.time() - unavailable_since > min(3.0, timeout):
                    raise RuntimeError(f"the NATS server at {self.servers} has no JetStream enabled "
                                       "(start nats-server with -js)") from None
            except (nats.errors.TimeoutError, TimeoutError):
                if loop.time() > deadline:
                    raise RuntimeError(f"JetStream at {self.servers} did not answer within {timeout:g} s") from None
            await asyncio.sleep(0.2)

    async def publish(self, subject: str, message: Message) -> None:
        await self.nc.publish(subject, message.encode())

    async def request(
        self,
        subject: str,
        message: Message,
        timeout: float = DEFAULT_REQUEST_TIMEOUT_S,
        expect: type[M] | tuple[type[Message], ...] = (),
        retry_s: float = 0.0,
        idempotent: bool = False,
    ) -> M:
        """Send a request and return the decoded reply; ErrorReply raises RemoteError.

        With ``retry_s``, a request nobody serves (a master fail-over) is retried with
        backoff for that long before "no responders" is final; an ``idempotent`` one is
        also retried when a reply does not come (its server stepped down mid-request).
        """
        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + retry_s, 0.02
        while True:
            try:
                reply = await self._request_once(subject, message.encode(), timeout)
                break
            except nats.errors.NoRespondersError:
                if loop.time() + delay > deadline:
                    waited = f" within {retry_s:g} s" if retry_s else ""
                    raise NoResponders(f"nobody serves {subject} (no master answered{waited})") from None
            except nats.errors.TimeoutError:
                if not idempotent or loop.time() + delay > deadline:
                    raise RequestTimeout(f"no reply on {subject} within {timeout:g} s") from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
        answer = decode(reply.data)
        if isinstance(answer, ErrorReply):
            raise RemoteError(answer.code, answer.message, answer.retryable)
        wanted = expect if isinstance(expect, tuple) else (expect,)
        if wanted and not isinstance(answer, wanted):
            raise RequestError(
                ErrorCode.BAD_REQUEST,
                f"{subject} answered {type(answer).__name__}, expected {', '.join(w.__name__ for w in wanted)}",
            )
        return answer

    async def _request_once(self, subject: str, data: bytes, timeout: float) -> Msg:
        """One request; a publish the server refuses this credential fails at once (FORBIDDEN),
        not after the timeout."""
        refused = asyncio.get_running_loop().create_future()
        waiting = self._refusals.setdefault(subject.lower(), set())
        waiting.add(refused)
        request = asyncio.ensure_future(self.nc.request(subject, data, timeout=timeout))
        try:
            await asyncio.wait((request, refused), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            request.cancel()
            raise
        finally:
            waiting.discard(refused)
            if not waiting:
                self._refusals.pop(subject.lower(), None)
        if not request.done():
            request.cancel()
            raise RequestError(ErrorCode.FORBIDDEN, f"the NATS server refused this credential publishing to {subject} "
                                                    f"({refused.result()})")
        refused.cancel()
        return request.result()

    async def gather(self, subject: str, message: Message, expect: type[M], count: int, timeout: float) -> list[M]:
        """Send a request every subscriber answers (scatter-gather); return the replies of
        type ``expect`` that came before ``count`` of them did or ``timeout`` passed."""
        replies: list[M] = []
        enough = asyncio.Event()

        async def on_reply(msg: Msg) -> None:
            try:
                answer = decode(msg.data, (expect, ErrorReply))
            except ProtocolError as exc:
                log.warning("bad_reply", subject=subject, error=str(exc))
                return
            if isinstance(answer, expect):
                replies.append(answer)
            if len(replies) >= count:
                enough.set()

        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox, cb=on_reply)
        try:
            await self.nc.publish(subject, message.encode(), reply=inbox)
            try:
                await asyncio.wait_for(enough.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        finally:
            await sub.unsubscribe()
        return replies

    async def serve(
        self,
        subject: str,
        handlers: dict[type[Message], Handler],
        queue: str = "",
        concurrent: bool = False,
        guard: Callable[[], bool] | None = None,
        app_token: int | None = None,
    ):
        """Answer requests on ``subject``, dispatching by message type; returns the
        subscription.

        A handler returns the reply message (None means Ack). Malformed input and
        handler exceptions are answered with an ErrorReply and logged; the
        subscription keeps serving. ``concurrent`` runs each request in its own task,
        for handlers that wait on other parties. While ``guard()`` is false requests are
        dropped unanswered (a master that may have lost its lease must stay silent).
        ``app_token``: the position of an app id in the (wildcard) subject; a message whose
        ``app_id`` differs is refused, so a credential scoped to one app speaks only for it.
        """
        expected = tuple(handlers)

        async def answer(msg: Msg) -> None:
            reply = await self._dispatch(msg.subject, msg.data, handlers, expected, app_token)
            if msg.reply:
                await self.nc.publish(msg.reply, reply.encode())

        async def on_msg(msg: Msg) -> None:
            if guard is not None and not guard():
                self.counters["guarded_drops"] += 1
                return
            if concurrent:
                self._track(answer(msg))
            else:
                await answer(msg)

        sub = await self.nc.subscribe(subject, queue=queue, cb=on_msg)
        self._subs.append(sub)
        return sub

    async def _dispatch(self, subject, data, handlers, expected, app_token) -> Message:
        try:
            message = decode(data, expected)
            _check_app(subject, message, app_token)
        except ProtocolError as exc:
            self.counters["bad_requests"] += 1
            log.warning("bad_request", subject=subject, error=str(exc))
            return ErrorReply(ErrorCode.BAD_REQUEST, f"{subject}: {exc}")
        try:
            result = await handlers[type(message)](message)
        except RequestError as exc:
            self.counters["request_errors"] += 1
            log.info("request_refused", subject=subject, code=exc.code, error=exc.message)
            return ErrorReply(exc.code, exc.message, exc.retryable)
        except Exception as exc:
            self.counters["handler_errors"] += 1
            log.exception("handler_failed", subject=subject, message_type=type(message).__name__)
            return ErrorReply(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        return Ack() if result is None else result

    async def listen(self, subject: str, handlers: dict[type[Message], Handler], queue: str = "",
                     guard: Callable[[], bool] | None = None, app_token: int | None = None):
        """Handle one-way messages: a malformed one is logged, counted and dropped.
        Returns the subscription; ``guard`` and ``app_token`` as for :meth:`serve`."""
        expected = tuple(handlers)

        async def on_msg(msg: Msg) -> None:
            if guard is not None and not guard():
                self.counters["guarded_drops"] += 1
                return
            try:
                message = decode(msg.data, expected)
                _check_app(msg.subject, message, app_token)
            except ProtocolError as exc:
                self.counters["dropped_messages"] += 1
                log.warning("message_dropped", subject=msg.subject, error=str(exc))
                return
            try:
                await handlers[type(message)](message)
            except Exception:
                self.counters["handler_errors"] += 1
                log.exception("handler_failed", subject=msg.subject, message_type=type(message).__name__)

        sub = await self.nc.subscribe(subject, queue=queue, cb=on_msg)
        self._subs.append(sub)
        return sub

    async def drop(self, subscriptions: list) -> None:
        """Unsubscribe a group of this bus's subscriptions."""
        for sub in subscriptions:
            if sub in self._subs:
                self._subs.remove(sub)
        await unsubscribe_all(subscriptions)

    def _track(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def close(self) -> None:
        """Unsubscribe, let in-flight handlers finish, then drain the connection."""
        self._closing = True
        await unsubscribe_all(self._subs)
        if self._inflight:
            await asyncio.wait(list(self._inflight), timeout=5)
        if self.nc is not None and not self.nc.is_closed:
            try:
                await asyncio.wait_for(self.nc.drain(), timeout=5)
            except Exception:
                await self.nc.close()


__all__ = ["Ack", "Bus", "NoResponders", "RemoteError", "RequestError", "RequestTimeout", "bad_request", "not_found"]
