"""The master role: AppManager (application registry and lifecycle), the worker
registry and the resource Scheduler. It handles metadata only and never imports user code."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import time
import uuid
from typing import TypeVar
from dataclasses import dataclass, field, replace

import msgpack
import nats.errors
import nats.js.errors
import structlog

from gearbus.api.partitioners import MAX_PARALLELISM
from gearbus.connectors import intermediate
from gearbus.connectors.jetstream import JetStreamError
from gearbus.control.config import AppConfig, ConfigError
from gearbus.runtime.shell import read as read_shell_output
from services import apptypes
from services.master import lifecycle as lc
from services.master import stages as family
from services.master.scheduler import InvalidResourceRequest, Scheduler, SchedulingError
from services.master.lease import LeaderLease
from services.master.store import ApplicationRecord, StateStore, WorkerRecord
from services.master.worker_registry import (DeclareWorkerLost, HeartbeatMissed, HeartbeatResumed, WorkerConflict,
                                             WorkerRegistry)
from services.checkpoint_store import ensure_buckets, ensure_snapshot_bucket
from services.master.credentials import APP_SIGNER_ENV, AppCredentials
from shared import digests, subjects
from shared.bus import (DEFAULT_REQUEST_TIMEOUT_S, JETSTREAM_UNAVAILABLE, RemoteError, RequestError, RequestTimeout,
                        add_connect_timeout_argument, add_nats_argument, bad_request, nats_servers, not_found, ride_out)
from shared.logging import configure
from shared.messages import (
    FRAMEWORK_PACKAGES,
    PROTOCOL_VERSION,
    Allocation,
    AppDag,
    AppError,
    AppEvent,
    AppMasterHeartbeat,
    CheckpointStats,
    AppMasterRegistered,
    AppRescaled,
    AppVersion,
    AppStimuli,
    ApplicationList,
    ApplicationRestarted,
    ApplicationStateChanged,
    ApplicationStatus,
    AppState,
    AppType,
    ClusterInfo,
    ErrorCode,
    ExecutorKind,
    ExecutorLaunched,
    ExecutorStopped,
    KillApplication,
    LaunchExecutor,
    MasterElected,
    ListApplications,
    Message,
    MetricsHistory,
    Placement,
    PlanStages,
    ProcessorMetrics,
    QueryApplication,
    QueryMetricsHistory,
    QueryState,
    QueryStimuli,
    ProcessorReplaced,
    ReadShellOutput,
    ReplaceProcessor,
    RescaleApplication,
    SavepointTaken,
    ShellOutput,
    ShellWorkerOutput,
    TakeSavepoint,
    QueryCluster,
    RegisterAppMaster,
    RegisterWorker,
    ReRegister,
    RequestResource,
    RestartApplication,
    ResourceAllocated,
    ShutdownExecutor,
    StagesStarted,
    StateValue,
    SubmitApplication,
    SubmitApplicationResult,
    TaskCounters,
    WorkerHeartbeat,
    WorkerRegistered,
    WorkerLost,
    WorkerSummary,
)
from shared.nats_jwt import CredentialsError
from shared.security import Security, add_arguments
from shared.service import Service, run_service

log = structlog.get_logger()
Reply = TypeVar("Reply", bound=Message)

APPMASTER_EXECUTOR_ID = -1
MAX_STAGES = 64  # stages of one multi-stage app at most
WORKER_BUSY_RETRIES = 40  # a worker whose slots are still held by exiting processes is asked again, this often
WORKER_BUSY_WAIT_S = 0.25
STREAM_NAME = re.compile(r"[A-Za-z0-9_-]{1,255}")
STANDBY_POLL_S = 0.1  # how often a standby checks whether the lease has expired
MASTERS_LOOKUP_S = 2.0
SETUP_DEADLINE_S = 60.0  # how long a master waits at start for JetStream (a new cluster elects leaders)
STATE_QUERY_TIMEOUT_S = 15.0  # the AppMaster asks the executor, which may take 10 s
SAVEPOINT_TIMEOUT_S = 120.0  # how long a savepoint may take (its checkpoint, then copying its state)
#: how long a rescale may take: a checkpoint, then every task restored (the new ones dividing the old state)
RESCALE_TIMEOUT_S = 600.0
APPMASTER_TIMEOUT_HEARTBEATS = 5  # an AppMaster silent this many heartbeat intervals is lost (as an executor is)
RECONFIRM_HEARTBEATS = 5  # a new leader gives running apps' AppMasters this many heartbeats to register


def now_ms() -> int:
    return int(time.time() * 1000)


def config_of(record: ApplicationRecord) -> AppConfig:
    """A recorded app's config, checked when it was submitted: keys unknown now (a plug-in
    type's own, or one an older master took) are left out, so a recorded app never fails to
    relaunch for its config."""
    return AppConfig.parse(record.config, strict=False)


@dataclass
class AppLive:
    """What the master knows of a running app beyond its durable record."""

    tasks: list[TaskCounters]
    executors: int = 0
    clock: int | None = None
    stalled_tasks: list[str] = field(default_factory=list)
    restarts: int = 0
    blacklisted_workers: list[str] = field(default_factory=list)
    guarantee: str = ""
    guarantee_detail: str = ""
    checkpoints: CheckpointStats | None = None
    dag: AppDag | None = None
    processors: list[ProcessorMetrics] = field(default_factory=list)
    versions: list[AppVersion] = field(default_factory=list)
    events: list[AppEvent] = field(default_factory=list)


class Master(Service):
    role = "master"

    def __init__(self, servers, node_id: str, heartbeat_interval: float = 1.0, worker_timeout: float = 10.0,
                 appmaster_register_timeout: float = 60.0, resource_timeout: float = 60.0, lease_ttl_s: int = 1,
                 security: Security = Security(), app_credentials: AppCredentials = AppCredentials(),
                 appmaster_timeout: float | None = None):
        """``appmaster_timeout``: an AppMaster silent this long is lost (default: 5 heartbeat intervals)."""
        super().__init__(servers, node_id, security)
        self.app_credentials = app_credentials
        self.lease_ttl_s = lease_ttl_s
        self.lease: LeaderLease | None = None
        self._office: list = []  # the subscriptions a leader holds
        self._office_tasks: set[asyncio.Task] = set()
        self.elected_at = 0.0
        self.heartbeat_interval = heartbeat_interval
        self.resource_timeout = resource_timeout
        self.store: StateStore | None = None
        self.apps: dict[int, ApplicationRecord] = {}
        self.live: dict[int, AppLive] = {}
        self.registry = WorkerRegistry(heartbeat_interval, worker_timeout)  # the workers and their liveness
        self._lifecycle_instructions = {
            lc.LaunchAppMaster: self._start_launch, lc.SetState: self._record_state, lc.StopAppProcesses: self._stop_app,
            lc.FenceAppMaster: self._fence, lc.AnswerSubmission: self._answer_submission,
        }
        self._registry_instructions = {
            HeartbeatMissed: self._heartbeat_missed, HeartbeatResumed: self._heartbeat_resumed,
            DeclareWorkerLost: self._worker_lost,
        }
        self.scheduler = Scheduler()
        self._waiting_resources: dict[int, asyncio.Future] = {}  # by request arrival number
        self._submitters: dict[int, asyncio.Future] = {}  # app id -> the waiting submission's answer
        self._stage_planning: dict[int, asyncio.Lock] = {}  # a multi-stage app -> its PlanStages, one at a time
        self._launching: dict[int, asyncio.Task] = {}  # app id -> its AppMaster's launch under way
        self.lifecycles = lc.AppLifecycles(lc.Timeouts(
            register_s=appmaster_register_timeout, heartbeat_s=appmaster_timeout or APPMASTER_TIMEOUT_HEARTBEATS * heartbeat_interval,
            reconfirm_s=RECONFIRM_HEARTBEATS * heartbeat_interval))

    # --- lifecycle: election ---------------------------------------------------

    async def setup(self) -> None:
        js = self.bus.js
        await self.bus.jetstream_ready(SETUP_DEADLINE_S)
        # Lease I/O gets a short timeout: a call stuck on an unavailable stream must not
        # keep this master from seeing the stream come back.
        lease_js = self.bus.nc.jetstream(timeout=max(self.lease_ttl_s / 2, 0.5))
        self.lease = LeaderLease(lease_js, self.node_id, self.lease_ttl_s, replicas=self.bus.replicas)
        async def open_buckets() -> None:
            try:
                await js.object_store(subjects.ARTIFACT_BUCKET)
            except nats.js.errors.BucketNotFoundError:
                await js.create_object_store(subjects.ARTIFACT_BUCKET, replicas=self.bus.replicas)
            await ensure_buckets(js, self.bus.replicas)
            await self.lease.open()

        try:  # streams of a new cluster may take a moment to get leaders
            await ride_out(open_buckets, "the master's buckets", SETUP_DEADLINE_S)
        except JETSTREAM_UNAVAILABLE as exc:
            raise RuntimeError(f"JetStream did not serve the master's buckets within "
                               f"{SETUP_DEADLINE_S:g} s: {exc!r}") from None
        self.spawn(self.campaign(), "election")

    async def campaign(self) -> None:
        """Hold or seek the lease for as long as this master runs."""
        registry_due = 0.0
        while True:
            change = await self.lease.step()
            if change == "elected":
                try:
                    await self._take_office()
                except (nats.errors.Error, nats.js.errors.Error, TimeoutError, RequestError) as exc:
                    log.error("taking_office_failed", error=repr(exc))  # KV unavailable: try again later
                    await self.lease.release()
                    await self._leave_office()
            elif change == "deposed" or (self._office and not self.lease.valid()):
                await self._leave_office()
            now = time.monotonic()
            if now >= registry_due:
                try:
                    await self.lease.refresh_registration()
                    registry_due = now + self.lease.registry_ttl_s / 3
                except (nats.errors.Error, nats.js.errors.Error, TimeoutError, RequestError) as exc:
                    log.warning("master_registration_refresh_failed", error=repr(exc))
            await asyncio.sleep(self.lease.ttl_s / 4 if self.lease.term else STANDBY_POLL_S)

    async def _take_office(self) -> None:
        """Load the cluster state from KV, serve the request subjects, announce."""
        started = time.monotonic()
        self.store = await StateStore.open(self.bus.nc, self.lease, self.bus.replicas)
        self.apps, known = await self.store.load()
        self.scheduler = Scheduler()
        self.live = {}
        self.registry.took_office([(w.worker_id, w.host, w.pid, w.slots) for w in known.values()], time.monotonic(),
                                  now_ms())
        self.elected_at = time.monotonic()
        await self._act(self.lifecycles.took_office(
            [(r.app_id, r.state, r.appmaster_worker, r.appmaster_attempt, self._relaunches_allowed(r))
             for r in self.apps.values()], self.elected_at))
        serve, listen, guard = self.bus.serve, self.bus.listen, self.lease.valid
        self._office = [
            await serve(subjects.APP_SUBMIT, {SubmitApplication: self.on_submit}, concurrent=True, guard=guard),
            await serve(subjects.APP_SUBMIT_SHELL, {SubmitApplication: self.on_submit_shell}, concurrent=True,
                        guard=guard),
            await serve(subjects.APP_SHELL_OUTPUT, {ReadShellOutput: self.on_shell_output}, concurrent=True,
                        guard=guard),
            await serve(subjects.APP_KILL, {KillApplication: self.on_kill}, guard=guard),
            await serve(subjects.APP_SAVEPOINT, {TakeSavepoint: self.on_savepoint}, concurrent=True, guard=guard),
            await serve(subjects.APP_RESTART, {RestartApplication: self.on_restart}, concurrent=True, guard=guard),
            await serve(subjects.APP_STATE, {QueryState: self.on_state_query}, concurrent=True, guard=guard),
            await serve(subjects.APP_DEBUG, {QueryStimuli: self.on_stimuli_query}, concurrent=True, guard=guard),
            await serve(subjects.APP_METRICS_HISTORY, {QueryMetricsHistory: self.on_metrics_history}, concurrent=True,
                        guard=guard),
            await serve(subjects.APP_RESCALE, {RescaleApplication: self.on_rescale}, concurrent=True, guard=guard),
            await serve(subjects.APP_REPLACE, {ReplaceProcessor: self.on_replace}, concurrent=True, guard=guard),
            await serve(subjects.APP_STATUS, {QueryApplication: self.on_status}, guard=guard),
            await serve(subjects.APP_LIST, {ListApplications: self.on_list}, guard=guard),
            await serve(subjects.MASTER_INFO, {QueryCluster: self.on_info}, guard=guard),
            await serve(subjects.WORKER_REGISTER, {RegisterWorker: self.on_register_worker}, guard=guard),
            await serve(subjects.appmaster_register("*"), {RegisterAppMaster: self.on_register_appmaster},
                        guard=guard, app_token=subjects.APP_TOKEN_IN_MASTER_SUBJECTS),
            await serve(subjects.appmaster_state("*"), {ApplicationStateChanged: self.on_appmaster_state},
                        guard=guard, app_token=subjects.APP_TOKEN_IN_MASTER_SUBJECTS),
            await serve(subjects.resource_request("*"), {RequestResource: self.on_request_resource}, concurrent=True,
                        guard=guard, app_token=subjects.APP_TOKEN_IN_MASTER_SUBJECTS),
            await serve(subjects.executor_launch("*"), {LaunchExecutor: self.on_executor_launch}, concurrent=True,
                        guard=guard, app_token=subjects.APP_TOKEN_IN_MASTER_SUBJECTS),
            await serve(subjects.appmaster_stages("*"), {PlanStages: self.on_plan_stages}, concurrent=True,
                        guard=guard, app_token=subjects.APP_TOKEN_IN_MASTER_SUBJECTS),
            await listen(subjects.WORKER_HEARTBEAT, {WorkerHeartbeat: self.on_worker_heartbeat}, guard=guard),
            await listen(subjects.appmaster_heartbeat("*"), {AppMasterHeartbeat: self.on_appmaster_heartbeat},
                         guard=guard, app_token=subjects.APP_TOKEN_IN_MASTER_SUBJECTS),
            await listen(subjects.EXECUTOR_STOPPED, {ExecutorStopped: self.on_executor_stopped}, guard=guard),
        ]
        await self.bus.nc.flush()
        self._spawn_office_work(self.watch_heartbeats(), "watch-heartbeats")
        await self.bus.publish(subjects.MASTER_ELECTED, MasterElected(self.node_id, self.lease.term))
        log.info("leader_elected", term=self.lease.term, apps=len(self.apps), workers_known=len(self.registry.workers),
                 took_ms=round((time.monotonic() - started) * 1000, 1))

    async def _leave_office(self) -> None:
        """Stop serving at once: unsubscribe, stop leader work, forget the live picture."""
        if not self._office:
            return
        log.warning("leader_stepped_down", term=self.lease.term)
        office, self._office = self._office, []
        await self.bus.drop(office)
        for task in self._office_tasks:
            task.cancel()
        self._office_tasks.clear()
        for future in [*self._waiting_resources.values(), *self._submitters.values()]:
            if not future.done():
                future.set_exception(RequestError(ErrorCode.UNAVAILABLE, "the master lost the lead", True))
        self.apps, self.live, self.scheduler = {}, {}, Scheduler()
        self.registry.took_office([], time.monotonic(), now_ms())

    def _spawn_office_work(self, coro, name: str) -> asyncio.Task:
        """Background work of the leader only: cancelled when it steps down."""
        task = self.spawn(coro, name)
        self._office_tasks.add(task)
        task.add_done_callback(self._office_tasks.discard)
        return task

    async def shutdown(self) -> None:
        await self._leave_office()
        if self.lease is not None:  # None when setup failed before opening it
            await self.lease.release()

    # --- application handlers --------------------------------------------------

    async def on_submit(self, msg: SubmitApplication) -> SubmitApplicationResult:
        return await self._submit(msg, subjects.APP_SUBMIT)

    async def on_submit_shell(self, msg: SubmitApplication) -> SubmitApplicationResult:
        """A shell app, on the subject of its own that only granted credentials may publish to."""
        return await self._submit(msg, subjects.APP_SUBMIT_SHELL)

    def _check_type(self, msg: SubmitApplication, subject: str) -> apptypes.ApplicationType | None:
        """The app's type must be one this cluster knows, submitted where its type says; on a
        secured cluster a type with a submit subject of its own (shell) is refused elsewhere.
        Returns the built-in type's declaration (None for a plug-in: the master never loads one)."""
        known = apptypes.names()
        if msg.app_type not in known:
            raise bad_request(f"SubmitApplication.app_type: unknown application type {msg.app_type!r}; this cluster "
                              f"knows {', '.join(known)}")
        declared = apptypes.built_in(msg.app_type)
        wanted = declared.submit_subject if declared else subjects.APP_SUBMIT
        if subject != wanted and subject != subjects.APP_SUBMIT:
            raise bad_request(f"{subject} takes {wanted.rpartition('.')[2]} apps only; submit {msg.app_type} apps "
                              f"on {wanted}")
        if subject != wanted and self.app_credentials.signer is not None:
            raise RequestError(ErrorCode.FORBIDDEN, (
                f"a {msg.app_type} app runs code on every worker it names, so on this secured cluster it is "
                f"submitted on {wanted} only, which only a credential the operator granted it may publish to "
                f"(`gearbus security user DIR NAME --allow-{msg.app_type}`); refused on {subject}"))
        return declared

    def _check_workers(self, msg: SubmitApplication, declared: apptypes.ApplicationType | None) -> None:
        """The workers an app names must be live, each named once."""
        if declared is not None and declared.needs_workers and not msg.workers:
            raise bad_request(f"SubmitApplication.workers: a {msg.app_type} app names the workers it runs on")
        alive = sorted(w.worker_id for w in self.registry.alive())
        doubled = sorted({w for w in msg.workers if msg.workers.count(w) > 1})
        if doubled:
            raise bad_request(f"SubmitApplication.workers names {', '.join(doubled)} more than once")
        unknown = [w for w in msg.workers if w not in alive]
        if unknown:
            raise not_found(f"no live worker {', '.join(unknown)}: the cluster has {len(alive)} live worker(s)"
                            + (f": {', '.join(alive)}" if alive else ""))

    async def _submit(self, msg: SubmitApplication, subject: str) -> SubmitApplicationResult:
        if not msg.name.strip():
            raise bad_request("SubmitApplication.name must not be empty")
        if "stage" in msg.config:
            raise bad_request("SubmitApplication.config: 'stage' is the master's to set, on the apps it starts for "
                              "the stages of a multi-stage app")
        declared = self._check_type(msg, subject)
        try:
            AppConfig.parse(msg.config, strict=declared is not None)
        except ConfigError as exc:
            raise bad_request(f"SubmitApplication.config: {exc}") from None
        self._check_workers(msg, declared)
        digest = await self._check_artifact(msg) if msg.artifact or (declared and declared.needs_artifact) else ""
        app_id = await self.store.next_app_id()
        record = ApplicationRecord(
            app_id=app_id, name=msg.name, state=AppState.PENDING, submitted_ms=now_ms(), artifact=msg.artifact,
            entry=msg.entry, artifact_kind=msg.artifact_kind, args=list(msg.args), config=dict(msg.config),
            user=msg.user, priority=msg.priority, artifact_digest=digest, app_type=msg.app_type,
            workers=list(msg.workers), submitter_dir=msg.submitter_dir,
        )
        # Durable first, then visible (app.list, app.kill) and known to the lifecycle machine
        # in one step, with the answer waiting: whenever a kill comes from now on, it ends the
        # app and answers this submission, and the machine launches nothing for it.
        answer = self._submitters[app_id] = asyncio.get_running_loop().create_future()
        try:
            await self._admit(record)
            await answer
        finally:
            self._submitters.pop(app_id, None)
        return SubmitApplicationResult(app_id)

    async def _admit(self, record: ApplicationRecord) -> None:
        """Record a new app, make its stores and launch its AppMaster."""
        app_id, allowed = record.app_id, self._relaunches_allowed(record)
        await self.store.save(record)
        self.lifecycles.accepted(app_id, allowed)
        self.apps[app_id] = record
        log.info("app_submitted", app_id=app_id, name=record.name, app_type=record.app_type, stage_of=record.stage_of)
        parent = self.apps.get(record.stage_of)
        if parent is not None and parent.state in AppState.TERMINAL:
            await self._act(self.lifecycles.end(app_id, AppState.TERMINATED, None,
                                                f"app {parent.app_id}, whose stage it is, ended first"))
            return
        try:
            await ride_out(lambda: ensure_snapshot_bucket(self.bus.js, app_id, self.bus.replicas),
                           f"creating the snapshot store of app {app_id}")
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError, RequestError) as exc:  # the app fails
            await self._act(self.lifecycles.launch_failed(app_id, 0, f"its snapshot store could not be created: {exc!r}"))
        else:
            await self._act(self.lifecycles.submitted(app_id, allowed))

    async def on_plan_stages(self, msg: PlanStages) -> StagesStarted:
        """A multi-stage app's AppMaster planned its stages: make its intermediate streams
        (refusing a name that is not the app's) and start an app per stage, once."""
        async with self._stage_planning.setdefault(msg.app_id, asyncio.Lock()):  # an AppMaster's retry waits
            return await self._plan_stages(msg)

    async def _plan_stages(self, msg: PlanStages) -> StagesStarted:
        record = self._app(msg.app_id)
        if record.state in AppState.TERMINAL:
            raise RequestError(ErrorCode.CONFLICT, f"app {msg.app_id} has already ended ({record.state})")
        if record.stage_apps:
            return StagesStarted(msg.app_id, list(record.stage_apps))
        if record.stage_of:
            raise bad_request(f"app {msg.app_id} is a stage of app {record.stage_of}: it has no stages of its own")
        self._check_stages(msg)
        names = {s.name for s in msg.streams}
        for other in self.apps.values():
            shared = names & {s.name for s in other.streams}
            if shared and other.state not in AppState.TERMINAL and not other.stage_of:
                raise RequestError(ErrorCode.CONFLICT, f"intermediate stream(s) {', '.join(sorted(shared))} belong to "
                                                       f"app {other.app_id} ({other.name}), which is running")
        try:
            await intermediate.create_streams(self.bus.nc, list(msg.streams), record.name, self.bus.replicas)
        except intermediate.StreamTaken as exc:
            raise RequestError(ErrorCode.CONFLICT, str(exc)) from None
        except JetStreamError as exc:
            raise RequestError(ErrorCode.UNAVAILABLE, f"making the intermediate streams: {exc}", True) from None
        stages = []
        for stage in range(msg.stages):
            stages.append(replace(record, app_id=await self.store.next_app_id(), name=f"{record.name}.stage{stage}",
                                  state=AppState.PENDING, submitted_ms=now_ms(), config={**record.config, "stage": stage},
                                  appmaster_worker="", appmaster_attempt=0, stage_of=record.app_id, stage=stage,
                                  streams=list(msg.streams)))
            await self.store.save(stages[-1])  # durable before the app names it: a new leader fails it, so the app
        record = self._app(msg.app_id)        # as it is now: a kill may have come meanwhile
        await self._save(replace(record, stage_apps=[s.app_id for s in stages], streams=list(msg.streams)))
        for stage in stages:
            await self._admit(stage)
        if self.apps[msg.app_id].state in AppState.TERMINAL:  # ended meanwhile: what follows its end, now
            await self._follow(family.after_end(self.apps[msg.app_id], self.apps))
            raise RequestError(ErrorCode.CONFLICT, f"app {msg.app_id} ended while its stages were starting")
        return StagesStarted(msg.app_id, [s.app_id for s in stages])

    @staticmethod
    def _check_stages(msg: PlanStages) -> None:
        if not 2 <= msg.stages <= MAX_STAGES:
            raise bad_request(f"PlanStages.stages must be 2 to {MAX_STAGES}, got {msg.stages}")
        for spec in msg.streams:
            if not STREAM_NAME.fullmatch(spec.name):
                raise bad_request(f"PlanStages: {spec.name!r} is not a stream name (letters, digits, '_' and '-')")
            if not 1 <= spec.partitions <= MAX_PARALLELISM:
                raise bad_request(f"PlanStages: stream {spec.name!r} has {spec.partitions} partitions, not 1 to "
                                  f"{MAX_PARALLELISM}")
            if not (0 <= spec.from_stage < msg.stages and 0 <= spec.to_stage < msg.stages):
                raise bad_request(f"PlanStages: stream {spec.name!r} joins stages {spec.from_stage} and "
                                  f"{spec.to_stage}, not among the app's {msg.stages}")

    async def _check_artifact(self, msg: SubmitApplication) -> str:
        """The artifact's recorded SHA-256, once it is checked: its kind, its entry module, and
        that it is in the object store as submitted."""
        if not msg.artifact:
            raise bad_request(f"SubmitApplication.artifact is empty: a {msg.app_type} app runs an uploaded artifact")
        if msg.artifact_kind not in ("module", "zip"):
            raise bad_request(f"SubmitApplication.artifact_kind must be 'module' or 'zip', got {msg.artifact_kind!r}")
        if not msg.entry.isidentifier():
            raise bad_request(f"SubmitApplication.entry must be a Python module name, got {msg.entry!r}")
        if msg.entry in FRAMEWORK_PACKAGES:
            raise bad_request(f"SubmitApplication.entry {msg.entry!r} clashes with gearbus's own package {msg.entry!r} "
                              f"({', '.join(FRAMEWORK_PACKAGES)} are the framework's): rename the application")
        store = await self.bus.js.object_store(subjects.ARTIFACT_BUCKET)
        try:
            info = await store.get_info(msg.artifact)
        except (nats.js.errors.NotFoundError, nats.js.errors.ObjectNotFoundError, nats.js.errors.InvalidObjectNameError):
            raise not_found(
                f"artifact {msg.artifact!r} is not in the {subjects.ARTIFACT_BUCKET} object store: upload it first"
            ) from None
        digest = digests.from_object_store(info.digest)
        if msg.artifact_digest and digest and msg.artifact_digest.lower() != digest:
            raise bad_request(f"artifact {msg.artifact!r} in the object store has SHA-256 {digest}, not the "
                              f"submitted {msg.artifact_digest}: it changed after the upload")
        return digest

    @staticmethod
    def _relaunches_allowed(record: ApplicationRecord) -> int:
        return config_of(record).appmaster_restarts

    async def _act(self, instructions: list[lc.Instruction]) -> None:
        """Carry out what the app lifecycle machine decided, in order; an instruction
        without a handler is a bug, and fails loudly."""
        for instruction in instructions:
            handler = self._lifecycle_instructions.get(type(instruction))
            if handler is None:
                raise RuntimeError(f"the master cannot carry out {instruction!r}")
            await handler(instruction)

    async def _start_launch(self, launch: lc.LaunchAppMaster) -> None:
        self._launching[launch.app_id] = self._spawn_office_work(self._launch(launch),
                                                                 f"launch-appmaster-{launch.app_id}")

    async def _record_state(self, record: lc.SetState) -> None:
        if record.state in AppState.TERMINAL and (launch := self._launching.pop(record.app_id, None)):
            launch.cancel()  # an ended app gets no AppMaster, even once a slot frees
        await self._set_state(record.app_id, record.state, record.error)

    async def _stop_app(self, stop: lc.StopAppProcesses) -> None:
        await self._stop_app_processes(stop.app_id, stop.reason)
        self.scheduler.release_app(stop.app_id)
        self._reschedule()

    async def _fence(self, fence: lc.FenceAppMaster) -> None:
        log.warning("appmaster_fenced", app_id=fence.app_id, worker_id=fence.worker_id, reason=fence.reason)
        self._spawn_office_work(self._fence_appmaster(fence), f"fence-appmaster-{fence.app_id}")

    async def _answer_submission(self, answer: lc.AnswerSubmission) -> None:
        waiting = self._submitters.get(answer.app_id)
        if waiting is not None and not waiting.done():
            waiting.set_exception(RequestError(answer.code, answer.error, answer.code == ErrorCode.UNAVAILABLE)) \
                if answer.error else waiting.set_result(None)

    async def _launch(self, launch: lc.LaunchAppMaster) -> None:
        """Start attempt ``launch.attempt`` of an app's AppMaster; tell the machine how it went."""
        record = replace(self.apps[launch.app_id], appmaster_attempt=launch.attempt)
        if launch.attempt:
            log.warning("relaunching_appmaster", app_id=launch.app_id, attempt=launch.attempt, avoid=launch.avoid)
        try:
            await self._save(record)
            worker_id = await self._launch_appmaster(record, launch.attempt, launch.avoid)
        except RequestError as exc:  # no slot, the worker refused, or this master lost the lease
            self._launching.pop(launch.app_id, None)
            await self._act(self.lifecycles.launch_failed(launch.app_id, launch.attempt, exc.message))
            return
        self._launching.pop(launch.app_id, None)
        log.info("appmaster_launched", app_id=launch.app_id, worker_id=worker_id, attempt=launch.attempt)
        await self._act(self.lifecycles.launched(launch.app_id, launch.attempt, worker_id, time.monotonic()))

    async def _fence_appmaster(self, fence: lc.FenceAppMaster) -> None:
        """Kill an AppMaster declared lost, should it still run (it may only be hung)."""
        try:
            await self.bus.request(subjects.worker_shutdown(fence.worker_id, fence.app_id),
                                   ShutdownExecutor(fence.app_id, APPMASTER_EXECUTOR_ID, f"fenced: {fence.reason}",
                                                    force=True), timeout=5)
        except RequestError as exc:
            log.warning("appmaster_fence_failed", app_id=fence.app_id, worker_id=fence.worker_id, error=exc.message)

    async def _launch_appmaster(self, record: ApplicationRecord, attempt: int, avoid: str = "") -> str:
        """Start the app's AppMaster on a worker (away from ``avoid`` when another has room).
        A worker that does not answer the launch (it may be gone without this master
        knowing yet) is skipped for the next live one; one that has no free slot yet (the
        processes of an app that just ended are still exiting there) is asked again."""
        skipped: set[str] = {avoid} if avoid else set()
        busy = 0
        while True:
            alive_elsewhere = any(w.worker_id not in skipped for w in self.registry.alive())
            exclude = frozenset(skipped) if alive_elsewhere else frozenset()
            allocation = (await self._allocate(record.app_id, 1, Placement.ANY, "", record.priority, 1, exclude))[0]
            launch = LaunchExecutor(
                app_id=record.app_id, executor_id=APPMASTER_EXECUTOR_ID, kind=ExecutorKind.APPMASTER,
                artifact=record.artifact, entry=record.entry, artifact_kind=record.artifact_kind,
                args=list(record.args), config=dict(record.config), app_name=record.name, priority=record.priority,
                attempt=attempt, start_ms=record.submitted_ms, artifact_digest=record.artifact_digest,
                credentials=await self._credential(record),
                app_type=record.app_type, workers=list(record.workers), submitter_dir=record.submitter_dir,
            )
            try:
                await self.bus.request(subjects.worker_launch(allocation.worker_id), launch, expect=ExecutorLaunched)
                return allocation.worker_id
            except RequestError as exc:
                self.scheduler.release(record.app_id, allocation.worker_id, 1)
                if isinstance(exc, RemoteError) and exc.retryable and busy < WORKER_BUSY_RETRIES:
                    busy += 1
                    await asyncio.sleep(WORKER_BUSY_WAIT_S)
                    continue
                if not alive_elsewhere or not isinstance(exc, RequestTimeout):
                    raise
                log.warning("appmaster_launch_failed", app_id=record.app_id, worker_id=allocation.worker_id,
                            error=exc.message)
                skipped.add(allocation.worker_id)

    async def on_kill(self, msg: KillApplication) -> None:
        record = self._app(msg.app_id)
        if record.state in AppState.TERMINAL:
            raise RequestError(ErrorCode.CONFLICT, f"app {msg.app_id} has already ended ({record.state})")
        await self._act(self.lifecycles.kill(msg.app_id))

    async def on_savepoint(self, msg: TakeSavepoint) -> SavepointTaken:
        """Pass the request to the app's AppMaster, which takes the savepoint."""
        return await self._ask_appmaster(msg.app_id, subjects.appmaster_savepoint(msg.app_id), msg, SavepointTaken,
                                         SAVEPOINT_TIMEOUT_S, " can take a savepoint")

    async def on_state_query(self, msg: QueryState) -> StateValue:
        """Pass the query to the app's AppMaster, which asks the task that owns the key."""
        return await self._ask_appmaster(msg.app_id, subjects.appmaster_state_query(msg.app_id), msg, StateValue,
                                         STATE_QUERY_TIMEOUT_S, "'s state can be read")

    async def on_rescale(self, msg: RescaleApplication) -> AppRescaled:
        """Pass the request to the app's AppMaster, which rescales the app while it runs."""
        return await self._ask_appmaster(msg.app_id, subjects.appmaster_rescale(msg.app_id), msg, AppRescaled,
                                         RESCALE_TIMEOUT_S, " can be rescaled")

    async def on_replace(self, msg: ReplaceProcessor) -> ProcessorReplaced:
        """Pass the request to the app's AppMaster, which replaces the processor's code
        while the app runs."""
        return await self._ask_appmaster(msg.app_id, subjects.appmaster_replace(msg.app_id), msg, ProcessorReplaced,
                                         RESCALE_TIMEOUT_S, "'s code can be replaced")

    async def on_stimuli_query(self, msg: QueryStimuli) -> AppStimuli:
        """Pass the query to the app's AppMaster, whose state machine keeps the log."""
        return await self._ask_appmaster(msg.app_id, subjects.appmaster_debug(msg.app_id), msg, AppStimuli,
                                         DEFAULT_REQUEST_TIMEOUT_S, " keeps a stimulus log")

    async def on_metrics_history(self, msg: QueryMetricsHistory) -> MetricsHistory:
        """Pass the query to the app's AppMaster, which keeps its processors' recent figures
        (a streaming app's: another type's has no processors)."""
        record = self._app(msg.app_id)
        if record.app_type != AppType.STREAMING:
            raise RequestError(ErrorCode.CONFLICT, f"app {msg.app_id} is a {record.app_type} app: it has no "
                                                   "processors to chart")
        return await self._ask_appmaster(msg.app_id, subjects.appmaster_metrics_history(msg.app_id), msg,
                                         MetricsHistory, DEFAULT_REQUEST_TIMEOUT_S, " keeps its figures")

    async def _ask_appmaster(self, app_id: int, subject: str, msg: Message, expect: type[Reply], timeout: float,
                             what: str) -> Reply:
        """A client's request relayed to the app's AppMaster, which only a running app has."""
        record = self._app(app_id)
        if record.state != AppState.ACTIVE:
            raise RequestError(ErrorCode.CONFLICT, f"app {app_id} is {record.state}: only a running app{what}")
        return await self.bus.request(subject, msg, expect=expect, timeout=timeout)

    async def on_restart(self, msg: RestartApplication) -> ApplicationRestarted:
        """Submit the app again; a running one hands its state over through a savepoint."""
        record = self._app(msg.app_id)
        if record.state == AppState.PENDING:
            raise RequestError(ErrorCode.CONFLICT, f"app {msg.app_id} is still starting: restart it once it runs")
        if record.state == AppState.ACTIVE and record.app_type != AppType.STREAMING:
            raise RequestError(ErrorCode.CONFLICT, f"app {msg.app_id} is a running {record.app_type} app: only a "
                                                   "streaming app hands its state on to a restart; kill it first")
        if record.stage_of:
            raise RequestError(ErrorCode.CONFLICT, f"app {msg.app_id} is stage {record.stage} of app {record.stage_of}: "
                                                   f"restart app {record.stage_of}")
        if record.stage_apps and record.state == AppState.ACTIVE:
            raise RequestError(ErrorCode.CONFLICT, f"app {msg.app_id} runs in stages, which take no savepoint "
                                                   "together yet: kill it, then restart it (afresh)")
        config = {k: v for k, v in record.config.items() if k not in ("from_savepoint", "allow_unclaimed_state")}
        savepoint = ""
        if record.state == AppState.ACTIVE:
            taken = await self.on_savepoint(TakeSavepoint(msg.app_id, f"restart-app{msg.app_id}-{now_ms()}", stop=True))
            savepoint = config["from_savepoint"] = taken.name
        result = await self._submit(SubmitApplication(record.name, record.artifact, record.entry, record.artifact_kind,
                                                        record.args, record.user, record.priority, config,
                                                        record.artifact_digest, record.app_type, record.workers,
                                                        record.submitter_dir),
                                      subjects.APP_SUBMIT)  # as any client may: a restart grants nothing
        log.info("app_restarted", previous_app_id=msg.app_id, app_id=result.app_id, from_savepoint=savepoint)
        return ApplicationRestarted(msg.app_id, result.app_id, savepoint)

    async def on_shell_output(self, msg: ReadShellOutput) -> ShellOutput:
        """A shell app's output: from its AppMaster while the app runs (which may wait for
        lines), from what the AppMaster stored once it ended. A killed app's AppMaster stores
        its output as it stops, once the commands' ends came: until then it answers itself."""
        record = self._app(msg.app_id)
        if record.app_type != AppType.SHELL:
            raise bad_request(f"app {msg.app_id} is a {record.app_type} app: only shell apps keep their output "
                              "(gearbus logs reads what an app's processes print)")
        if record.state not in AppState.TERMINAL:
            reply = await self._ask_shell_appmaster(msg) or ShellOutput(msg.app_id, record.state)
            if self.apps[msg.app_id].state not in AppState.TERMINAL:
                return replace(reply, state=self.apps[msg.app_id].state, ended=False)
            record = self.apps[msg.app_id]
        stored, complete = await self._stored_shell_output(record)
        if not complete:
            if (reply := await self._ask_shell_appmaster(msg)) is not None:
                return replace(reply, state=record.state, ended=False)  # still storing it
            stored, _ = await self._stored_shell_output(record)  # it is gone: what it stored is all there is
        views = read_shell_output(stored, msg.offsets, msg.max_bytes)
        return ShellOutput(msg.app_id, record.state, views, all(v.next_line >= v.total_lines for v in views))

    async def _ask_shell_appmaster(self, msg: ReadShellOutput) -> ShellOutput | None:
        """The AppMaster's answer, or None when it does not give one (starting, or gone)."""
        try:
            return await self.bus.request(subjects.appmaster_shell_output(msg.app_id), msg, expect=ShellOutput,
                                          timeout=min(max(msg.wait_ms, 0), 10_000) / 1000 + 5)
        except RequestError as exc:
            log.info("shell_output_not_read", app_id=msg.app_id, error=exc.message)
            return None

    async def _stored_shell_output(self, record: ApplicationRecord) -> tuple[list[ShellWorkerOutput], bool]:
        """What an ended shell app's AppMaster stored of each worker's command, and whether it
        stored every one."""
        kv = await self.bus.js.key_value(subjects.CHECKPOINT_BUCKET)
        outputs, complete = [], True
        for executor_id, worker_id in enumerate(record.workers):
            key = subjects.shell_output_key(record.app_id, executor_id)
            try:
                outputs.append(ShellWorkerOutput._from_fields(msgpack.unpackb((await kv.get(key)).value), key))
            except nats.js.errors.KeyNotFoundError:
                complete = False
                outputs.append(ShellWorkerOutput(worker_id, "lost", 0, detail="its output was not kept: the app's "
                                                                            "AppMaster ended before it stored it"))
            except (ValueError, TypeError, msgpack.UnpackException) as exc:  # not what an AppMaster stores
                log.error("shell_output_unreadable", app_id=record.app_id, key=key, error=repr(exc))
                outputs.append(ShellWorkerOutput(worker_id, "lost", 0, detail=f"its stored output is unreadable: {exc}"))
        return outputs, complete

    async def on_status(self, msg: QueryApplication) -> ApplicationStatus:
        """The app's summary; a multi-stage app's with what each of its streams holds now
        (while they exist: till it succeeded or was killed)."""
        record = self._app(msg.app_id)
        summary = self._summary(record)
        if record.streams and not record.stage_of and record.state not in (AppState.SUCCEEDED, AppState.TERMINATED):
            summary = replace(summary, streams=await intermediate.backlogs(self.bus.nc, list(record.streams)))
        return ApplicationStatus(summary)

    async def on_list(self, msg: ListApplications) -> ApplicationList:
        records = sorted(self.apps.values(), key=lambda r: r.app_id)
        if not msg.include_finished:
            records = [r for r in records if r.state not in AppState.TERMINAL]
        return ApplicationList([self._summary(r) for r in records])

    async def on_info(self, msg: QueryCluster) -> ClusterInfo:
        workers = []
        for w in sorted(self.registry.workers.values(), key=lambda w: w.worker_id):
            slots, used = self.scheduler.usage(w.worker_id) if w.alive else (w.slots, 0)
            workers.append(WorkerSummary(w.worker_id, w.host, w.pid, slots, used, w.alive, w.heard_ms))
        try:
            masters = await asyncio.wait_for(self.lease.masters(), MASTERS_LOOKUP_S)
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError):
            masters = [self.node_id]  # the registry is unreachable for now: at least the leader
        return ClusterInfo(masters=masters, leader=self.node_id, workers=workers)

    # --- workers ---------------------------------------------------------------

    async def on_register_worker(self, msg: RegisterWorker) -> WorkerRegistered:
        self._check_version("RegisterWorker", msg.protocol_version)
        if msg.slots < 1:
            raise bad_request(f"worker {msg.worker_id} must offer at least 1 slot, got {msg.slots}")
        try:
            self.registry.registered(msg.worker_id, msg.host, msg.pid, msg.slots, time.monotonic(), now_ms())
        except WorkerConflict as exc:
            raise RequestError(ErrorCode.CONFLICT, str(exc)) from None
        self.scheduler.remove_worker(msg.worker_id)  # a re-registration replaces what we knew
        self.scheduler.add_worker(msg.worker_id, msg.slots)
        for process in msg.running:
            self.scheduler.hold(process.app_id, msg.worker_id)
        await self.store.save_worker(WorkerRecord(msg.worker_id, msg.host, msg.pid, msg.slots))
        log.info("worker_registered", worker_id=msg.worker_id, slots=msg.slots, host=msg.host,
                 running=len(msg.running))
        self._reschedule()
        await self._act(self.lifecycles.worker_registered(
            msg.worker_id, [p.app_id for p in msg.running if p.kind == ExecutorKind.APPMASTER]))
        return WorkerRegistered(msg.worker_id, self.heartbeat_interval)

    async def on_worker_heartbeat(self, msg: WorkerHeartbeat) -> None:
        instructions = self.registry.heartbeat(msg.worker_id, time.monotonic(), now_ms())
        if instructions is None:
            log.info("worker_told_to_reregister", worker_id=msg.worker_id)
            await self.bus.publish(subjects.worker_reregister(msg.worker_id), ReRegister("unknown to this master"))
            return
        await self._registry_act(instructions)

    async def on_executor_stopped(self, msg: ExecutorStopped) -> None:
        self.scheduler.release(msg.app_id, msg.worker_id, 1)
        self._reschedule()
        if msg.kind == ExecutorKind.APPMASTER:
            reason = f"the AppMaster on worker {msg.worker_id} {msg.exit_detail()} before the app ended"
            await self._act(self.lifecycles.appmaster_exited(msg.app_id, msg.attempt, msg.worker_id, reason))

    # --- appmasters --------------------------------------------------------------

    async def on_register_appmaster(self, msg: RegisterAppMaster) -> AppMasterRegistered:
        self._check_version("RegisterAppMaster", msg.protocol_version)
        record = self._app(msg.app_id)
        if record.state in AppState.TERMINAL:
            raise RequestError(ErrorCode.CONFLICT, f"app {msg.app_id} has already ended ({record.state})")
        try:
            answers = self.lifecycles.registered(msg.app_id, msg.attempt, msg.worker_id, time.monotonic())
        except lc.Fenced as exc:
            raise RequestError(ErrorCode.FENCED, str(exc)) from None
        await self._save(replace(record, appmaster_worker=msg.worker_id,
                                 appmaster_attempt=max(msg.attempt, record.appmaster_attempt)))
        self.live[msg.app_id] = AppLive(tasks=[])
        log.info("appmaster_registered", app_id=msg.app_id, worker_id=msg.worker_id, attempt=msg.attempt)
        await self._act(answers)
        return AppMasterRegistered(msg.app_id, self.heartbeat_interval)

    async def on_appmaster_heartbeat(self, msg: AppMasterHeartbeat) -> None:
        live = self.live.get(msg.app_id)
        if not self.lifecycles.heartbeat(msg.app_id, msg.attempt, time.monotonic()) or live is None:
            record = self.apps.get(msg.app_id)
            if record is not None and record.state not in AppState.TERMINAL:
                log.info("appmaster_told_to_reregister", app_id=msg.app_id, attempt=msg.attempt)
                await self.bus.publish(subjects.appmaster_reregister(msg.app_id), ReRegister("unknown to this master"))
            return
        live.tasks, live.executors = list(msg.tasks), msg.executors
        live.clock, live.stalled_tasks = msg.clock, list(msg.stalled_tasks)
        live.restarts, live.blacklisted_workers = msg.restarts, list(msg.blacklisted_workers)
        live.guarantee, live.guarantee_detail, live.checkpoints = msg.guarantee, msg.guarantee_detail, msg.checkpoints
        live.dag, live.processors = msg.dag or live.dag, list(msg.processors)
        live.versions = list(msg.versions) or live.versions
        live.events = list(msg.events) or live.events

    async def on_appmaster_state(self, msg: ApplicationStateChanged) -> None:
        record = self._app(msg.app_id)
        if msg.state not in AppState.ALL:
            raise bad_request(f"unknown application state {msg.state!r}")
        if record.state in AppState.TERMINAL:
            log.info("late_state_report_ignored", app_id=msg.app_id, state=msg.state, current=record.state)
            return
        if msg.state == record.state:  # said again (a relaunched AppMaster's)
            return
        if not record.can_become(msg.state):
            raise RequestError(ErrorCode.CONFLICT, f"app {msg.app_id} cannot go from {record.state} to {msg.state}")
        await self._set_state(msg.app_id, msg.state, msg.error)

    async def on_executor_launch(self, msg: LaunchExecutor) -> ExecutorLaunched:
        """Start an executor for an AppMaster, on a worker holding the app's slots: only masters
        launch processes, with the app's recorded artifact and its own credentials."""
        record = self._app(msg.app_id)
        if record.state in AppState.TERMINAL:
            raise RequestError(ErrorCode.CONFLICT, f"app {msg.app_id} has already ended ({record.state})")
        if msg.kind != ExecutorKind.EXECUTOR:
            raise bad_request(f"an AppMaster may launch executors only, not {msg.kind!r}")
        if msg.worker_id not in self.scheduler.workers_of(msg.app_id):
            raise RequestError(ErrorCode.CONFLICT, f"worker {msg.worker_id!r} holds no slot of app {msg.app_id}")
        launch = replace(msg, artifact=record.artifact, entry=record.entry, artifact_kind=record.artifact_kind,
                         artifact_digest=record.artifact_digest, worker_id="", app_type=record.app_type,
                         submitter_dir=record.submitter_dir, credentials=await self._credential(record))
        return await self.bus.request(subjects.worker_launch(msg.worker_id), launch, expect=ExecutorLaunched)

    async def _credential(self, record: ApplicationRecord) -> str:
        """The app's own credential (a stage's reaches its app's intermediate streams)."""
        return self.app_credentials.issue(record.app_id, await self._savepoint_source(record),
                                          [s.name for s in record.streams] if record.stage_of else [])

    async def _savepoint_source(self, record: ApplicationRecord) -> int | None:
        """The app whose savepoint this one starts from (its credential may read that app's
        snapshot store), or None."""
        name = config_of(record).from_savepoint
        if not name or not self.app_credentials.signer:
            return None
        try:
            kv = await self.bus.js.key_value(subjects.CHECKPOINT_BUCKET)
            source = msgpack.unpackb((await kv.get(subjects.savepoint_key(name))).value)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.BucketNotFoundError):
            return None
        return source.get("app_id") if isinstance(source, dict) and type(source.get("app_id")) is int else None

    async def on_request_resource(self, msg: RequestResource) -> ResourceAllocated:
        record = self._app(msg.app_id)
        if record.state in AppState.TERMINAL:
            raise RequestError(ErrorCode.CONFLICT, f"app {msg.app_id} has already ended ({record.state})")
        if msg.placement == Placement.WORKER and msg.worker_id not in self.registry.workers:
            raise not_found(f"unknown worker id {msg.worker_id!r}")
        allocations = await self._allocate(msg.app_id, msg.slots, msg.placement, msg.worker_id, msg.priority,
                                           msg.min_slots, frozenset(msg.exclude_workers))
        return ResourceAllocated(msg.app_id, allocations)

    # --- internals -----------------------------------------------------------

    def _app(self, app_id: int) -> ApplicationRecord:
        record = self.apps.get(app_id)
        if record is None:
            raise not_found(f"unknown app id {app_id}")
        return record

    def _summary(self, record: ApplicationRecord):
        live = self.live.get(record.app_id)
        if live is None:
            return record.summary()
        return record.summary(executors=live.executors, tasks=live.tasks, clock=live.clock,
                              stalled_tasks=live.stalled_tasks, restarts=live.restarts,
                              blacklisted_workers=live.blacklisted_workers, guarantee=live.guarantee,
                              guarantee_detail=live.guarantee_detail, checkpoints=live.checkpoints,
                              dag=live.dag, processors=live.processors, versions=live.versions, events=live.events)

    @staticmethod
    def _check_version(what: str, version: int) -> None:
        if version != PROTOCOL_VERSION:
            raise bad_request(f"{what}: peer speaks protocol version {version}, this master speaks {PROTOCOL_VERSION}")

    async def _save(self, record: ApplicationRecord) -> None:
        self.apps[record.app_id] = record
        await self.store.save(record)

    async def _set_state(self, app_id: int, state: str, error: AppError | None) -> None:
        record = self.apps[app_id]
        if not record.can_become(state):
            log.info("state_change_ignored", app_id=app_id, current=record.state, requested=state)
            return
        finished = now_ms() if state in AppState.TERMINAL else 0
        await self._save(replace(record, state=state, error=error or record.error, finished_ms=finished))
        await self._act(self.lifecycles.state_reported(app_id, state))
        log.info("app_state_changed", app_id=app_id, state=state, error=error.message if error else None)
        await self.bus.publish(subjects.app_state_events(app_id), ApplicationStateChanged(app_id, state, error))
        if state in AppState.TERMINAL:
            await self._follow(family.after_end(self.apps[app_id], self.apps))

    async def _follow(self, instructions: list) -> None:
        """Carry out what the end of one app of a multi-stage family means for the others."""
        for instruction in instructions:
            if isinstance(instruction, family.EndApp):
                await self._act(self.lifecycles.end(instruction.app_id, instruction.state, instruction.error,
                                                    instruction.reason))
            elif isinstance(instruction, family.DeleteStreams):
                try:
                    await intermediate.delete_streams(self.bus.nc, list(instruction.names))
                except JetStreamError as exc:
                    log.warning("streams_not_deleted", app_id=instruction.app_id, streams=instruction.names,
                                error=str(exc))
            else:
                raise RuntimeError(f"the master cannot carry out {instruction!r}")

    async def _stop_app_processes(self, app_id: int, reason: str) -> None:
        for worker_id in self.scheduler.workers_of(app_id):
            try:
                await self.bus.request(subjects.worker_shutdown(worker_id, app_id), ShutdownExecutor(app_id, None, reason),
                                       timeout=5)
            except RequestError as exc:
                log.warning("shutdown_request_failed", app_id=app_id, worker_id=worker_id, error=exc.message)

    async def _allocate(self, app_id, slots, placement, worker_id, priority, min_slots,
                        exclude: frozenset[str] = frozenset()) -> list[Allocation]:
        try:
            request = self.scheduler.request(app_id, slots, placement, worker_id, priority, min_slots, exclude)
        except InvalidResourceRequest as exc:
            raise bad_request(str(exc)) from None
        except SchedulingError as exc:
            raise RequestError(ErrorCode.UNAVAILABLE, str(exc)) from None
        future = asyncio.get_running_loop().create_future()
        self._waiting_resources[request.arrival] = future
        self._reschedule()
        try:
            return await asyncio.wait_for(future, self.resource_timeout)
        except asyncio.TimeoutError:
            raise RequestError(
                ErrorCode.UNAVAILABLE,
                f"no {min_slots or slots} free slot(s) within {self.resource_timeout:g} s "
                f"({self.scheduler.free_slots} free of {self.scheduler.total_slots})",
                retryable=True,
            ) from None
        finally:  # timed out, or cancelled (a kill cancels its app's launch): it waits no more
            self.scheduler.cancel(request)
            self._waiting_resources.pop(request.arrival, None)

    def _reschedule(self) -> None:
        for request, allocations in self.scheduler.schedule():
            future = self._waiting_resources.get(request.arrival)
            if future is not None and not future.done():
                future.set_result(allocations)
            else:
                for a in allocations:
                    self.scheduler.release(request.app_id, a.worker_id, a.slots)

    async def _registry_act(self, instructions: list) -> None:
        """Carry out what the worker registry decided; an instruction without a handler
        is a bug, and fails loudly."""
        for instruction in instructions:
            handler = self._registry_instructions.get(type(instruction))
            if handler is None:
                raise RuntimeError(f"the master cannot carry out {instruction!r}")
            await handler(instruction)

    async def _heartbeat_missed(self, missed: HeartbeatMissed) -> None:
        log.warning("worker_heartbeat_missed", worker_id=missed.worker_id, silent_s=round(missed.silent_s, 1))

    async def _heartbeat_resumed(self, resumed: HeartbeatResumed) -> None:
        log.info("worker_heartbeat_resumed", worker_id=resumed.worker_id)

    async def _worker_lost(self, lost: DeclareWorkerLost) -> None:
        """Forget a silent worker's slots; apps whose AppMaster ran there have FAILED."""
        affected = self.scheduler.remove_worker(lost.worker_id)
        log.error("worker_lost", worker_id=lost.worker_id, silent_s=round(lost.silent_s, 1), apps=affected)
        for app_id in affected:
            await self.bus.publish(subjects.appmaster_worker_lost(app_id),
                                   WorkerLost(lost.worker_id, f"no heartbeat for {lost.silent_s:.0f} s"))
        await self._act(self.lifecycles.worker_lost(lost.worker_id, f"sent no heartbeat for {lost.silent_s:.0f} s"))

    async def watch_heartbeats(self) -> None:
        """Feed the worker registry and the app lifecycles the time: silent workers are
        logged, then lost; AppMasters' deadlines."""
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            now = time.monotonic()
            await self._registry_act(self.registry.tick(now))
            await self._act(self.lifecycles.tick(now))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.master", description="gearbus master")
    add_nats_argument(parser)
    add_connect_timeout_argument(parser)
    parser.add_argument("--master-id", default="", help="this master's id (default: generated)")
    parser.add_argument("--heartbeat-interval", type=float, default=1.0, help="seconds between node heartbeats")
    parser.add_argument("--worker-timeout", type=float, default=10.0, help="seconds of silence before a worker is lost")
    parser.add_argument("--appmaster-timeout", type=float, default=None,
                        help="seconds of silence before an AppMaster is lost and relaunched "
                             "(default: 5 heartbeat intervals)")
    parser.add_argument("--lease-ttl", type=int, default=1,
                        help="seconds the leader lease lasts without renewal (whole seconds; default 1)")
    add_arguments(parser)
    parser.add_argument("--app-signer", metavar="FILE", default=os.environ.get(APP_SIGNER_ENV, ""),
                        help="the account signing key (.nk) it issues each app's credentials with "
                             f"(written by `gearbus security init`; env {APP_SIGNER_ENV})")
    args = parser.parse_args(argv)
    if args.lease_ttl < 1:
        parser.error("--lease-ttl must be at least 1 second")
    node_id = args.master_id or f"master-{uuid.uuid4().hex[:8]}"
    if not re.fullmatch(r"[A-Za-z0-9_-]+", node_id):
        parser.error(f"--master-id may hold only letters, digits, '-' and '_', got {node_id!r}")
    try:
        security = Security.from_args(args)
        app_credentials = AppCredentials.load(args.app_signer, security)
    except CredentialsError as exc:
        parser.error(str(exc))
    configure("master", node_id)
    return run_service(Master(nats_servers(args.nats), node_id, args.heartbeat_interval,
                              args.worker_timeout, lease_ttl_s=args.lease_ttl, security=security,
                              app_credentials=app_credentials, appmaster_timeout=args.appmaster_timeout),
                       args.connect_timeout)
