"""The master's durable state in a JetStream KV bucket: application records and the
next application id. Master HA builds on this: a new leader reloads everything here."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import msgpack
import nats.js.errors

from services.master.lease import LeaseLost
from shared import subjects
from shared.messages import AppError, AppState, AppSummary, AppType, IntermediateStreamSpec, Struct

API_TIMEOUT_S = 5.0  # a JetStream API request (nats-py's default)

#: Allowed application state transitions; anything else is a bug or a late report.
TRANSITIONS = {
    AppState.PENDING: {AppState.ACTIVE, AppState.SUCCEEDED, AppState.FAILED, AppState.TERMINATED},
    AppState.ACTIVE: {AppState.SUCCEEDED, AppState.FAILED, AppState.TERMINATED},
    AppState.SUCCEEDED: set(),
    AppState.FAILED: set(),
    AppState.TERMINATED: set(),
}


class ApplicationRecord(Struct):
    """Everything the master keeps about one application."""

    app_id: int
    name: str
    state: str
    submitted_ms: int
    artifact: str
    entry: str
    artifact_kind: str = "module"
    args: list[str] = dataclasses.field(default_factory=list)
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    user: str = ""
    priority: int = 0
    finished_ms: int = 0
    error: AppError | None = None
    appmaster_worker: str = ""
    artifact_digest: str = ""
    appmaster_attempt: int = 0  # the current AppMaster's attempt (0 first; each relaunch adds 1)
    app_type: str = AppType.STREAMING
    workers: list[str] = dataclasses.field(default_factory=list)  # SubmitApplication.workers
    submitter_dir: str = ""  # SubmitApplication.submitter_dir
    stage_apps: list[int] = dataclasses.field(default_factory=list)  # a multi-stage app's stages, in order
    streams: list[IntermediateStreamSpec] = dataclasses.field(default_factory=list)  # ... and its streams
    stage_of: int = 0  # a stage's multi-stage app (0: none)
    stage: int = 0

    def can_become(self, state: str) -> bool:
        return state in TRANSITIONS[self.state]

    def summary(self, **live) -> AppSummary:
        return AppSummary(
            app_id=self.app_id,
            name=self.name,
            state=self.state,
            submitted_ms=self.submitted_ms,
            finished_ms=self.finished_ms,
            user=self.user,
            error=self.error,
            appmaster_worker=self.appmaster_worker,
            app_type=self.app_type,
            stage_apps=list(self.stage_apps),
            stage_of=self.stage_of,
            stage=self.stage,
            **live,
        )


class WorkerRecord(Struct):
    """A worker the cluster has known, kept so a new leader knows whom to expect."""

    worker_id: str
    host: str
    pid: int
    slots: int


class StateStore:
    """Reads and writes the master's KV bucket. Every write is fenced: it happens only
    while the lease is valid, and as a compare-and-set on the revision this leader last
    saw, so a deposed leader can never overwrite its successor's state."""

    def __init__(self, nc, kv, lease):
        self.nc = nc
        self.kv = kv
        self.lease = lease
        self._revisions: dict[str, int] = {}
        self._turns: dict[str, asyncio.Lock] = {}  # one write of a key at a time

    @classmethod
    async def open(cls, nc, lease, replicas: int = 1) -> StateStore:
        js = nc.jetstream()
        try:
            kv = await js.key_value(subjects.STATE_BUCKET)
        except nats.js.errors.BucketNotFoundError:
            kv = await js.create_key_value(bucket=subjects.STATE_BUCKET, history=1, replicas=replicas)
        return cls(nc, kv, lease)

    def _fence(self) -> None:
        if not self.lease.valid():
            raise LeaseLost("this master does not hold the lease")

    async def _write(self, key: str, value: bytes) -> None:
        """Write ``key`` after any write of it under way, and see the write through even if
        the caller is cancelled (a kill cancels its app's launch, which may be recording
        its attempt): two writes at once, or one whose new revision was never noted, would
        make the next compare-and-set fail as if another master had written the key."""
        await asyncio.shield(self._write_in_turn(key, value))

    async def _write_in_turn(self, key: str, value: bytes) -> None:
        async with self._turns.setdefault(key, asyncio.Lock()):
            await self._write_now(key, value)

    async def _write_now(self, key: str, value: bytes) -> None:
        self._fence()
        last = self._revisions.get(key, 0)
        try:
            self._revisions[key] = (await self.kv.update(key, value, last=last) if last
                                    else await self.kv.create(key, value))
        except nats.js.errors.KeyWrongLastSequenceError:
            raise LeaseLost(f"{key} was changed by another master") from None

    async def next_app_id(self) -> int:
        """Take the next application id with compare-and-set, so no two apps share one."""
        while True:
            self._fence()
            try:
                entry = await self.kv.get(subjects.NEXT_APP_ID_KEY)
            except nats.js.errors.KeyNotFoundError:
                try:
                    await self.kv.create(subjects.NEXT_APP_ID_KEY, b"2")
                    return 1
                except nats.js.errors.KeyWrongLastSequenceError:
                    continue
            current = int(entry.value)
            try:
                await self.kv.update(subjects.NEXT_APP_ID_KEY, str(current + 1).encode(), last=entry.revision)
                return current
            except nats.js.errors.KeyWrongLastSequenceError:
                continue

    async def save(self, record: ApplicationRecord) -> None:
        await self._write(subjects.app_state_key(record.app_id), msgpack.packb(record.to_wire()))

    async def save_worker(self, record: WorkerRecord) -> None:
        await self._write(subjects.worker_state_key(record.worker_id), msgpack.packb(record.to_wire()))

    async def load(self) -> tuple[dict[int, ApplicationRecord], dict[str, WorkerRecord]]:
        """Everything a new leader needs: the applications and the workers known."""
        apps, workers = {}, {}
        for key in await self._keys():
            if not key.startswith(("apps.", "workers.")):
                continue
            try:
                entry = await self.kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                continue
            self._revisions[key] = entry.revision
            data = msgpack.unpackb(entry.value)
            if key.startswith("apps."):
                record = ApplicationRecord._from_fields(data, key)
                apps[record.app_id] = record
            else:
                worker = WorkerRecord._from_fields(data, key)
                workers[worker.worker_id] = worker
        return apps, workers

    async def _keys(self) -> list[str]:
        """Every key in the bucket, as its stream lists its subjects (the stream leader
        answers; paged as the server pages them). Not ``KeyValue.keys()``: that lists through
        a new consumer, and one made just after the stream (or the JetStream meta leader)
        changed leader can report nothing pending, an empty listing a new leader would take
        for a cluster without apps and workers."""
        stream, prefix = f"KV_{subjects.STATE_BUCKET}", f"$KV.{subjects.STATE_BUCKET}."
        found: list[str] = []
        while True:
            reply = await self.nc.request(f"$JS.API.STREAM.INFO.{stream}",
                                          json.dumps({"subjects_filter": ">", "offset": len(found)}).encode(),
                                          timeout=API_TIMEOUT_S)
            info = json.loads(reply.data)
            if "error" in info:
                nats.js.errors.APIError.from_error(info["error"])
            page = list(info["state"].get("subjects") or {})
            found.extend(page)
            if not page or len(found) >= info.get("total", 0):
                return [subject[len(prefix):] for subject in found]
