"""The AppMaster role: one per application. Plans tasks, obtains executors, launches
and starts tasks, collects heartbeats, and ends the app when its tasks end or fail."""

from __future__ import annotations

import asyncio
import collections
import os
import pickle
import re
import time
import traceback

import structlog

from gearbus.api.graph import Application
from gearbus.runtime import checkpoints as cp
from gearbus.runtime.guarantee import delivery_guarantee
from gearbus.runtime.savepoints import SavepointMismatch, SavepointRecord, claim, join_task_state, split_task_state
from gearbus.runtime.snapshots import TaskSnapshot
from services.appmaster.clock import ClockService
from services.appmaster.metrics import ProcessorMetricsAggregator
from services.checkpoint_store import CheckpointStore
from services.launch import WORKER_ENV, fetch_application, launch_from_env, launch_security, parse_launched_args
from shared import subjects
from shared.bus import RequestError, RequestTimeout
from shared.logging import configure
from shared.messages import (
    AppError,
    AppDag,
    AppMasterHeartbeat,
    AppMasterRegistered,
    ApplicationStateChanged,
    AppState,
    CheckpointComplete,
    CheckpointDeclined,
    CheckpointStats,
    EdgeInfo,
    ErrorCode,
    ExecutorHeartbeat,
    ExecutorKind,
    ExecutorLaunched,
    ExecutorRegistered,
    ExecutorStopped,
    LaunchExecutor,
    LaunchTasks,
    MasterElected,
    Placement,
    ProcessorInfo,
    RegisterAppMaster,
    RegisterExecutor,
    ReRegister,
    RequestResource,
    ResourceAllocated,
    SavepointTaken,
    ShutdownExecutor,
    StartAllTasks,
    TakeSavepoint,
    TaskCheckpointed,
    TaskCounters,
    TaskEnded,
    TaskFailed,
    TaskFinished,
    TaskId,
    TaskRegistered,
    TriggerCheckpoint,
    WorkerLost,
)
from shared.security import Security
from shared.service import Service, run_service

log = structlog.get_logger()

DEFAULT_EXECUTORS = 2
STARTUP_TIMEOUT_S = 60.0
EXECUTOR_TIMEOUT_HEARTBEATS = 5  # an executor silent this many heartbeat intervals is lost (hung or host lost)
DEFAULT_MAX_RESTARTS = 10  # app config "max_restarts": executor losses the app survives
DEFAULT_BLACKLIST_AFTER = 3  # app config "blacklist_after": executor failures on one worker before avoiding it
ADOPTION_WINDOW_HEARTBEATS = 2  # a relaunched AppMaster waits this long for the running executors
MASTER_RETRY_S = 30.0  # how long requests to the master are retried while it fails over
DEFAULT_STALL_TIMEOUT_S = 30.0  # app config "stall_timeout_s": a task whose watermark stands still this long is stalled
DEFAULT_CHECKPOINT_INTERVAL_MS = 1000  # app config "checkpoint_interval_ms"; 0 turns periodic checkpoints off
DEFAULT_CHECKPOINT_TIMEOUT_MS = 60_000  # app config "checkpoint_timeout_ms": then a checkpoint is abandoned
DEFAULT_CHECKPOINTS_KEPT = 3  # app config "checkpoints_kept"
DEFAULT_CHECKPOINT_FAILURES = 10  # app config "checkpoint_failures_tolerated": consecutive, then the app fails
SAVEPOINT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
SAVEPOINT_CHECKPOINT_ID = 1  # an app started from a savepoint restores it as its checkpoint 1
FENCE_TIMEOUT_S = 5.0
REPEAT_AFTER_S = 1.0  # a checkpoint's trigger, or the final completion, is sent again after this  # how long to wait for a worker to kill an executor declared lost


class AppFailure(Exception):
    """Ends the app as FAILED with the AppError it carries."""

    def __init__(self, error: AppError):
        super().__init__(error.message)
        self.error = error


class RelaunchFailed(Exception):
    """Starting a replacement executor on ``worker_id`` failed."""

    def __init__(self, worker_id: str, cause: BaseException):
        detail = cause.message if isinstance(cause, RequestError) else str(cause) or type(cause).__name__
        super().__init__(f"on worker {worker_id}: {detail}")
        self.worker_id = worker_id


class ExecutorSlot:
    """What the AppMaster tracks per executor."""

    def __init__(self, executor_id: int, worker_id: str):
        self.executor_id = executor_id
        self.worker_id = worker_id
        self.registered = asyncio.get_running_loop().create_future()
        self.tasks: list[TaskId] = []
        self.counters: dict[tuple[int, int], TaskCounters] = {}
        self.last_heartbeat = 0.0
        self.missed_logged = False
        self.stopped = False
        self.lost = False
        self.suspect = False  # lost with its worker perhaps: place its tasks elsewhere


class AppMaster(Service):
    role = "appmaster"

    def __init__(self, servers, launch: LaunchExecutor, worker_id: str, security: Security = Security()):
        super().__init__(servers, node_id=f"app{launch.app_id}-appmaster", security=security)
        self.launch = launch
        self.app_id = launch.app_id
        self.worker_id = worker_id
        self.app: Application | None = None
        self.executors: dict[int, ExecutorSlot] = {}
        self.unfinished: set[tuple[int, int]] = set()
        self.outcome: asyncio.Future | None = None
        self.heartbeat_interval = 1.0
        self.clock: ClockService | None = None
        self._stalled_logged: set[str] = set()
        self.config: dict = {}
        self.start_ms = 0
        self.epoch = 0
        self.restarts = 0
        self.blacklist: set[str] = set()
        self._failures: collections.Counter[str] = collections.Counter()
        self._recovering = asyncio.Lock()
        self._rollback_queued = False
        self.dag: AppDag | None = None
        self.metrics: ProcessorMetricsAggregator | None = None
        self.adopting = False
        self._all_adopted = asyncio.Event()  # while adopting: every planned task has a live executor
        self._ending = False
        self.store: CheckpointStore | None = None
        self.coordinator: cp.CheckpointCoordinator | None = None
        self.checkpoint_interval_ms = DEFAULT_CHECKPOINT_INTERVAL_MS
        self._checkpoint_failure = ""
        self._last_completed_ms = 0
        self.guarantee = ("", "")
        self._checkpoint_epochs: dict[int, int] = {}  # checkpoint id -> the epoch it was taken in
        self._last_trigger_sent = self._last_final_sent = 0.0
        self._savepoint_waiters: list[tuple[int, asyncio.Future]] = []  # (first usable checkpoint id, result)

    # --- lifecycle -------------------------------------------------------------

    async def setup(self) -> None:
        self.outcome = asyncio.get_running_loop().create_future()
        self.store = CheckpointStore(self.bus.js, self.app_id)
        await self.bus.serve(subjects.appmaster_executor_register(self.app_id), {RegisterExecutor: self.on_register})
        await self.bus.serve(subjects.appmaster_executor_heartbeat(self.app_id), {ExecutorHeartbeat: self.on_heartbeat})
        await self.bus.listen(subjects.appmaster_executor_stopped(self.app_id), {ExecutorStopped: self.on_stopped})
        await self.bus.listen(subjects.appmaster_task_finished(self.app_id), {TaskFinished: self.on_task_finished})
        await self.bus.listen(subjects.appmaster_task_failed(self.app_id), {TaskFailed: self.on_task_failed})
        await self.bus.listen(subjects.appmaster_task_ended(self.app_id), {TaskEnded: self.on_task_ended})
        await self.bus.listen(subjects.appmaster_checkpoint_ack(self.app_id),
                              {TaskCheckpointed: self.on_checkpointed, CheckpointDeclined: self.on_declined})
        await self.bus.listen(subjects.appmaster_worker_lost(self.app_id), {WorkerLost: self.on_worker_lost})
        await self.bus.serve(subjects.appmaster_savepoint(self.app_id), {TakeSavepoint: self.on_savepoint},
                             concurrent=True)
        await self.register()
        await self.bus.listen(subjects.MASTER_ELECTED, {MasterElected: self.on_master_changed})
        await self.bus.listen(subjects.appmaster_reregister(self.app_id), {ReRegister: self.on_master_changed})
        self.spawn(self.heartbeat_loop(), "heartbeat")
        self.spawn(self.drive(), "drive")

    async def register(self) -> None:
        registered = await self.bus.request(
            subjects.appmaster_register(self.app_id),
            RegisterAppMaster(self.app_id, self.worker_id, os.getpid()),
            expect=AppMasterRegistered,
            retry_s=MASTER_RETRY_S,
        )
        self.heartbeat_interval = registered.heartbeat_interval_s

    async def on_master_changed(self, msg: MasterElected | ReRegister) -> None:
        """A new leader (or one that does not know this app): register again."""
        log.info("reregistering", reason=type(msg).__name__)
        self.spawn(self.register(), "reregister")

    # --- the application's life ------------------------------------------------

    async def drive(self) -> None:
        """Run the app from planning to its end, then report and stop everything."""
        state, error = AppState.SUCCEEDED, None
        try:
            if self.launch.attempt:
                await self.adopt_app()
            else:
                await self.start_app()
            await self._report(AppState.ACTIVE, None)
            log.info("app_active", executors=len(self.executors), tasks=len(self.unfinished),
                     guarantee=self.guarantee[0])
            self.spawn(self.checkpoint_loop(), "checkpoints")
            state = await self.outcome or AppState.SUCCEEDED
        except AppFailure as failure:
            state, error = AppState.FAILED, failure.error
        except Exception as exc:
            state = AppState.FAILED
            error = AppError(type(exc).__name__, str(exc), "appmaster", traceback.format_exc())
            log.error("app_failed", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
        self._ending = True
        await self._send_heartbeat()  # the final counters, before the final state
        await self._report(state, error)
        await self.stop_executors("app ended" if state == AppState.SUCCEEDED else "app failed")
        self.stop()

    async def _load(self) -> Application:
        try:
            return await fetch_application(self.bus, self.launch)
        except Exception as exc:
            raise AppFailure(AppError(type(exc).__name__, str(exc), "loading the application",
                                     traceback.format_exc())) from None

    def _plan_tasks(self) -> list[TaskId]:
        return [TaskId(p.id, i) for p in self.app.graph.processors for i in range(p.parallelism)]

    async def _prepare(self, latest: cp.CheckpointMeta | None) -> list[TaskId]:
        """Load the app and set up what every AppMaster attempt needs: config, clock origin,
        checkpoint coordinator (continuing after ``latest``), guarantee."""
        self.app = await self._load()
        config = self.config = {**self.app.config, **self.launch.config}
        self.start_ms = self.launch.start_ms or int(time.time() * 1000)
        tasks = self._plan_tasks()
        self.coordinator = self._new_coordinator(latest)
        self.guarantee = delivery_guarantee(self.app, self.checkpoint_interval_ms > 0)
        self.unfinished = {(t.processor, t.index) for t in tasks}
        self.dag = dag_of(self.app)
        self.metrics = ProcessorMetricsAggregator(self.dag.processors)
        self.clock = ClockService([self._task_name(t) for t in tasks],
                                  float(config.get("stall_timeout_s", DEFAULT_STALL_TIMEOUT_S)), time.monotonic())
        return tasks

    def _new_coordinator(self, latest: cp.CheckpointMeta | None) -> cp.CheckpointCoordinator:
        """The checkpoint coordinator, from the app's config, continuing after ``latest``."""
        config = self.config
        keys = [(t.processor, t.index) for t in self._plan_tasks()]
        sources = [(p.id, i) for p in self.app.graph.processors if p.is_source for i in range(p.parallelism)]
        try:
            self.checkpoint_interval_ms = int(config.get("checkpoint_interval_ms", DEFAULT_CHECKPOINT_INTERVAL_MS))
            return cp.CheckpointCoordinator(
                keys, sources, interval_s=self.checkpoint_interval_ms / 1000,
                timeout_s=int(config.get("checkpoint_timeout_ms", DEFAULT_CHECKPOINT_TIMEOUT_MS)) / 1000,
                keep=int(config.get("checkpoints_kept", DEFAULT_CHECKPOINTS_KEPT)),
                max_consecutive_failures=int(config.get("checkpoint_failures_tolerated", DEFAULT_CHECKPOINT_FAILURES)),
                epoch=self.epoch, restored_from=latest)
        except (TypeError, ValueError) as exc:
            raise AppFailure(AppError("ConfigError", f"checkpoint configuration: {exc}", "planning tasks")) from None

    async def start_app(self) -> None:
        tasks = await self._prepare(None)
        restore = None
        if self.config.get("from_savepoint"):
            restore = await self._from_savepoint(str(self.config["from_savepoint"]),
                                                 bool(self.config.get("allow_unclaimed_state")))
            self.coordinator = self._new_coordinator(restore)
        await self.store.put_epoch(self.epoch, self.restarts)
        config = self.config
        wanted = max(1, min(int(config.get("executors", DEFAULT_EXECUTORS)), len(tasks)))
        allocated = await self.bus.request(
            subjects.resource_request(self.app_id),
            RequestResource(self.app_id, wanted, min_slots=1, placement=config.get("placement", Placement.ANY),
                            worker_id=config.get("worker_id", ""), priority=self.launch.priority),
            timeout=STARTUP_TIMEOUT_S + 5,
            expect=ResourceAllocated,
            retry_s=MASTER_RETRY_S,
        )
        for allocation in allocated.allocations:
            for _ in range(allocation.slots):
                executor_id = len(self.executors)
                self.executors[executor_id] = ExecutorSlot(executor_id, allocation.worker_id)
        await asyncio.gather(*(self._launch_executor(slot) for slot in self.executors.values()))
        await asyncio.wait_for(
            asyncio.gather(*(slot.registered for slot in self.executors.values())), STARTUP_TIMEOUT_S
        )
        slots = list(self.executors.values())
        placement = config.get("task_placement", "by_index")
        if placement not in ("by_index", "round_robin"):
            raise AppFailure(AppError("ConfigError", f"task_placement must be 'by_index' or 'round_robin', "
                                                     f"got {placement!r}", "planning tasks"))
        for n, task in enumerate(tasks):
            # by_index puts task i of every processor together (Flink's slot sharing), so
            # co-located partitions stay in one process; round_robin spreads processors.
            slots[(task.index if placement == "by_index" else n) % len(slots)].tasks.append(task)
        await self._run_attempt(restore)

    async def adopt_app(self) -> None:
        """A relaunched AppMaster: the executors still running register with it (with the
        tasks they host), then the whole app rolls back to the last completed checkpoint
        in a new attempt (what the lost AppMaster was doing is unknown); tasks nobody
        hosts any more get new executors."""
        record = await self.store.latest()
        latest = cp.CheckpointMeta.from_dict(record) if record else None
        epoch, self.restarts = await self.store.get_epoch()
        self.epoch = epoch + 1
        await self._prepare(latest)
        self.adopting = True
        await self.bus.publish(subjects.executor_reregister(self.app_id), ReRegister("the AppMaster was relaunched"))
        try:  # executors answer within the window; once every task has its executor, no need to wait on
            await asyncio.wait_for(self._all_adopted.wait(), ADOPTION_WINDOW_HEARTBEATS * self.heartbeat_interval)
        except asyncio.TimeoutError:
            pass
        self.adopting = False
        orphans = self._unhosted()
        log.info("app_adopted", executors=len(self.executors), orphaned_tasks=len(orphans),
                 restore_checkpoint=latest.checkpoint_id if latest else 0, epoch=self.epoch)
        await self.store.put_epoch(self.epoch, self.restarts)
        if orphans:
            lost = ExecutorSlot(-1, "")
            lost.tasks = orphans
            await self._place_lost_tasks([lost], set())
        await self._run_attempt(latest)

    def _unhosted(self) -> list[TaskId]:
        """The planned tasks that no live executor hosts."""
        hosted = {(t.processor, t.index) for slot in self._live_slots() for t in slot.tasks}
        return [t for t in self._plan_tasks() if (t.processor, t.index) not in hosted]

    def _live_slots(self) -> list[ExecutorSlot]:
        return [slot for slot in self.executors.values() if not slot.lost]

    async def _run_attempt(self, restore: cp.CheckpointMeta | None) -> None:
        """Launch every live executor's tasks in the current epoch (replacing older ones),
        restored from checkpoint ``restore`` (None: a fresh start); start them once all
        are subscribed."""
        slots = self._live_slots()
        await asyncio.gather(*(self._launch_tasks(slot, restore) for slot in slots))
        for slot in slots:
            await self.bus.request(subjects.executor_control(self.app_id, slot.executor_id), StartAllTasks())
        self._act(self.coordinator.start(time.monotonic()))

    async def _launch_tasks(self, slot: ExecutorSlot, restore: cp.CheckpointMeta | None) -> None:
        await self.bus.request(
            subjects.executor_control(self.app_id, slot.executor_id),
            LaunchTasks(slot.tasks, self.app.graph.digest(), self.start_ms, self.epoch,
                        restore.checkpoint_id if restore else 0, restore.epoch if restore else 0),
            expect=TaskRegistered,
        )

    # --- checkpoints -----------------------------------------------------------------

    async def checkpoint_loop(self) -> None:
        """Feed the coordinator the clock; it decides when to checkpoint or give up."""
        period = max(min(self.checkpoint_interval_ms / 4000, 0.25), 0.01) if self.checkpoint_interval_ms > 0 else 0.25
        while not self._ending:
            if not self._recovering.locked():
                now = time.monotonic()
                self._act(self.coordinator.tick(now))
                await self._repeat_lost_messages(now)
            await asyncio.sleep(period)

    async def _repeat_lost_messages(self, now: float) -> None:
        """Control messages are core NATS: a server restart can lose them. A checkpoint in
        flight for over a second is triggered again (sources ignore a barrier they passed,
        executors repeat their acks); a final checkpoint is announced again until every task
        finished (commits are idempotent)."""
        in_flight = self.coordinator.in_flight
        if in_flight is not None and self.coordinator.phase is cp.Phase.IN_FLIGHT \
                and now - self._last_trigger_sent >= REPEAT_AFTER_S:
            self._last_trigger_sent = now
            await self.bus.publish(subjects.checkpoint_trigger(self.app_id),
                                   TriggerCheckpoint(in_flight, self.coordinator.epoch))
        latest = self.coordinator.latest()
        if latest is not None and latest.final and self.unfinished and now - self._last_final_sent >= REPEAT_AFTER_S:
            self._last_final_sent = now
            await self.bus.publish(subjects.checkpoint_complete(self.app_id),
                                   CheckpointComplete(latest.checkpoint_id, latest.epoch, True))

    def _act(self, actions: list) -> None:
        """Carry out what the coordinator decided."""
        for action in actions:
            kind = type(action)
            if kind is cp.TriggerCheckpoint:
                self._checkpoint_epochs[action.checkpoint_id] = action.epoch
                self._last_trigger_sent = time.monotonic()
                self.spawn(self.bus.publish(subjects.checkpoint_trigger(self.app_id),
                                            TriggerCheckpoint(action.checkpoint_id, action.epoch)),
                           f"trigger-{action.checkpoint_id}")
            elif kind is cp.StoreCheckpoint:
                self.spawn(self._store_checkpoint(action.meta), f"store-{action.meta.checkpoint_id}")
            elif kind is cp.NotifyComplete:
                log.info("checkpoint_completed", checkpoint_id=action.checkpoint_id, final=action.final)
                self._savepoint_checkpoint_ended(action.checkpoint_id, self.coordinator.latest(), "")
                self._last_completed_ms = int(time.time() * 1000)
                self._last_final_sent = time.monotonic()
                self.spawn(self.bus.publish(subjects.checkpoint_complete(self.app_id),
                                            CheckpointComplete(action.checkpoint_id, action.epoch, action.final)),
                           f"complete-{action.checkpoint_id}")
            elif kind is cp.PruneCheckpoints:
                self.spawn(self._prune(action.checkpoint_ids), "prune-checkpoints")
            elif kind is cp.AbandonCheckpoint:
                self._savepoint_checkpoint_ended(action.checkpoint_id, None, action.reason)
                self._checkpoint_failure = f"checkpoint {action.checkpoint_id}: {action.reason}"
                log.warning("checkpoint_abandoned", checkpoint_id=action.checkpoint_id, reason=action.reason)
                self.spawn(self._prune((action.checkpoint_id,)), f"discard-{action.checkpoint_id}")
            elif kind is cp.FailApplication:
                self._fail(AppError("CheckpointsFailing", action.reason, "checkpoint coordinator"))

    async def _store_checkpoint(self, meta: cp.CheckpointMeta) -> None:
        try:
            await self.store.put_record(meta.to_dict())
        except Exception as exc:
            self._act(self.coordinator.store_failed(meta.checkpoint_id, f"{type(exc).__name__}: {exc}",
                                                    time.monotonic()))
            return
        self._act(self.coordinator.stored(meta.checkpoint_id, time.monotonic()))

    async def _prune(self, checkpoint_ids) -> None:
        tasks = [(t.processor, t.index) for t in self._plan_tasks()]
        for checkpoint_id in checkpoint_ids:
            try:
                epoch = self._checkpoint_epochs.pop(checkpoint_id, None)
                if epoch is None:  # completed under an earlier AppMaster
                    record = await self.store.record(checkpoint_id)
                    if record is None:
                        continue
                    epoch = record["epoch"]
                await self.store.delete(checkpoint_id, epoch, tasks)
            except Exception as exc:
                log.warning("checkpoint_prune_failed", checkpoint_id=checkpoint_id, error=repr(exc))

    # --- savepoints ----------------------------------------------------------------

    async def on_savepoint(self, msg: TakeSavepoint) -> SavepointTaken:
        """Checkpoint now, then keep that checkpoint's state by step under ``msg.name``;
        with ``msg.stop`` the app then ends (TERMINATED)."""
        if self.coordinator is None or self._ending or self.adopting:
            raise RequestError(ErrorCode.UNAVAILABLE, f"app {self.app_id} is not running: no savepoint now",
                               retryable=True)
        if msg.name and not SAVEPOINT_NAME.fullmatch(msg.name):
            raise RequestError(ErrorCode.BAD_REQUEST, f"savepoint name {msg.name!r}: use 1-64 letters, digits, "
                                                      "'-' or '_'")
        if msg.name and await self.store.savepoint(msg.name) is not None:
            raise RequestError(ErrorCode.CONFLICT, f"a savepoint named {msg.name!r} already exists")
        done = asyncio.get_running_loop().create_future()
        self._savepoint_waiters.append((self.coordinator.next_id, done))
        self._act(self.coordinator.request(time.monotonic()))
        meta: cp.CheckpointMeta = await done
        name = msg.name or f"app{self.app_id}-{meta.checkpoint_id}"
        steps = await self._write_savepoint(name, meta)
        log.info("savepoint_taken", name=name, checkpoint_id=meta.checkpoint_id, stop=msg.stop)
        if msg.stop and not self.outcome.done():
            self.outcome.set_result(AppState.TERMINATED)
        return SavepointTaken(self.app_id, name, meta.checkpoint_id, meta.size_bytes, sorted(steps))

    def _savepoint_checkpoint_ended(self, checkpoint_id: int, meta: cp.CheckpointMeta | None, reason: str) -> None:
        """A checkpoint completed (``meta``) or was abandoned: answer the savepoints waiting for it."""
        waiting = []
        for first_id, done in self._savepoint_waiters:
            if done.done():
                continue
            if checkpoint_id < first_id:
                waiting.append((first_id, done))
            elif meta is not None:
                done.set_result(meta)
            else:
                done.set_exception(RequestError(ErrorCode.UNAVAILABLE, f"the savepoint's checkpoint "
                                                                       f"{checkpoint_id} failed: {reason}", True))
        self._savepoint_waiters = waiting

    async def _write_savepoint(self, name: str, meta: cp.CheckpointMeta) -> dict[str, int]:
        """Copy a completed checkpoint's state, step by step, under the savepoint's name."""
        parts: dict[tuple[str, int], bytes] = {}
        steps: dict[str, int] = {}
        for processor in self.app.graph.processors:
            for index in range(processor.parallelism):
                data = await self.store.get_snapshot(meta.checkpoint_id, meta.epoch, (processor.id, index))
                for step, state in split_task_state(processor, TaskSnapshot.decode(data).state).items():
                    parts[(step, index)] = pickle.dumps(state, pickle.HIGHEST_PROTOCOL)
                    steps[step] = processor.parallelism
        record = SavepointRecord(name, self.app_id, self.app.name, meta.checkpoint_id, int(time.time() * 1000), steps)
        await self.store.put_savepoint(record, parts)
        return steps

    async def _from_savepoint(self, name: str, allow_unclaimed: bool) -> cp.CheckpointMeta:
        """Turn a savepoint into this app's first checkpoint, each task's state joined from
        the steps it claims; the tasks then start restored from it."""
        record = await self.store.savepoint(name)
        if record is None:
            raise AppFailure(AppError("SavepointNotFound", f"no savepoint named {name!r}", "restoring a savepoint"))
        try:
            claimed = claim(self.app, record.steps, allow_unclaimed)
        except SavepointMismatch as exc:
            raise AppFailure(AppError("SavepointMismatch", f"savepoint {name!r}: {exc}",
                                      "restoring a savepoint")) from None
        size, tasks = 0, []
        for processor in self.app.graph.processors:
            mine = [step for step, owner in claimed.items() if owner is processor]
            for index in range(processor.parallelism):
                states = {step: pickle.loads(await self.store.savepoint_part(record, step, index)) for step in mine}
                data = TaskSnapshot.seeded(SAVEPOINT_CHECKPOINT_ID,
                                           join_task_state(processor, states) if states else None).encode()
                await self.store.put_snapshot(SAVEPOINT_CHECKPOINT_ID, self.epoch, (processor.id, index), data)
                size += len(data)
                tasks.append((processor.id, index))
        meta = cp.CheckpointMeta(SAVEPOINT_CHECKPOINT_ID, self.epoch, time.monotonic(), 0.0, size, tuple(tasks), False)
        await self.store.put_record(meta.to_dict())
        log.info("restoring_savepoint", name=name, steps=sorted(claimed), from_app=record.app_id)
        return meta

    async def on_checkpointed(self, msg: TaskCheckpointed) -> None:
        self._act(self.coordinator.ack(msg.checkpoint_id, msg.epoch, (msg.task.processor, msg.task.index),
                                       msg.size_bytes, msg.ended, time.monotonic()))

    async def on_declined(self, msg: CheckpointDeclined) -> None:
        self._act(self.coordinator.decline(msg.checkpoint_id, msg.epoch, (msg.task.processor, msg.task.index),
                                           msg.reason, time.monotonic()))

    async def on_task_ended(self, msg: TaskEnded) -> None:
        if msg.epoch == self.epoch and self.coordinator is not None:
            self._act(self.coordinator.task_ended((msg.task.processor, msg.task.index), time.monotonic()))

    # --- recovery ------------------------------------------------------------------

    def executor_lost(self, slot: ExecutorSlot, reason: str, worker_suspect: bool = False) -> None:
        """An executor is gone (or declared gone) while the app runs: fence it, then roll
        the whole app back to the last completed checkpoint in a new attempt.
        ``worker_suspect``: its worker may be gone too (it went silent), so avoid it."""
        if self._ending or slot.lost:
            return
        slot.lost = slot.stopped = True
        slot.suspect = worker_suspect
        log.error("executor_lost", executor_id=slot.executor_id, worker_id=slot.worker_id, reason=reason)
        if not slot.registered.done():
            slot.registered.set_exception(AppFailure(AppError("ExecutorLost", reason, "starting executors")))
        if self.app is None or self.clock is None:  # still starting: the start-up fails instead
            self._fail(AppError("ExecutorLost", reason, f"executor {slot.executor_id}"))
            return
        self.spawn(self._fence(slot, reason), f"fence-executor-{slot.executor_id}")
        self.spawn(self._rollback(reason, slot.worker_id, f"executor {slot.executor_id}"),
                   f"recover-executor-{slot.executor_id}")

    async def _fence(self, slot: ExecutorSlot, reason: str) -> None:
        """Have the worker kill the lost executor (it may only be hung or stopped); if the
        worker cannot be reached, the executor's next heartbeat is answered "fenced"."""
        if not slot.worker_id:
            return
        try:
            await self.bus.request(subjects.worker_shutdown(slot.worker_id, self.app_id),
                                   ShutdownExecutor(self.app_id, slot.executor_id, f"fenced: {reason}", force=True),
                                   timeout=FENCE_TIMEOUT_S)
        except RequestError as exc:
            log.warning("fence_kill_failed", executor_id=slot.executor_id, worker_id=slot.worker_id,
                        error=exc.message)

    def _count_failure(self, worker_id: str, reason: str, where: str) -> bool:
        """Record a failure on ``worker_id``; False once the restart budget is spent."""
        self.restarts += 1
        failures = self._failures[worker_id] = self._failures[worker_id] + 1
        if worker_id and failures >= int(self.config.get("blacklist_after", DEFAULT_BLACKLIST_AFTER)) \
                and worker_id not in self.blacklist:
            log.warning("worker_blacklisted", worker_id=worker_id, failures=failures)
            self.blacklist.add(worker_id)
        budget = int(self.config.get("max_restarts", DEFAULT_MAX_RESTARTS))
        if self.restarts > budget:
            self._fail(AppError("RestartBudgetExhausted", f"{reason}; gave up after {budget} restarts", where))
            return False
        return True

    async def _rollback(self, reason: str, worker_id: str, where: str, failed_epoch: int | None = None) -> None:
        """Global recovery: a new epoch; lost executors' tasks get new executors; every
        task restarts from the last completed checkpoint (sources rewind, sinks re-commit
        what it sealed, frames of the old epoch are dropped everywhere).

        ``failed_epoch``: a task of that epoch failed; a rollback already under way, or
        done since, covers it (one lost NATS server fails many tasks at once)."""
        def covered() -> bool:
            return failed_epoch is not None and (self._rollback_queued or failed_epoch < self.epoch)

        if self._ending or covered() or not self._count_failure(worker_id, reason, where):
            return
        if self._rollback_queued:  # a rollback that has not begun yet covers this failure too
            return
        self._rollback_queued = True
        async with self._recovering:
            self._rollback_queued = False
            if self._ending or (failed_epoch is not None and failed_epoch < self.epoch):
                return
            self.epoch += 1
            self._act(self.coordinator.restart(self.epoch, time.monotonic()))
            restore = self.coordinator.latest()
            log.warning("rolling_back", reason=reason, epoch=self.epoch,
                        restore_checkpoint=restore.checkpoint_id if restore else 0, restarts=self.restarts)
            self.unfinished = {(t.processor, t.index) for t in self._plan_tasks()}
            while not self._ending:
                try:
                    await self.store.put_epoch(self.epoch, self.restarts)
                    lost = [slot for slot in self.executors.values() if slot.lost and slot.tasks]
                    await self._place_lost_tasks(lost, {s.worker_id for s in lost if s.suspect})
                    await self._run_attempt(restore)
                    log.info("rolled_back", epoch=self.epoch)
                    return
                except AppFailure as failure:
                    self._fail(failure.error)
                    return
                except RelaunchFailed as failure:
                    log.warning("relaunch_failed", worker_id=failure.worker_id, error=str(failure))
                    if not self._count_failure(failure.worker_id, f"{reason}; relaunching its tasks failed: "
                                                                  f"{failure}", where):
                        return
                except RequestError as exc:  # an executor failed while tasks were being launched
                    log.warning("rollback_interrupted", error=exc.message)
                    if not self._count_failure("", f"{reason}; then {exc.message}", where):
                        return
                    self.epoch += 1
                    self._act(self.coordinator.restart(self.epoch, time.monotonic()))

    async def _place_lost_tasks(self, lost: list[ExecutorSlot], avoid: set[str]) -> None:
        """Give the tasks of lost executors to new executors (one per lost executor)."""
        for slot in lost:
            tasks, slot.tasks = slot.tasks, []
            try:
                await self._relaunch(tasks, self.blacklist | avoid)
            except RelaunchFailed as failure:
                slot.tasks = tasks  # still to place, on the next try
                avoid.add(failure.worker_id)
                raise

    async def _relaunch(self, tasks: list[TaskId], avoid: set[str]) -> ExecutorSlot:
        """Get a slot away from ``avoid`` (when the cluster has one) and start an executor
        there for ``tasks``."""
        allocated = None
        for exclude in (avoid, self.blacklist):  # away from suspects if possible, else anywhere allowed
            try:
                allocated = await self.bus.request(
                    subjects.resource_request(self.app_id),
                    RequestResource(self.app_id, 1, priority=self.launch.priority, exclude_workers=sorted(exclude)),
                    timeout=STARTUP_TIMEOUT_S + 5, expect=ResourceAllocated, retry_s=MASTER_RETRY_S)
                break
            except RequestError as exc:
                if exclude == self.blacklist:
                    raise AppFailure(AppError("RecoveryFailed", f"no slot for the lost tasks: {exc.message}",
                                              "recovery")) from None
        slot = ExecutorSlot(max(self.executors, default=-1) + 1, allocated.allocations[0].worker_id)
        slot.tasks = tasks
        self.executors[slot.executor_id] = slot
        try:
            await self._launch_executor(slot)
            await asyncio.wait_for(slot.registered, STARTUP_TIMEOUT_S)
        except (RequestError, AppFailure, asyncio.TimeoutError) as exc:
            slot.lost = slot.stopped = True
            slot.tasks = []
            raise RelaunchFailed(slot.worker_id, exc) from None
        log.info("executor_replaced", executor_id=slot.executor_id, worker_id=slot.worker_id, tasks=len(tasks))
        return slot

    async def on_worker_lost(self, msg: WorkerLost) -> None:
        for slot in list(self.executors.values()):
            if slot.worker_id == msg.worker_id and not slot.stopped:
                self.executor_lost(slot, f"worker {msg.worker_id} was lost", worker_suspect=True)

    async def _launch_executor(self, slot: ExecutorSlot) -> None:
        launch = LaunchExecutor(
            app_id=self.app_id, executor_id=slot.executor_id, kind=ExecutorKind.EXECUTOR,
            artifact=self.launch.artifact, entry=self.launch.entry, artifact_kind=self.launch.artifact_kind,
            args=self.launch.args, config=self.launch.config, app_name=self.launch.app_name,
            priority=self.launch.priority, worker_id=slot.worker_id,
        )
        await self.bus.request(subjects.executor_launch(self.app_id), launch, expect=ExecutorLaunched)

    async def stop_executors(self, reason: str) -> None:
        for slot in self.executors.values():
            if slot.stopped:
                continue
            try:
                await self.bus.request(
                    subjects.worker_shutdown(slot.worker_id, self.app_id),
                    ShutdownExecutor(self.app_id, slot.executor_id, reason),
                    timeout=5,
                )
            except RequestError as exc:
                log.warning("executor_shutdown_failed", executor_id=slot.executor_id, error=exc.message)

    async def _report(self, state: str, error: AppError | None) -> None:
        """Tell the master the app's state; retried through a fail-over (a repeated
        report is harmless: the master ignores one that changes nothing)."""
        deadline = time.monotonic() + MASTER_RETRY_S
        while True:
            try:
                await self.bus.request(subjects.appmaster_state(self.app_id), ApplicationStateChanged(self.app_id, state, error),
                                       timeout=5, retry_s=MASTER_RETRY_S)
                return
            except RequestTimeout as exc:
                if time.monotonic() > deadline:
                    log.error("state_report_failed", state=state, error=exc.message)
                    return
            except RequestError as exc:
                log.error("state_report_failed", state=state, error=exc.message)
                return

    def _fail(self, error: AppError) -> None:
        if not self.outcome.done():
            self.outcome.set_exception(AppFailure(error))

    # --- handlers --------------------------------------------------------------

    async def on_register(self, msg: RegisterExecutor) -> ExecutorRegistered:
        slot = self.executors.get(msg.executor_id)
        if slot is None and self.adopting:  # an executor of the previous AppMaster
            slot = self.executors[msg.executor_id] = ExecutorSlot(msg.executor_id, msg.worker_id)
            slot.tasks = list(msg.tasks)
        if slot is None:
            raise RequestError(ErrorCode.NOT_FOUND, f"app {self.app_id} launched no executor {msg.executor_id}")
        if slot.lost:
            raise RequestError(ErrorCode.FENCED, f"executor {msg.executor_id} was declared lost and replaced")
        if slot.registered.done():
            raise RequestError(
                ErrorCode.CONFLICT,
                f"executor id {msg.executor_id} is already registered (from worker {slot.worker_id}); "
                f"duplicate from pid {msg.pid} on worker {msg.worker_id} refused",
            )
        slot.last_heartbeat = time.time()
        slot.registered.set_result(None)
        log.info("executor_registered", executor_id=msg.executor_id, worker_id=msg.worker_id)
        if self.adopting and not self._unhosted():
            self._all_adopted.set()
        return ExecutorRegistered(self.app_id, msg.executor_id, self.heartbeat_interval)

    async def on_heartbeat(self, msg: ExecutorHeartbeat) -> None:
        slot = self.executors.get(msg.executor_id)
        if slot is None:
            return
        if slot.lost:
            raise RequestError(ErrorCode.FENCED, f"executor {msg.executor_id} was declared lost and replaced: stop")
        slot.last_heartbeat = time.time()
        slot.missed_logged = False
        for c in msg.tasks:
            if c.epoch == self.epoch:
                slot.counters[(c.task.processor, c.task.index)] = c

    async def on_stopped(self, msg: ExecutorStopped) -> None:
        slot = self.executors.get(msg.executor_id)
        if slot is None or msg.kind != ExecutorKind.EXECUTOR:
            return
        if self._ending:
            slot.stopped = True
            return
        if msg.worker_gone:
            self.executor_lost(slot, f"executor {msg.executor_id} lost its worker {msg.worker_id}", worker_suspect=True)
        else:
            self.executor_lost(slot, f"executor {msg.executor_id} on worker {msg.worker_id} exited with code "
                                     f"{msg.exit_code}")

    async def on_task_finished(self, msg: TaskFinished) -> None:
        if msg.epoch != self.epoch:
            return
        key = (msg.counters.task.processor, msg.counters.task.index)
        slot = self.executors.get(msg.executor_id)
        if slot is not None:
            slot.counters[key] = msg.counters
        self.unfinished.discard(key)
        if not self.unfinished and not self.outcome.done():
            log.info("all_tasks_finished")
            self.outcome.set_result(None)

    async def on_task_failed(self, msg: TaskFailed) -> None:
        if msg.epoch != self.epoch:
            return
        task = f"{msg.task.processor}.{msg.task.index}"
        if msg.recoverable:
            log.warning("task_failed_recovering", task=task, error=msg.error.message)
            slot = self.executors.get(msg.executor_id)
            self.spawn(self._rollback(f"task {task} failed: {msg.error.message}", slot.worker_id if slot else "",
                                      f"task {task}", msg.epoch), f"recover-task-{task}")
            return
        log.error("task_failed", task=task, error=msg.error.message, exception=msg.error.traceback)
        self._fail(msg.error)

    def _checkpoint_stats(self) -> CheckpointStats | None:
        if self.coordinator is None:
            return None
        stats, latest = self.coordinator.stats(), self.coordinator.latest()
        return CheckpointStats(
            interval_ms=self.checkpoint_interval_ms,
            last_id=latest.checkpoint_id if latest else 0,
            last_completed_ms=self._last_completed_ms if latest and stats.latest_completed_at is not None else 0,
            last_duration_ms=int(latest.duration_s * 1000) if latest else 0,
            last_size_bytes=latest.size_bytes if latest else 0,
            completed=stats.completed, failed=stats.failed, last_failure=self._checkpoint_failure,
            epoch=self.epoch,
        )

    async def _send_heartbeat(self) -> None:
        counters = [c for slot in self.executors.values() if not slot.lost for c in slot.counters.values()]
        clock, stalled = None, []
        if self.clock is not None:
            now = time.monotonic()
            for c in counters:
                self.clock.update(self._task_name(c.task), c.watermark, c.records_in, c.finished, now)
            clock, stalled = self.clock.clock(), self.clock.stalled(now)
            for name in set(stalled) - self._stalled_logged:
                log.warning("task_stalled", task=name, stall_timeout_s=self.clock.stall_after_s)
            self._stalled_logged = set(stalled)
        processors = self.metrics.update(counters, time.monotonic(), int(time.time() * 1000)) \
            if self.metrics is not None else []
        await self.bus.publish(subjects.appmaster_heartbeat(self.app_id),
                               AppMasterHeartbeat(self.app_id, len(self._live_slots()), counters, clock, stalled,
                                                  self.restarts, sorted(self.blacklist), *self.guarantee,
                                                  self._checkpoint_stats(), self.dag, processors))

    def _task_name(self, task: TaskId) -> str:
        return f"{self.app.graph.processors[task.processor].name}[{task.index}]"

    async def heartbeat_loop(self) -> None:
        while True:
            await self._send_heartbeat()
            now, deadline = time.time(), 3 * self.heartbeat_interval
            for slot in self.executors.values():
                registered = slot.registered.done() and not slot.registered.cancelled() \
                    and slot.registered.exception() is None
                if not registered or slot.stopped:
                    continue
                silent = now - slot.last_heartbeat
                if silent > EXECUTOR_TIMEOUT_HEARTBEATS * self.heartbeat_interval and not self._ending:
                    self.executor_lost(slot, f"executor {slot.executor_id} on worker {slot.worker_id} sent no "
                                             f"heartbeat for {silent:.0f} s", worker_suspect=True)
                elif silent > deadline and not slot.missed_logged:
                    slot.missed_logged = True
                    log.warning("executor_heartbeat_missed", executor_id=slot.executor_id, silent_s=round(silent, 1))
            await asyncio.sleep(self.heartbeat_interval)


def dag_of(app: Application) -> AppDag:
    """The plan as the dashboard and ``gearbus status`` show it."""
    described = app.graph.describe()
    return AppDag([ProcessorInfo(p["id"], p["name"], p["parallelism"], p["task"]) for p in described["processors"]],
                  [EdgeInfo(e["from"], e["to"], e["partitioner"]) for e in described["edges"]])


def main(argv: list[str] | None = None) -> int:
    args = parse_launched_args("appmaster", argv)
    launch = launch_from_env()
    configure("appmaster", f"app{launch.app_id}-appmaster", app_id=launch.app_id)
    return run_service(AppMaster(args.nats, launch, os.environ.get(WORKER_ENV, ""), launch_security(launch)))
