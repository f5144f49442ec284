"""JetStream from plain nats-py: stream management and acknowledged, deduplicated
publishing, shared by the Spark connector and the bus's JetStream sinks (and source,
in :mod:`gearbus.connectors.jetstream_source`).

Publishing uses plain publishes with reply subjects under one inbox (one wildcard
subscription for the acks) rather than ``js.publish`` per message: measured here, ~70k
messages/s against ~30k.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterable

import nats

from gearbus.api.task import DataSink, Record, TaskContext
from shared.loop_thread import LoopThread
from shared.security import ENV_CREDS, Security, nats_connect

log = logging.getLogger(__name__)

API_TIMEOUT = 5.0            # s, a JetStream API request
NO_RESPONDERS_STATUS = "503"  # the status of the empty reply NATS sends when nothing listens
PUBLISH_WINDOW = 4_096       # unacknowledged publishes per writer task
ACK_TIMEOUT_S = 5.0          # no ack for this long: republish (same Nats-Msg-Id)
PUBLISH_RETRIES = 5


def servers_for(servers: list[str], context: TaskContext, what: str) -> list[str]:
    """The NATS servers a connector task uses: its own, else the cluster's."""
    chosen = servers or context.nats_servers
    if not chosen:
        raise ValueError(f"{what}: no NATS servers; pass servers=... (the TestRunner has no cluster NATS of its own)")
    return chosen


class JetStreamError(RuntimeError):
    """A JetStream API error, or a stream that cannot be read or written as asked."""


def close_thread(owner, shutdown, name: str) -> None:
    """Stop ``owner``'s connector thread (once: ``owner._thread``) after ``shutdown()`` ran
    on it; a failure there is logged, not raised (the connector is closing anyway)."""
    thread, owner._thread = getattr(owner, "_thread", None), None
    if thread is None:
        return
    failure = thread.stop(shutdown())
    if failure is not None:
        log.debug("%s: closing: %s", name, failure)


def run_fresh(coro):
    """Run a coroutine on a fresh event loop (the planning process and the workers have none)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


async def _quiet_error_cb(error: Exception) -> None:
    # Slow-consumer drops surface as consumer-sequence gaps (handled); connection errors
    # surface in the calls that fail. nats-py's default logs a traceback for each.
    log.debug("nats: %s", error)


def connector_security(creds: str | None) -> Security:
    """A connector's own credential (``creds``: a .creds or .nk file, at the same path on
    every worker), with this process's TLS files (GEARBUS_TLS_*; a worker passes its own on).
    Never the process's credential: an app's own allows no stream of yours."""
    return Security.load(creds or None, environ={k: v for k, v in os.environ.items() if k != ENV_CREDS})


async def connect(servers: list[str], name: str = "gearbus-spark", creds: str | None = None,
                  security: Security | None = None):
    """A connection of its own for a connector (with ``creds``, or ``security``: the app's
    own, for what the app owns); a refused credential or certificate is a JetStreamError
    that says so (the app fails: no recovery can fix it)."""
    try:
        return await nats_connect(servers, security or connector_security(creds), name=name, connect_timeout=5,
                                  allow_reconnect=True, max_reconnect_attempts=10, reconnect_time_wait=0.5,
                                  error_cb=_quiet_error_cb)
    except ConnectionError as exc:
        raise JetStreamError(str(exc)) from None


async def api(nc, subject: str, payload: dict | None = None, timeout: float = API_TIMEOUT) -> dict:
    try:
        msg = await nc.request(subject, json.dumps(payload).encode() if payload is not None else b"", timeout=timeout)
    except nats.errors.NoRespondersError:
        raise JetStreamError(f"no JetStream responded to {subject} (is JetStream enabled on the server?)") from None
    except nats.errors.TimeoutError as exc:  # (from it: a fault, gearbus/runtime/failures.py)
        raise JetStreamError(f"JetStream API request {subject} timed out after {timeout:g} s") from exc
    reply = json.loads(msg.data)
    if "error" in reply:
        err = reply["error"]
        raise JetStreamError(f"{subject}: {err.get('description', err)} (code {err.get('err_code', err.get('code'))})")
    return reply


async def stream_info(nc, stream: str) -> dict:
    return await api(nc, f"$JS.API.STREAM.INFO.{stream}")


def server_list(servers: str | list[str] | None) -> list[str]:
    """NATS URLs given as one comma-separated string or a list (None: none)."""
    return servers.split(",") if isinstance(servers, str) else list(servers or [])


def on_connection(servers: str | list[str], work, creds: str | None = None, name: str = "gearbus-spark"):
    """``await work(nc)`` on a short-lived connection of its own (with ``creds``), on a thread
    of its own: callers may be inside a running event loop (the CLI's) or have none."""
    servers = server_list(servers)

    async def go():
        nc = await connect(servers, name=name, creds=creds)
        try:
            return await work(nc)
        finally:
            await nc.close()

    thread = LoopThread(name)
    try:
        return thread.call(go())
    finally:
        thread.stop()


def stream_state(servers: str | list[str], stream: str, creds: str | None = None) -> dict:
    """The stream's state (``messages``, ``first_seq``, ``last_seq``, ...), on a short-lived connection."""

    async def state(nc) -> dict:
        return (await stream_info(nc, stream))["state"]

    return on_connection(servers, state, creds)


def ensure_stream(servers: str | list[str], stream: str, subjects: list[str],
                  duplicate_window_s: float = 120.0, storage: str = "file", creds: str | None = None) -> dict:
    """Create the stream if it does not exist (subjects, duplicate window); return its info."""
    return on_connection(servers, lambda nc: ensure_stream_async(nc, stream, subjects, duplicate_window_s, storage),
                         creds)


async def ensure_stream_async(nc, stream: str, subjects: list[str], duplicate_window_s: float, storage: str) -> dict:
    try:
        return await stream_info(nc, stream)
    except JetStreamError as e:
        if "not found" not in str(e):
            raise
    config = {"name": stream, "subjects": subjects, "storage": storage, "retention": "limits",
              "duplicate_window": int(duplicate_window_s * 1e9), "num_replicas": 1}
    return await api(nc, f"$JS.API.STREAM.CREATE.{stream}", config)


def dedup_id(subject: str, data: bytes) -> str:
    """The Nats-Msg-Id of a row without an ``id`` column: a hash of its subject and data."""
    return hashlib.blake2b(subject.encode() + b"\x00" + data, digest_size=16).hexdigest()


class Publisher:
    """Publishes with reply subjects under one inbox (one wildcard subscription for the acks),
    at most ``window`` unacknowledged; republishes (same id) what is not acked in time."""

    def __init__(self, nc, window: int = PUBLISH_WINDOW, ack_timeout: float = ACK_TIMEOUT_S,
                 retries: int = PUBLISH_RETRIES):
        self.nc, self.window, self.ack_timeout, self.retries = nc, window, ack_timeout, retries
        self.unacked: dict[int, tuple[str, bytes, str | None]] = {}
        self.next_id = 0
        self.published = 0
        self.duplicates = 0
        self.error: JetStreamError | None = None
        self.space = asyncio.Event()
        self.target = 0               # wake the waiting publisher when this few are unacknowledged
        self.acked = 0

    async def open(self) -> Publisher:
        self.prefix = self.nc.new_inbox()
        self.sub = await self.nc.subscribe(self.prefix + ".*", cb=self._on_ack, pending_msgs_limit=1_000_000,
                                           pending_bytes_limit=1 << 30)
        return self

    async def _on_ack(self, msg) -> None:
        entry = self.unacked.pop(int(msg.subject.rpartition(".")[2]), None)
        if entry is None:  # the ack of a message already acked (it was republished)
            return
        data = msg.data
        if not data and msg.headers and msg.headers.get("Status") == NO_RESPONDERS_STATUS:
            self.error = self.error or JetStreamError(f"no JetStream stream captures subject {entry[0]!r}")
        elif b'"error"' in data:
            err = json.loads(data)["error"]
            self.error = self.error or JetStreamError(f"publishing to {entry[0]!r}: {err.get('description', err)}")
        elif b'"duplicate"' in data:
            self.duplicates += 1
        else:
            self.published += 1
        self.acked += 1
        if len(self.unacked) <= self.target or self.error:
            self.space.set()

    async def _send(self, i: int, subject: str, data: bytes, msg_id: str | None) -> None:
        await self.nc.publish(subject, data, reply=f"{self.prefix}.{i}",
                              headers={"Nats-Msg-Id": msg_id} if msg_id else None)

    async def publish(self, subject: str, data: bytes, msg_id: str | None) -> None:
        if len(self.unacked) >= self.window:
            await self._wait(self.window // 2)
        i = self.next_id
        self.next_id += 1
        self.unacked[i] = (subject, data, msg_id)
        await self._send(i, subject, data, msg_id)

    async def _wait(self, at_most: int) -> None:
        """Until at most ``at_most`` publishes are unacknowledged; republish (same ids) when no
        ack at all comes for ``ack_timeout``."""
        tries = 0
        while True:
            if self.error:
                raise self.error
            if len(self.unacked) <= at_most:
                return
            mark = self.acked
            self.target = at_most
            self.space.clear()
            try:
                await asyncio.wait_for(self.space.wait(), self.ack_timeout)
                continue
            except TimeoutError:
                if self.acked != mark:
                    continue  # slow, but acks come
            tries += 1
            if tries > self.retries:
                raise JetStreamError(f"{len(self.unacked)} publishes not acknowledged after {tries} tries "
                                     f"of {self.ack_timeout:g} s")
            log.warning("republishing %d unacknowledged messages (try %d)", len(self.unacked), tries)
            for i, (subject, data, msg_id) in list(self.unacked.items()):
                await self._send(i, subject, data, msg_id)
            await self.nc.flush()

    async def drain(self) -> None:
        await self.nc.flush()
        await self._wait(0)
        if self.error:
            raise self.error


def publish_messages(servers: str | list[str], subject: str, payloads: Iterable[bytes],
                     msg_ids: Iterable[str] | None = None) -> tuple[int, int]:
    """Publish payloads to a JetStream subject with acks; (stored, duplicates). For tests and benchmarks."""

    async def publish(nc) -> tuple[int, int]:
        pub = await Publisher(nc).open()
        ids = iter(msg_ids) if msg_ids is not None else None
        for data in payloads:
            await pub.publish(subject, data, next(ids) if ids is not None else None)
        await pub.drain()
        return pub.published, pub.duplicates

    return on_connection(servers, publish, name="gearbus-publish")


class JetStreamTransactionalSink(DataSink):
    """Exactly-once output into JetStream by two-phase commit (Flink's
    TwoPhaseCommitSinkFunction on JetStream's deduplication).

    :meth:`write` only keeps each value's JSON in memory; :meth:`pre_commit` seals them as
    the transaction of a checkpoint, which the task's snapshot carries; :meth:`commit`
    publishes the sealed transactions, acknowledged, once their checkpoint is complete.
    Every message's ``Nats-Msg-Id`` comes from its position —
    ``app.start/step/task/epoch/checkpoint/i``, fixed when the transaction is sealed — or
    from ``id_fn(value)``, so a commit repeated after a crash stores nothing twice, and
    another run of the same pipeline is never mistaken for a repeat. That relies on the stream's duplicate window: a
    repeat later than it (2 minutes by default) would store duplicates.

    Nothing written since the last barrier is ever published by this sink before its
    checkpoint completes, so readers see only committed output (read-committed).
    """

    transactional = True
    _security: Security | None = None  # a connection's own credential, when not ``creds``'s

    def __init__(self, subject: str, *, stream: str | None = None, id_fn=None, servers: str | list[str] | None = None,
                 duplicate_window_s: float = 120.0, creds: str | None = None):
        self.subject = subject
        self.creds = creds
        self.stream = stream
        self.id_fn = id_fn
        self.servers = server_list(servers)
        self.duplicate_window_s = duplicate_window_s

    def open(self, context: TaskContext) -> None:
        servers = servers_for(self.servers, context, f"write_jetstream({self.subject!r})")
        self._context = context
        step = context.config.get("steps", [context.processor_name])[-1]
        self._id_prefix = f"{context.app_id}.{context.app_start_ms}/{step}/{context.index}"
        self._values: list[bytes] = []
        self._ids: list[str] | None = [] if self.id_fn else None
        #: sealed, uncommitted transactions in checkpoint order: (id prefix, checkpoint id, values, ids or None)
        self._sealed: list[tuple[int, int, list[bytes], list[str] | None]] = []
        self._lock = threading.Lock()  # commit runs on a worker thread while pre_commit runs on the task's
        self._thread = LoopThread("jetstream-tx-sink")
        self._thread.call(self._connect(servers))
        if self.stream:
            self._thread.call(ensure_stream_async(self._nc, self.stream, [self.subject], self.duplicate_window_s,
                                                  "file"))

    async def _connect(self, servers: list[str]) -> None:
        self._nc = await connect(servers, name="gearbus-jetstream-tx-sink", creds=self.creds, security=self._security)
        self._publisher = await Publisher(self._nc).open()

    def write(self, records: list[Record]) -> None:
        dumps = json.dumps
        self._values.extend([dumps(r[0], ensure_ascii=False, separators=(",", ":")).encode() for r in records])
        if self.id_fn is not None:
            id_fn = self.id_fn
            self._ids.extend([str(id_fn(r[0])) for r in records])

    def pre_commit(self, checkpoint_id: int) -> None:
        if not self._values:
            return
        with self._lock:
            self._sealed.append((f"{self._id_prefix}/{self._context.epoch}/{checkpoint_id}", checkpoint_id,
                                 self._values, self._ids))
        self._values = []
        self._ids = [] if self.id_fn else None

    def commit(self, checkpoint_id: int) -> None:
        with self._lock:
            due = [t for t in self._sealed if t[1] <= checkpoint_id]
        if not due:
            return
        self._thread.call(self._publish(due))
        with self._lock:
            self._sealed = [t for t in self._sealed if t[1] > checkpoint_id]

    async def _publish(self, transactions) -> None:
        subject = self.subject
        for prefix, _, values, ids in transactions:
            for i, data in enumerate(values):
                await self._publisher.publish(subject, data, ids[i] if ids is not None else f"{prefix}/{i}")
        await self._publisher.drain()

    def snapshot(self) -> list[tuple[int, int, list[bytes], list[str] | None]]:
        with self._lock:
            return list(self._sealed)

    def rescale(self, states: list, index: int, parallelism: int) -> list:
        """Every old task's sealed transactions go to the new first task, which commits
        them again on restore (their ids were fixed when sealed: nothing is stored twice)."""
        return [sealed for state in states if state for sealed in state] if index == 0 else []

    def restore(self, state) -> None:
        """Commit the checkpoint's sealed transactions (again: duplicates are dropped) and
        forget anything written since."""
        self._values = []
        self._ids = [] if self.id_fn else None
        with self._lock:
            self._sealed = []
        if state:
            self._thread.call(self._publish(state))

    def close(self) -> None:
        if getattr(self, "_thread", None) is None:
            return
        pending = len(self._values) + sum(len(t[2]) for t in self._sealed)
        if pending:
            log.warning("jetstream sink %s closes with %d uncommitted records: dropped (a recovery replays them)",
                        self._id_prefix, pending)
        thread, self._thread = self._thread, None
        failure = thread.stop(self._nc.close())
        if failure is not None:
            log.debug("jetstream sink %s: closing: %s", self._id_prefix, failure)
