"""Master election on JetStream KV: a leader lease with a per-key TTL, and the registry
of running masters.

The leader holds the key ``leader`` in the masters bucket, written with a ``Nats-TTL``
and renewed by compare-and-set on its own revision. If the leader stops renewing, the
server replaces the key with a marker once the TTL passes; a standby that sees the
marker takes over by compare-and-set on the marker's revision, so exactly one wins. The
revision a master won with is its term. A leader that cannot renew stops considering
itself leader *before* the TTL could have run out (by its own clock), so a deposed or
paused master never acts on a lease someone else may hold.
"""

from __future__ import annotations

import os
import socket
import time

import msgpack
import nats.errors
import nats.js.errors
import structlog
from nats.js import api

from shared import subjects
from shared.bus import RequestError
from shared.messages import ErrorCode

log = structlog.get_logger()

LEADER_KEY = "leader"
MARKER_HEADER = "Nats-Marker-Reason"
WRONG_LAST_SEQUENCE = (10071, 10164)


def _live(msg) -> bool:
    """A key's latest message holds a value (not absent, deleted or an expiry marker)."""
    return msg is not None and bool(msg.data) and MARKER_HEADER not in (msg.headers or {})


def _stale_here(registration: dict) -> bool:
    """A registration left by a master of this host whose process has exited."""
    if registration.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(registration.get("pid", 0)), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError):
        return False
    return False


class DuplicateMasterError(RuntimeError):
    """Another live master already uses this id."""


class LeaseLost(RequestError):
    """This master no longer holds the lease (or a key changed under it); it must not
    write or answer. Clients see "unavailable" and retry with the new leader."""

    def __init__(self, message: str):
        super().__init__(ErrorCode.UNAVAILABLE, message, retryable=True)


class LeaderLease:
    def __init__(self, js, master_id: str, ttl_s: int = 1, registry_ttl_s: int = 3, replicas: int = 1):
        self.js = js
        self.replicas = replicas
        self.master_id = master_id
        self.ttl_s = ttl_s
        self.registry_ttl_s = registry_ttl_s
        self.safety_s = min(0.25, ttl_s / 4)  # stop trusting the lease this long before it can expire
        self.term = 0  # the revision this master won the lease with; 0 while not leader
        self._revision = 0
        self._renewed_at = 0.0
        self._registered_revision = 0
        self.stream = f"KV_{subjects.MASTERS_BUCKET}"

    # --- the bucket and the registry ----------------------------------------------

    async def open(self) -> None:
        """Create the bucket if needed and register this master's id (refusing a duplicate)."""
        try:
            await self.js.key_value(subjects.MASTERS_BUCKET)
        except nats.js.errors.BucketNotFoundError:
            await self.js.create_key_value(bucket=subjects.MASTERS_BUCKET, history=1,
                                           limit_marker_ttl=self.ttl_s, replicas=self.replicas)
        key = subjects.master_registry_key(self.master_id)
        current = await self._last(key)
        if _live(current) and not _stale_here(msgpack.unpackb(current.data)):
            other = msgpack.unpackb(current.data)
            raise DuplicateMasterError(
                f"master id {self.master_id!r} is already in use by pid {other.get('pid')} on "
                f"{other.get('host')}; pick another --master-id (a stopped master's entry expires "
                f"within {self.registry_ttl_s} s)"
            )
        self._registered_revision = await self._cas(key, self._registration(), current.seq if current else 0,
                                                    self.registry_ttl_s)

    def _registration(self) -> bytes:
        return msgpack.packb({"master_id": self.master_id, "pid": os.getpid(), "host": socket.gethostname()})

    async def refresh_registration(self) -> None:
        key = subjects.master_registry_key(self.master_id)
        try:
            self._registered_revision = await self._cas(key, self._registration(), self._registered_revision,
                                                        self.registry_ttl_s)
        except LeaseLost:
            current = await self._last(key)
            self._registered_revision = await self._cas(key, self._registration(), current.seq if current else 0,
                                                        self.registry_ttl_s)

    async def masters(self) -> list[str]:
        """Ids of the masters whose registration is live."""
        found = []
        prefix = f"$KV.{subjects.MASTERS_BUCKET}.master."
        info = await self.js.stream_info(self.stream, subjects_filter=f"{prefix}>")
        for subject in sorted((info.state.subjects or {})):
            msg = await self._last_by_subject(subject)
            if _live(msg):
                found.append(msgpack.unpackb(msg.data)["master_id"])
        return found

    async def leader(self) -> str:
        msg = await self._last(LEADER_KEY)
        if not _live(msg):
            return ""
        return msgpack.unpackb(msg.data)["master_id"]

    # --- the lease ----------------------------------------------------------------

    def valid(self) -> bool:
        """True while this master may act as leader: it holds the lease and renewed it
        recently enough that it cannot have expired for anybody else."""
        return self.term > 0 and time.monotonic() - self._renewed_at < self.ttl_s - self.safety_s

    async def step(self) -> str | None:
        """One round of the election; returns "elected", "deposed" or None (no change)."""
        if self.term:
            return await self._renew()
        return await self._try_take()

    async def _renew(self) -> str | None:
        started = time.monotonic()
        try:
            self._revision = await self._cas(LEADER_KEY, self._value(), self._revision, self.ttl_s)
            self._renewed_at = started  # measured before the request: conservative
            return None
        except LeaseLost:
            log.warning("lease_taken_by_another_master", term=self.term)
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
            if self.valid():
                log.warning("lease_renewal_failed", error=repr(exc))
                return None
            log.error("lease_expired_without_renewal", error=repr(exc))
        self.term = 0
        return "deposed"

    async def _try_take(self) -> str | None:
        try:
            current = await self._last(LEADER_KEY)
            if _live(current):
                return None  # someone holds a live lease
            started = time.monotonic()
            self._revision = await self._cas(LEADER_KEY, self._value(), current.seq if current else 0, self.ttl_s)
        except LeaseLost:
            return None  # another standby won this round
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
            log.info("lease_unavailable", error=repr(exc))
            return None
        self._renewed_at = started
        self.term = self._revision
        return "elected"

    async def release(self) -> None:
        """Give the lease up at once (graceful shutdown), so a standby need not wait the TTL."""
        if not self.term:
            return
        self.term = 0
        try:
            kv = await self.js.key_value(subjects.MASTERS_BUCKET)
            await kv.delete(LEADER_KEY, last=self._revision)
        except Exception as exc:
            log.info("lease_release_failed", error=repr(exc))

    def _value(self) -> bytes:
        return msgpack.packb({"master_id": self.master_id})

    # --- JetStream primitives -----------------------------------------------------

    async def _cas(self, key: str, value: bytes, last: int, ttl_s: int) -> int:
        """Write ``key`` with a TTL only if its latest revision is ``last`` (0: absent)."""
        subject = f"$KV.{subjects.MASTERS_BUCKET}.{key}"
        try:
            ack = await self.js.publish(subject, value, headers={api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE: str(last)},
                                        msg_ttl=ttl_s, timeout=max(self.ttl_s / 2, 0.5))
        except nats.js.errors.APIError as exc:
            if exc.err_code in WRONG_LAST_SEQUENCE:
                raise LeaseLost(f"{key} changed under us") from None
            raise
        return ack.seq

    async def _last(self, key: str):
        return await self._last_by_subject(f"$KV.{subjects.MASTERS_BUCKET}.{key}")

    async def _last_by_subject(self, subject: str):
        try:
            return await self.js.get_last_msg(self.stream, subject)
        except nats.js.errors.NotFoundError:
            return None
