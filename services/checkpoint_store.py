"""Where checkpoints live: each task's snapshot (and each savepoint's state) in the app's own
JetStream object store, and each completed checkpoint's record (plus the app's latest, its
epoch and savepoint records) in the shared checkpoint KV bucket.

The master creates the KV bucket at start and an app's object store when it is submitted;
AppMasters and executors only open them.
"""

from __future__ import annotations

import asyncio

import msgpack
import nats.js.api
import nats.js.errors
from nats.js.object_store import OBJ_DEFAULT_CHUNK_SIZE

from gearbus.runtime.appmaster_state import StoreEpoch
from gearbus.runtime.savepoints import SavepointRecord
from gearbus.runtime.snapshots import TaskSnapshot
from shared import subjects
from shared.bus import object_bytes, ride_out
from shared.messages import AppEvent, AppVersion


async def ensure_buckets(js, replicas: int) -> None:
    """Create the checkpoint KV bucket unless it exists (master start)."""
    try:
        await js.key_value(subjects.CHECKPOINT_BUCKET)
    except nats.js.errors.BucketNotFoundError:
        await js.create_key_value(bucket=subjects.CHECKPOINT_BUCKET, history=1, replicas=replicas)


async def ensure_snapshot_bucket(js, app_id: int, replicas: int) -> None:
    """Create one app's snapshot object store unless it exists (master, at submission)."""
    try:
        await js.object_store(subjects.snapshot_bucket(app_id))
    except nats.js.errors.BucketNotFoundError:
        await js.create_object_store(subjects.snapshot_bucket(app_id), replicas=replicas)


class CheckpointStore:
    """One app's checkpoints. Every operation waits out a JetStream outage (a lost server,
    a stream electing its leader) for up to ``patience_s`` before it fails: a rollback or a
    restore would rather be late than fail the app."""

    def __init__(self, js, app_id: int, patience_s: float = 30.0, chunk_bytes: int = OBJ_DEFAULT_CHUNK_SIZE):
        """``chunk_bytes``: the chunk size of the objects it writes (shared.bus.object_chunk_bytes)."""
        self.js = js
        self.app_id = app_id
        self.patience_s = patience_s
        self.chunk_bytes = chunk_bytes
        self._objects = None
        self._kv = None

    async def _ride_out(self, op, what: str):
        return await ride_out(op, f"app {self.app_id}: {what}", self.patience_s)

    async def _store(self):
        if self._objects is None:
            self._objects = await self.js.object_store(subjects.snapshot_bucket(self.app_id))
        return self._objects

    async def _records(self):
        if self._kv is None:
            self._kv = await self.js.key_value(subjects.CHECKPOINT_BUCKET)
        return self._kv

    async def _put_object(self, name: str, data: bytes) -> None:
        async def put():
            meta = nats.js.api.ObjectMeta(name=name, options=nats.js.api.ObjectMetaOptions(max_chunk_size=self.chunk_bytes))
            await (await self._store()).put(name, data, meta=meta)
        await self._ride_out(put, f"storing {name}")

    async def _get_object(self, name: str, app_id: int | None = None) -> bytes | None:
        async def get():
            try:
                return await object_bytes(self.js, subjects.snapshot_bucket(self.app_id if app_id is None else app_id), name)
            except nats.js.errors.ObjectNotFoundError:
                return None
        return await self._ride_out(get, f"reading {name}")

    async def _put_value(self, key: str, value: bytes) -> None:
        async def put():
            await (await self._records()).put(key, value)
        await self._ride_out(put, f"writing {key}")

    async def _get_value(self, key: str) -> bytes | None:
        async def get():
            try:
                return (await (await self._records()).get(key)).value
            except nats.js.errors.KeyNotFoundError:
                return None
        return await self._ride_out(get, f"reading {key}")

    async def put_snapshot(self, checkpoint_id: int, epoch: int, task: tuple[int, int], data: bytes) -> None:
        await self._put_object(subjects.checkpoint_object(self.app_id, checkpoint_id, epoch, *task), data)

    async def get_snapshot(self, checkpoint_id: int, epoch: int, task: tuple[int, int]) -> bytes:
        name = subjects.checkpoint_object(self.app_id, checkpoint_id, epoch, *task)
        data = await self._get_object(name)
        if data is None:
            raise LookupError(f"checkpoint {checkpoint_id} has no snapshot of task {task} ({name})")
        return data

    async def snapshot_chain(self, checkpoint_id: int, epoch: int, task: tuple[int, int]) -> list[TaskSnapshot]:
        """A task's snapshot of a checkpoint and those it builds on, oldest first (see
        gearbus/runtime/snapshots.py), decoded off the loop; LookupError when one is missing."""
        chain: list[TaskSnapshot] = []
        at: tuple[int, int] | None = (checkpoint_id, epoch)
        while at is not None:
            envelope = await asyncio.to_thread(TaskSnapshot.decode, await self.get_snapshot(*at, task))
            chain.append(envelope)
            if envelope.base is not None and envelope.base[0] >= envelope.checkpoint_id:
                raise LookupError(f"the snapshot of task {task} in checkpoint {envelope.checkpoint_id} builds on a "
                                  f"later one ({envelope.base[0]})")
            at = envelope.base
        chain.reverse()
        return chain

    async def put_record(self, record: dict) -> None:
        """Store a completed checkpoint's record, then make it the app's latest."""
        data = msgpack.packb(record)
        await self._put_value(subjects.checkpoint_key(self.app_id, record["checkpoint_id"]), data)
        await self._put_value(subjects.checkpoint_latest_key(self.app_id), data)

    async def latest(self) -> dict | None:
        """The record of the app's latest completed checkpoint, or None."""
        value = await self._get_value(subjects.checkpoint_latest_key(self.app_id))
        return msgpack.unpackb(value) if value else None

    async def put_savepoint(self, record: SavepointRecord, parts: dict[tuple[str, int], bytes]) -> None:
        """Write a savepoint: each step's state per task index, then its record."""
        for (step, index), data in parts.items():
            await self._put_object(subjects.savepoint_object(record.name, step, index), data)
        await self._put_value(subjects.savepoint_key(record.name), msgpack.packb(record.to_dict()))

    async def savepoint(self, name: str) -> SavepointRecord | None:
        """A savepoint's record: app, checkpoint, and ``steps`` {step: parallelism}."""
        value = await self._get_value(subjects.savepoint_key(name))
        return SavepointRecord.from_dict(msgpack.unpackb(value)) if value else None

    async def savepoint_part(self, record: SavepointRecord, step: str, index: int) -> bytes:
        """One step's state in one task of a savepoint, from the store of the app that took it."""
        name = record.name
        data = await self._get_object(subjects.savepoint_object(name, step, index), record.app_id)
        if data is None:
            raise LookupError(f"savepoint {name!r} has no state of step {step!r} task {index}")
        return data

    async def put_epoch(self, record: StoreEpoch) -> None:
        """Record the app's current attempt, restarts so far and where rescales left its
        plan, so a relaunched AppMaster starts a newer attempt, keeps counting against the
        restart budget and runs the tasks that run now."""
        await self._put_value(subjects.checkpoint_epoch_key(self.app_id), msgpack.packb(
            {"epoch": record.epoch, "restarts": record.restarts, "parallelism": record.parallelism,
             "drop_state_checkpoint": record.drop_state_checkpoint,
             "versions": record.versions, "drop_state": record.drop_state, "trial": record.trial}))

    async def get_epoch(self) -> StoreEpoch:
        """The epoch record as last stored; epoch 0 before any."""
        value = await self._get_value(subjects.checkpoint_epoch_key(self.app_id))
        if not value:
            return StoreEpoch(0, 0)
        if value[:1].isdigit():  # "epoch restarts", as before rescales
            epoch, restarts = value.split()
            return StoreEpoch(int(epoch), int(restarts))
        data = msgpack.unpackb(value)
        return StoreEpoch(int(data["epoch"]), int(data["restarts"]), tuple(map(tuple, data["parallelism"])),
                          int(data.get("drop_state_checkpoint", 0)),
                          tuple(map(tuple, data.get("versions", ()))),
                          tuple((p, tuple(steps)) for p, steps in data.get("drop_state", ())),
                          tuple(data.get("trial", ())))

    async def put_versions(self, versions: list[AppVersion]) -> None:
        """The app's code history (gearbus replace), so a relaunched AppMaster loads the
        versions its processors run."""
        await self._put_value(subjects.versions_key(self.app_id), msgpack.packb([v.to_wire() for v in versions]))

    async def get_versions(self) -> list[AppVersion]:
        """The code history as last stored; empty before any replacement."""
        value = await self._get_value(subjects.versions_key(self.app_id))
        return [AppVersion._from_fields(v, "stored versions") for v in msgpack.unpackb(value)] if value else []

    async def put_events(self, events: list[AppEvent]) -> None:
        """The app's timeline (its last events), so a relaunched AppMaster goes on with it."""
        await self._put_value(subjects.events_key(self.app_id), msgpack.packb([e.to_wire() for e in events]))

    async def get_events(self) -> list[AppEvent]:
        value = await self._get_value(subjects.events_key(self.app_id))
        return [AppEvent._from_fields(e, "stored events") for e in msgpack.unpackb(value)] if value else []

    async def record(self, checkpoint_id: int) -> dict | None:
        value = await self._get_value(subjects.checkpoint_key(self.app_id, checkpoint_id))
        return msgpack.unpackb(value) if value else None

    async def delete(self, checkpoint_id: int, epoch: int, tasks: list[tuple[int, int]]) -> None:
        """Forget a checkpoint of ``epoch``: its snapshots and its record."""
        await self.delete_snapshots(checkpoint_id, epoch, tasks)

        async def delete():
            try:
                await (await self._records()).delete(subjects.checkpoint_key(self.app_id, checkpoint_id))
            except nats.js.errors.KeyNotFoundError:
                pass
        await self._ride_out(delete, f"deleting checkpoint {checkpoint_id}")

    async def delete_snapshots(self, checkpoint_id: int, epoch: int, tasks: list[tuple[int, int]]) -> None:
        """Delete these tasks' snapshots of a checkpoint stored under ``epoch``."""
        async def delete():
            store = await self._store()
            for task in tasks:
                try:
                    await store.delete(subjects.checkpoint_object(self.app_id, checkpoint_id, epoch, *task))
                except nats.js.errors.NotFoundError:
                    pass
        await self._ride_out(delete, f"deleting the snapshots of checkpoint {checkpoint_id}")
