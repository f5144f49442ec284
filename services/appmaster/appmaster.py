"""The AppMaster role: one per application. The app's life is decided by its state
machine (gearbus/runtime/appmaster_state.py, which the TestRunner's engine drives too);
this shell carries out what it decides: requests to the master, executors and workers,
checkpoint and savepoint I/O, heartbeats and reports."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import pickle
import threading
import time
import traceback

import structlog

from gearbus.api.graph import Application, GraphError
from gearbus.control.config import SAVEPOINT_NAME, SAVEPOINT_NAME_RULE, AppConfig, ConfigError
from gearbus.runtime import appmaster_state as st
from gearbus.runtime import checkpoints as cp
from gearbus.runtime import state_query
from gearbus.stages import stage_count, stream_specs
from gearbus.runtime.guarantee import delivery_guarantee
from gearbus.artifact import ArtifactError
from gearbus.planner import processor_files
from gearbus.runtime.replace import ReplaceError, check_replacement
from gearbus.runtime.rescale import RescaleError, processors_of
from gearbus.runtime.savepoints import SavepointMismatch, SavepointRecord, claim, compacted, savepoint_parts, task_states
from gearbus.runtime.snapshots import COMPACT_DEPTH, TaskSnapshot
from services.appmaster import common
from services.appmaster.checkpoint_history import checkpoint_history
from services.appmaster.clock import ClockService
from services.appmaster.metrics import ProcessorMetricsAggregator
from services.appmaster.timeline import AppTimeline
from services.appmaster.versions import AppVersions
from services.checkpoint_store import CheckpointStore
from services.app_code import fetch_application
from services.launch import WORKER_ENV, launch_from_env, launch_security, parse_launched_args
from shared import subjects
from shared.bus import DEFAULT_REQUEST_TIMEOUT_S, RequestError, RequestTimeout, object_chunk_bytes
from shared.logging import configure
from shared.messages import (
    AppError,
    AppDag,
    AppMasterHeartbeat,
    AppRescaled,
    AppStimuli,
    AppVersion,
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
    MetricsHistory,
    PlanStages,
    ProcessorInfo,
    QueryMetricsHistory,
    QueryState,
    QueryStimuli,
    QueryTaskState,
    RegisterExecutor,
    ReRegister,
    ProcessorReplaced,
    ReplaceProcessor,
    RescaleApplication,
    RequestResource,
    ResourceAllocated,
    SavepointTaken,
    ShutdownExecutor,
    StagesStarted,
    StartAllTasks,
    StateValue,
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
from shared.service import run_service

log = structlog.get_logger()

MASTER_RETRY_S = 30.0  # how long requests to the master are retried while it fails over
STAGES_TIMEOUT_S = 60.0  # the master makes a multi-stage app's streams and records its stages
RESOURCE_TIMEOUT_S = 65.0  # a slot request waits at most this (the master's own wait, and a margin)
#: How long a launch that restores state may take to reply: its tasks reply once they hold
#: their state again, which takes time in step with its size (10 s, the default of a
#: request, was less than a restore of 5,000,000 keys, and each deployment failed). An
#: executor that hangs meanwhile is found by its heartbeats, which a restore never stops.
RESTORE_TIMEOUT_S = 600.0
SAVEPOINT_CHECKPOINT_ID = 1  # an app started from a savepoint restores it as its checkpoint 1
STATE_QUERY_TIMEOUT_S = 10.0  # how long the executor may take to read a key's state
FENCE_TIMEOUT_S = 5.0  # how long to wait for a worker to kill an executor declared lost


class AppFailure(Exception):
    """Ends the app as FAILED with the AppError it carries."""

    def __init__(self, error: AppError):
        super().__init__(error.message)
        self.error = error


class AppMaster(common.AppMasterProcess):
    def __init__(self, servers, launch: LaunchExecutor, worker_id: str, security: Security = Security()):
        super().__init__(servers, launch, worker_id, security)
        self.app: Application | None = None  # as planned, with the code versions its processors run
        self._loaded: Application | None = None  # as submitted
        self.stage_apps: list[int] = []  # a multi-stage app's AppMaster: the apps that run its stages
        self.versions: AppVersions | None = None  # the app's code history (gearbus replace)
        self._running_versions: dict[int, int] = {}  # processor id -> the version it runs, where not 1
        self.plan: Application | None = None  # at the parallelism it runs (a rescale changes it)
        self.state: st.AppMasterState | None = None
        self.counters: dict[int, dict[tuple[int, int], TaskCounters]] = {}  # by executor, then task
        self.stopped: set[int] = set()  # executors that exited once the app was ending
        self.clock: ClockService | None = None
        self._stalled_logged: set[str] = set()
        self.config = AppConfig()  # the app's, as it applies here (from its code and its launch)
        self.start_ms = 0
        self.dag: AppDag | None = None
        self.metrics: ProcessorMetricsAggregator | None = None
        self.timeline = AppTimeline()  # what the dashboard shows of the app's life
        self._restarts_recorded = 0
        self._events_stored = 0  # the timeline's events recorded when it was last stored
        self.store: CheckpointStore | None = None
        self._checkpoint_failure = ""
        self._last_completed_ms = 0
        self.guarantee = ("", "")
        #: checkpoint id -> (the epoch it was taken in, the tasks that took it), while kept
        self._checkpoints_taken: dict[int, tuple[int, list[tuple[int, int]]]] = {}
        self._change_requests = itertools.count(1)
        self._changes: dict[int, asyncio.Future] = {}  # rescale or replace request id -> its answer (an error, or "")
        self._compaction: asyncio.Task | None = None  # the last checkpoint compaction started
        self._savepoint_requests = itertools.count(1)
        self._savepoints: dict[int, asyncio.Future] = {}  # request id -> its checkpoint's meta
        self._instructions = {  # what the state machine (and its checkpoint coordinator) may ask
            st.Logged: common.log_instruction, st.StoreEpoch: self._store_epoch,
            st.RequestSlots: self._spawning(lambda i: self._request_slots(i.count), "request-slots"),
            st.RequestSlot: self._spawning(self._request_slot, "request-slot"),
            st.LaunchExecutor: self._spawning(self._launch_executor, "launch-executor"),
            st.AskExecutorsToRegister: self._ask_executors_to_register,
            st.Deploy: self._spawning(self._deploy, "deploy"), st.Fence: self._spawning(self._fence, "fence"),
            st.ReportState: self._report_state, st.AnswerSavepoint: self._answer_savepoint,
            st.RepeatFinalComplete: self._repeat_final_complete, st.EndApp: self._end_app,
            st.AnswerRescale: self._answer_change,
            st.AnswerReplace: self._answer_replace,
            st.Shutdown: self._spawning(self._shutdown, "shutdown"),
            cp.TriggerCheckpoint: self._trigger, cp.RetriggerCheckpoint: self._retrigger, cp.StoreCheckpoint: self._store,
            cp.NotifyComplete: self._notify_complete, cp.CompactCheckpoint: self._start_compaction,
            cp.PruneCheckpoints: self._start_prune, cp.AbandonCheckpoint: self._abandon,
        }

    @property
    def epoch(self) -> int:
        return self.state.epoch if self.state else 0

    @property
    def coordinator(self) -> cp.CheckpointCoordinator | None:
        return self.state.coordinator if self.state else None

    # --- lifecycle -------------------------------------------------------------

    async def setup(self) -> None:
        self.store = CheckpointStore(self.bus.js, self.app_id, chunk_bytes=object_chunk_bytes(self.bus.nc))
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
        await self.bus.serve(subjects.appmaster_state_query(self.app_id), {QueryState: self.on_state_query},
                             concurrent=True)
        await self.bus.serve(subjects.appmaster_debug(self.app_id), {QueryStimuli: self.on_stimuli_query})
        await self.bus.serve(subjects.appmaster_metrics_history(self.app_id),
                             {QueryMetricsHistory: self.on_metrics_history})
        await self.bus.serve(subjects.appmaster_rescale(self.app_id), {RescaleApplication: self.on_rescale},
                             concurrent=True)
        await self.bus.serve(subjects.appmaster_replace(self.app_id), {ReplaceProcessor: self.on_replace},
                             concurrent=True)
        await self.register()
        await self.bus.listen(subjects.MASTER_ELECTED, {MasterElected: self.on_master_changed})
        await self.bus.listen(subjects.appmaster_reregister(self.app_id), {ReRegister: self.on_master_changed})
        self.spawn(self.heartbeat_loop(), "heartbeat")
        self.spawn(self.begin(), "begin")

    # --- the application's start --------------------------------------------------

    async def begin(self) -> None:
        """Load and plan the app and start its state machine (a relaunched AppMaster
        adopts the running executors); from then on events drive it."""
        try:
            if await self._leads_stages():
                return
            if self.launch.attempt:
                record = await self.store.latest()
                latest = cp.CheckpointMeta.from_dict(record) if record else None
                stored = await self.store.get_epoch()
                # as the last rescale and replacement left them
                tasks = await self._prepare(dict(stored.parallelism), dict(stored.versions), stored.trial)
                # the state a replacement's new code drops of the latest checkpoint (none once a later one completed)
                dropped = dict(stored.drop_state) if latest and latest.checkpoint_id == stored.drop_state_checkpoint \
                    else {}
                self._machine(tasks, latest, stored.epoch + 1, stored.restarts, dropped, stored.trial)
                self._restarts_recorded = stored.restarts
                self.timeline.restore(await self.store.get_events())
                self.timeline.event(int(time.time() * 1000), "restart", f"AppMaster relaunched (attempt "
                                    f"{self.launch.attempt}), " + (f"from checkpoint {latest.checkpoint_id}"
                                                                   if latest else "from the start"))
                actions = self.state.start(time.monotonic(), latest, adopt=True)
            else:
                tasks = await self._prepare()
                restore = None
                if self.config.from_savepoint:
                    restore = await self._from_savepoint(self.config.from_savepoint, self.config.allow_unclaimed_state)
                self._machine(tasks, restore, 0, 0)
                actions = self.state.start(time.monotonic(), restore)
        except AppFailure as failure:
            await self._fail_unplanned(failure.error)
            return
        except Exception as exc:
            log.error("app_failed", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
            await self._fail_unplanned(AppError(type(exc).__name__, str(exc), "appmaster", traceback.format_exc()))
            return
        self.spawn(self.tick_loop(), "ticks")
        await self.carry_out(actions)

    async def _leads_stages(self) -> bool:
        """A multi-stage app's AppMaster runs no tasks: it has the master make the app's
        intermediate streams and start an app per stage (each checkpoints and recovers on
        its own), and reports the app running; the master ends it with its stages
        (services/master/stages.py). A relaunched one finds the stages started."""
        if "stage" in self.launch.config:
            return False
        app = await self._load()
        stages = stage_count(app)
        if stages < 2:
            return False
        self.app = self.plan = app
        self.dag = dag_of(app)
        try:
            started = await self.bus.request(subjects.appmaster_stages(self.app_id),
                                             PlanStages(self.app_id, stages, stream_specs(app)), expect=StagesStarted,
                                             timeout=STAGES_TIMEOUT_S, retry_s=MASTER_RETRY_S)
        except RequestError as exc:
            raise AppFailure(AppError("StagesNotStarted", exc.message, "starting the stages")) from None
        self.stage_apps = list(started.stage_apps)
        log.info("stages_started", stage_apps=self.stage_apps)
        failure, _ = await self._request_state(AppState.ACTIVE, None)  # again when relaunched: it may not have been
        if failure:
            log.error("state_report_failed", state=AppState.ACTIVE, error=failure)
        return True

    def _refuse_if_staged(self) -> None:
        """What runs tasks is asked of a stage's app, not of a multi-stage app's AppMaster."""
        if self.stage_apps:
            raise RequestError(ErrorCode.CONFLICT, f"app {self.app_id} runs in stages, each an app of its own "
                                                   f"({', '.join(map(str, self.stage_apps))}): ask the stage's app")

    async def _load(self, version: AppVersion | None = None) -> Application:
        if version is None and self._loaded is not None:
            return self._loaded
        try:
            app = await fetch_application(self.bus, version or self.launch)
        except Exception as exc:
            raise AppFailure(AppError(type(exc).__name__, str(exc), "loading the application",
                                     traceback.format_exc())) from None
        if version is None:
            self._loaded = app
        return app

    def _plan_tasks(self) -> list[TaskId]:
        return [TaskId(p.id, i) for p in self.plan.graph.processors for i in range(p.parallelism)]

    async def _prepare(self, parallelism: dict[int, int] | None = None,
                       versions: dict[int, int] | None = None, trial: tuple = ()) -> list[TaskId]:
        """Load the app and set up what every AppMaster attempt needs: config, clock origin,
        and the plan at ``parallelism`` (where a rescale changed it) with the code of
        ``versions`` (processor id -> version, where a replacement changed it; ``trial``:
        the one on trial, see StoreEpoch)."""
        submitted = await self._load()
        try:
            self.config = AppConfig.parse({**submitted.config, **self.launch.config}).resolved()
        except ConfigError as exc:
            raise AppFailure(AppError("ConfigError", str(exc), "planning tasks")) from None
        self.start_ms = self.launch.start_ms or int(time.time() * 1000)
        self.versions = AppVersions(self.launch, submitted, self.start_ms)
        if self.launch.attempt:
            self.versions.restore(await self.store.get_versions(), set((versions or {}).values()),
                                  trial[1] if trial else 0)
            lost = sorted(n for n in set((versions or {}).values()) if n > len(self.versions.history))
            if lost:
                raise AppFailure(AppError("VersionsLost", f"processors run code version(s) {lost}, which the stored "
                                                          "code history lacks", "relaunching the AppMaster"))
            for number in set((versions or {}).values()):
                self.versions.loaded(number, await self._load(self.versions.history[number - 1]))
        self._running_versions = dict(versions or {})
        self.app = self.versions.plan(self._running_versions)
        self._replan(parallelism or {})
        return self._plan_tasks()

    def _rescaled(self) -> dict[int, int]:
        """Each processor's parallelism in the plan, where it differs from the app's (a rescale's)."""
        planned = self.app.graph.processors
        return {p.id: p.parallelism for p in self.plan.graph.processors if p.parallelism != planned[p.id].parallelism}

    def _replan(self, parallelism: dict[int, int]) -> None:
        """The plan at the parallelism the app runs (a rescale changes it), and what follows
        it: the DAG reported, the metrics, the stalled-task clock."""
        self.plan = self.app.with_parallelism(parallelism)
        self.dag = dag_of(self.plan)
        if self.metrics is None:
            self.metrics = ProcessorMetricsAggregator(self.dag.processors)
        self.clock = ClockService([self._task_name(t) for t in self._plan_tasks()],
                                  self.config.stall_timeout_s, time.monotonic())

    def _machine(self, tasks: list[TaskId], latest: cp.CheckpointMeta | None, epoch: int, restarts: int,
                 drop_state: dict[int, tuple[str, ...]] | None = None, trial: tuple = ()) -> None:
        """The app's state machine, from its config, in ``epoch``, continuing after ``latest``."""
        settings = st.Settings.of(self.config, self.heartbeat_interval)
        coordinator = self._new_coordinator(latest, epoch)
        self.guarantee = delivery_guarantee(self.app, self.config.checkpoint_interval_ms > 0)
        self.state = st.AppMasterState([(t.processor, t.index) for t in tasks], coordinator, settings, epoch, restarts,
                                       {p.id: p.parallelism for p in self.app.graph.processors},
                                       {p.id: p.name for p in self.app.graph.processors},
                                       self._running_versions, drop_state, trial)

    def _new_coordinator(self, latest: cp.CheckpointMeta | None, epoch: int) -> cp.CheckpointCoordinator:
        """The checkpoint coordinator, from the app's config, continuing after ``latest``."""
        config = self.config
        keys = [(t.processor, t.index) for t in self._plan_tasks()]
        sources = [(p.id, i) for p in self.plan.graph.processors if p.is_source for i in range(p.parallelism)]
        return cp.CheckpointCoordinator(
            keys, sources, interval_s=config.checkpoint_interval_ms / 1000,
            timeout_s=config.checkpoint_timeout_ms / 1000, keep=config.checkpoints_kept,
            max_consecutive_failures=config.checkpoint_failures_tolerated, epoch=epoch, restored_from=latest,
            compact_depth=COMPACT_DEPTH)

    # --- carrying out what the state machine decides ---------------------------------

    async def carry_out(self, instructions: list) -> None:
        """Do what the state machine asked, in order: quick steps at once, requests that
        wait on other processes in the background (they report back as events). An
        instruction this shell has no handler for is a bug, and fails loudly."""
        await common.dispatch(self._instructions, instructions, "the AppMaster")

    def _spawning(self, method, name: str):
        return common.spawning(self, method, name)

    async def _store_epoch(self, store: st.StoreEpoch) -> None:
        try:
            await self.store.put_epoch(store)
        except Exception as exc:
            await self.carry_out(self.state.fail(AppError(type(exc).__name__, f"storing epoch {store.epoch}: {exc}",
                                                          "recovery")))

    async def _ask_executors_to_register(self, _: st.AskExecutorsToRegister) -> None:
        await self.bus.publish(subjects.executor_reregister(self.app_id), ReRegister("the AppMaster was relaunched"))

    async def _report_state(self, report: st.ReportState) -> None:
        if report.state == AppState.ACTIVE:
            log.info("app_active", executors=len(self.state.live_executors()), tasks=len(self.state.tasks),
                     guarantee=self.guarantee[0])
        self.spawn(self._send_state(report), "report")

    async def _send_state(self, report: st.ReportState) -> None:
        failure, retryable = await self._request_state(report.state, report.error)
        await self.carry_out(self.state.state_reported(report.state, time.monotonic(), failure, retryable))

    async def _answer_savepoint(self, answer: st.AnswerSavepoint) -> None:
        waiting = self._savepoints.pop(answer.request_id, None)
        if waiting is not None and not waiting.done():
            waiting.set_exception(RequestError(ErrorCode.UNAVAILABLE, answer.error, True)) \
                if answer.error else waiting.set_result(answer.meta)

    async def _repeat_final_complete(self, repeat: st.RepeatFinalComplete) -> None:
        await self.bus.publish(subjects.checkpoint_complete(self.app_id),
                               CheckpointComplete(repeat.checkpoint_id, repeat.epoch, True))

    async def _request_slots(self, count: int) -> None:
        config = self.config
        try:
            allocated = await self.bus.request(
                subjects.resource_request(self.app_id),
                RequestResource(self.app_id, count, min_slots=1, placement=config.placement,
                                worker_id=config.worker_id, priority=self.launch.priority),
                timeout=RESOURCE_TIMEOUT_S, expect=ResourceAllocated, retry_s=MASTER_RETRY_S)
        except RequestError as exc:
            await self.carry_out(self.state.fail(AppError("ResourcesUnavailable", exc.message, "requesting slots")))
            return
        workers = [a.worker_id for a in allocated.allocations for _ in range(a.slots)]
        await self.carry_out(self.state.slots_allocated(workers, time.monotonic()))

    async def _request_slot(self, request: st.RequestSlot) -> None:
        try:
            allocated = await self.bus.request(
                subjects.resource_request(self.app_id),
                RequestResource(self.app_id, 1, priority=self.launch.priority, exclude_workers=list(request.exclude)),
                timeout=RESOURCE_TIMEOUT_S, expect=ResourceAllocated, retry_s=MASTER_RETRY_S)
        except RequestError as exc:
            await self.carry_out(self.state.slot_failed(request.executor_id, exc.message))
            return
        await self.carry_out(self.state.slot_allocated(request.executor_id, allocated.allocations[0].worker_id,
                                                       time.monotonic()))

    async def _launch_executor(self, launch: st.LaunchExecutor) -> None:
        message = LaunchExecutor(
            app_id=self.app_id, executor_id=launch.executor_id, kind=ExecutorKind.EXECUTOR,
            artifact=self.launch.artifact, entry=self.launch.entry, artifact_kind=self.launch.artifact_kind,
            args=self.launch.args, config={**self.launch.config, "state_backend": self.state.settings.state_backend},
            app_name=self.launch.app_name, priority=self.launch.priority, worker_id=launch.worker_id,
            submitter_dir=self.launch.submitter_dir,
        )
        try:
            await self.bus.request(subjects.executor_launch(self.app_id), message, expect=ExecutorLaunched)
        except RequestError as exc:
            log.warning("executor_launch_failed", executor_id=launch.executor_id, worker_id=launch.worker_id,
                        error=exc.message)
            await self.carry_out(self.state.executor_launch_failed(launch.executor_id, exc.message,
                                                                   time.monotonic()))

    async def _deploy(self, deploy: st.Deploy) -> None:
        """Launch every executor's tasks in the deployment's epoch (replacing older ones),
        then start them all once all are subscribed."""
        ran = self.dag.processors
        if dict(deploy.versions) != self._running_versions:  # a replacement's, or its rollback
            self._running_versions = dict(deploy.versions)
            self.app = self.versions.plan(self._running_versions)
            self._replan(dict(deploy.parallelism))
        elif dict(deploy.parallelism) != self._rescaled():
            self._replan(dict(deploy.parallelism))  # a rescale's
        restore, kept = deploy.restore, set(deploy.kept)
        self._record_deployment(deploy, ran)
        self.metrics.redeployed(self.dag.processors, kept)
        launch_timeout = RESTORE_TIMEOUT_S if restore else DEFAULT_REQUEST_TIMEOUT_S
        await self._stop_compaction()
        try:
            await asyncio.gather(*(self.bus.request(
                subjects.executor_control(self.app_id, executor_id),
                LaunchTasks([TaskId(*t) for t in tasks], self.app.graph.digest(), self.start_ms, deploy.epoch,
                            restore.checkpoint_id if restore else 0, restore.epoch if restore else 0,
                            dict(deploy.parallelism), dict(deploy.restore_parallelism),
                            self.versions.running(self._running_versions),
                            {p: list(steps) for p, steps in deploy.drop_state}, dict(deploy.hold_from),
                            [TaskId(*t) for t in tasks if t in kept]),
                expect=TaskRegistered, timeout=launch_timeout)
                for executor_id, tasks in deploy.assignments))
            for executor_id, _ in deploy.assignments:
                await self.bus.request(subjects.executor_control(self.app_id, executor_id), StartAllTasks())
        except RequestError as exc:  # an executor failed while tasks were being launched
            log.warning("deployment_interrupted", epoch=deploy.epoch, error=exc.message)
            await self.carry_out(self.state.deploy_failed(deploy.epoch, exc.message, time.monotonic(),
                                                          refused=exc.code == ErrorCode.BAD_REQUEST))
            return
        await self.carry_out(self.state.deployed(deploy.epoch, time.monotonic()))

    async def _stop_compaction(self) -> None:
        """Fenced: a restore never reads a snapshot being replaced (the
        chains the compaction would have shortened read the same state)."""
        if self._compaction is not None:
            if not self._compaction.cancelling():  # once: a second cancel would cut its last put short
                self._compaction.cancel()
            await asyncio.wait([self._compaction])

    async def _fence(self, fence: st.Fence) -> None:
        """Have the worker kill the lost executor (it may only be hung or stopped); if the
        worker cannot be reached, the executor's next heartbeat is answered "fenced"."""
        self.counters.pop(fence.executor_id, None)
        if not fence.worker_id:
            return
        try:
            await self.bus.request(subjects.worker_shutdown(fence.worker_id, self.app_id),
                                   ShutdownExecutor(self.app_id, fence.executor_id, f"fenced: {fence.reason}",
                                                    force=True),
                                   timeout=FENCE_TIMEOUT_S)
        except RequestError as exc:
            log.warning("fence_kill_failed", executor_id=fence.executor_id, worker_id=fence.worker_id,
                        error=exc.message)

    async def _end_app(self, end: st.EndApp) -> None:
        """The app's outcome: logged, and the final counters sent before the final state."""
        if end.error is not None:
            log.error("app_failed", error=f"{end.error.error_type}: {end.error.message}", where=end.error.where)
        await self._send_heartbeat()

    async def _shutdown(self, shutdown: st.Shutdown) -> None:
        await self.stop_executors(shutdown.reason)
        self.stop()

    async def _fail_unplanned(self, error: AppError) -> None:
        """The app could not be loaded or planned: no state machine runs to decide its end.
        Reported once (the master also hears that this process exited), then this stops."""
        await self._end_app(st.EndApp(AppState.FAILED, error))
        failure, _ = await self._request_state(AppState.FAILED, error)
        if failure:
            log.error("state_report_failed", state=AppState.FAILED, error=failure)
        self.stop()

    async def tick_loop(self) -> None:
        """Feed the state machine the time: executor deadlines and the checkpoint clock."""
        interval_ms = self.config.checkpoint_interval_ms
        period = max(min(interval_ms / 4000, 0.25), 0.01) if interval_ms > 0 else 0.25
        while not self.state.ending:
            now = time.monotonic()
            await self.carry_out(self.state.tick(now))
            await asyncio.sleep(period)

    # --- checkpoints -----------------------------------------------------------------

    async def _trigger(self, trigger: cp.TriggerCheckpoint) -> None:
        # what its snapshots are stored by, should it be abandoned (and discarded) or pruned
        self._checkpoints_taken[trigger.checkpoint_id] = (trigger.epoch, sorted(self.coordinator.tasks))
        self.spawn(self.bus.publish(subjects.checkpoint_trigger(self.app_id),
                                    TriggerCheckpoint(trigger.checkpoint_id, trigger.epoch, trigger.park)),
                   f"trigger-{trigger.checkpoint_id}")

    async def _retrigger(self, trigger: cp.RetriggerCheckpoint) -> None:
        await self.bus.publish(subjects.checkpoint_trigger(self.app_id),
                               TriggerCheckpoint(trigger.checkpoint_id, trigger.epoch, trigger.park))

    async def _store(self, store: cp.StoreCheckpoint) -> None:
        self.spawn(self._store_checkpoint(store.meta), f"store-{store.meta.checkpoint_id}")

    async def _notify_complete(self, complete: cp.NotifyComplete) -> None:
        log.info("checkpoint_completed", checkpoint_id=complete.checkpoint_id, final=complete.final)
        self._last_completed_ms = int(time.time() * 1000)
        self.spawn(self.bus.publish(subjects.checkpoint_complete(self.app_id),
                                    CheckpointComplete(complete.checkpoint_id, complete.epoch, complete.final,
                                                       complete.compacted, complete.compacting)),
                   f"complete-{complete.checkpoint_id}")

    async def _start_compaction(self, compact: cp.CompactCheckpoint) -> None:
        self._compaction = self.spawn(self._compact(compact), f"compact-{compact.checkpoint_id}")

    async def _start_prune(self, prune: cp.PruneCheckpoints) -> None:
        self.spawn(self._prune(prune.checkpoint_ids), "prune-checkpoints")

    async def _abandon(self, abandon: cp.AbandonCheckpoint) -> None:
        self._checkpoint_failure = f"checkpoint {abandon.checkpoint_id}: {abandon.reason}"
        log.warning("checkpoint_abandoned", checkpoint_id=abandon.checkpoint_id, reason=abandon.reason)
        if abandon.discard:
            self.spawn(self._prune((abandon.checkpoint_id,)), f"discard-{abandon.checkpoint_id}")

    async def _store_checkpoint(self, meta: cp.CheckpointMeta) -> None:
        try:
            await self.store.put_record(meta.to_dict())
        except Exception as exc:
            await self.carry_out(self.state.checkpoint_store_failed(meta.checkpoint_id,
                                                                    f"{type(exc).__name__}: {exc}", time.monotonic()))
            return
        await self.carry_out(self.state.checkpoint_stored(meta.checkpoint_id, time.monotonic()))

    async def _compact(self, compact: cp.CompactCheckpoint) -> None:
        """Replace each deep snapshot of a completed checkpoint with the whole state its
        chain adds up to, one task at a time, the CPU work off the loop. Same object, same
        state: a restore reads either; :meth:`_deploy` cancels it (its chains stay as they
        were) and waits for it to end first, so no put is under way while tasks restore. Its
        thread, which the deployment does not wait for, stops before the next key group."""
        started, ok, sizes = time.monotonic(), True, {}
        stop = threading.Event()  # the thread adding up a chain runs on after a cancel: this ends it
        try:
            for task in compact.tasks:
                chain = await self.store.snapshot_chain(compact.checkpoint_id, compact.epoch, task)
                processor = self.plan.graph.processors[task[0]]
                try:  # takes the chain: one in memory at a time
                    data = await asyncio.to_thread(compacted, processor, chain, stop)
                except asyncio.CancelledError:
                    stop.set()
                    raise
                put = asyncio.ensure_future(self.store.put_snapshot(compact.checkpoint_id, compact.epoch, task, data))
                try:
                    await asyncio.shield(put)
                except asyncio.CancelledError:  # a put cut short leaves chunks no object names
                    await put
                    raise
                sizes[task] = len(data)
                del data
        except asyncio.CancelledError:  # a deployment is waiting: it restores from the chains
            log.info("checkpoint_compaction_cancelled", checkpoint_id=compact.checkpoint_id,
                     seconds=round(time.monotonic() - started, 3))
            await self.carry_out(self.state.checkpoint_compacted(compact.checkpoint_id, False, time.monotonic()))
            raise
        except Exception as exc:
            ok = False
            log.warning("checkpoint_compaction_failed", checkpoint_id=compact.checkpoint_id, error=repr(exc))
        else:
            log.info("checkpoint_compacted", checkpoint_id=compact.checkpoint_id, tasks=len(compact.tasks),
                     seconds=round(time.monotonic() - started, 3))
        await self.carry_out(self.state.checkpoint_compacted(compact.checkpoint_id, ok, time.monotonic(), sizes))

    async def _prune(self, checkpoint_ids) -> None:
        """Delete checkpoints: each task's snapshot (of the tasks that took it: a rescale
        changes them), and its record."""
        for checkpoint_id in checkpoint_ids:
            try:
                taken = self._checkpoints_taken.pop(checkpoint_id, None)
                if taken is None:  # completed under an earlier AppMaster
                    record = await self.store.record(checkpoint_id)
                    if record is None:
                        continue
                    taken = (record["epoch"], [tuple(task) for task in record["tasks"]])
                await self.store.delete(checkpoint_id, *taken)
            except Exception as exc:
                log.warning("checkpoint_prune_failed", checkpoint_id=checkpoint_id, error=repr(exc))

    # --- reading state ---------------------------------------------------------------

    async def on_state_query(self, msg: QueryState) -> StateValue:
        """Ask the task that owns the key for the step's state of it (the app runs on)."""
        self._refuse_if_staged()
        if self.state is None or not self.state.running:
            raise RequestError(ErrorCode.UNAVAILABLE, f"app {self.app_id} is not running: its state cannot be "
                                                      "read now", retryable=True)
        try:
            processor, index = state_query.locate(self.plan.graph.processors, msg.step,
                                                  state_query.parse_key(msg.key))
        except state_query.StateQueryError as exc:
            raise RequestError(ErrorCode.BAD_REQUEST, str(exc)) from None
        task = (processor.id, index)
        executor = next((e for e in self.state.live_executors() if task in e.tasks), None)
        if executor is None:
            raise RequestError(ErrorCode.UNAVAILABLE, f"task {processor.name}[{index}], which owns key {msg.key}, "
                                                      "is being replaced: try again", retryable=True)
        return await self.bus.request(subjects.executor_state_query(self.app_id, executor.executor_id),
                                      QueryTaskState(self.app_id, TaskId(*task), msg.step, msg.key),
                                      expect=StateValue, timeout=STATE_QUERY_TIMEOUT_S)

    async def on_stimuli_query(self, msg: QueryStimuli) -> AppStimuli:
        """The state machine's stimulus log: how the app came to where it is."""
        self._refuse_if_staged()
        if self.state is None:
            raise RequestError(ErrorCode.UNAVAILABLE, f"app {self.app_id} is still being planned", retryable=True)
        return common.stimuli(self.app_id, self.state.stimuli.entries, self.state.phase.value if self.state.phase else "",
                              self.epoch)

    # --- rescaling ----------------------------------------------------------------

    async def on_rescale(self, msg: RescaleApplication) -> AppRescaled:
        """Run steps at another parallelism while the app runs; answered once its tasks
        run at it (the state machine decides how: see gearbus/runtime/appmaster_state.py)."""
        self._refuse_if_staged()
        if self.state is None:
            raise RequestError(ErrorCode.UNAVAILABLE, f"app {self.app_id} is still starting", retryable=True)
        try:
            asked = processors_of(self.plan, msg.parallelism)
        except RescaleError as exc:
            raise RequestError(ErrorCode.BAD_REQUEST, str(exc)) from None

        async def ask(request_id: int) -> list:
            return self.state.rescale_requested(request_id, asked, time.monotonic())

        await self._change(ask)
        return AppRescaled(self.app_id, {p.name: p.parallelism for p in self.plan.graph.processors}, self.epoch)

    # --- replacing a processor's code ---------------------------------------------------

    async def on_replace(self, msg: ReplaceProcessor) -> ProcessorReplaced:
        """Run a processor with another version's code while the app runs: the version is
        loaded and checked against the running plan here (what is wrong is refused, the
        app untouched), and answered once the new code took a checkpoint (the state machine
        decides when, and rolls it back if it fails before: gearbus/runtime/appmaster_state.py)."""
        self._refuse_if_staged()
        if self.state is None:
            raise RequestError(ErrorCode.UNAVAILABLE, f"app {self.app_id} is still starting", retryable=True)
        version = AppVersion(0, msg.artifact, msg.entry, msg.artifact_kind, list(msg.args),
                             step=msg.step, created_ms=int(time.time() * 1000), artifact_digest=msg.artifact_digest,
                             submitter_dir=msg.submitter_dir)
        try:
            new = await fetch_application(self.bus, version)
            replacement = check_replacement(self.plan, new, msg.step, msg.drop_state)
        except (ArtifactError, GraphError, ReplaceError) as exc:
            raise RequestError(ErrorCode.BAD_REQUEST, f"the new version: {exc}") from None
        except Exception as exc:  # the new version's application() raised
            raise RequestError(ErrorCode.BAD_REQUEST, f"the new version does not load: "
                                                      f"{type(exc).__name__}: {exc}") from None
        version = dataclasses.replace(version, version=self.versions.next_version, processor=replacement.processor,
                                      dropped_state=list(replacement.dropped_state))  # numbered once nothing awaits

        async def ask(request_id: int) -> list:
            instructions = self.state.replace_requested(request_id, replacement.processor, version.version,
                                                        replacement.dropped_state, time.monotonic(), msg.at_ms,
                                                        replacement.same_state)
            self.versions.asked(request_id, version, new)
            self._record_version(self.versions.history[-1])
            await self._store_versions()
            return instructions

        await self._change(ask)
        return ProcessorReplaced(self.app_id, version.version, replacement.name, self.epoch,
                                 list(replacement.dropped_state))

    async def _change(self, ask) -> None:
        """A rescale or a replacement: ``ask(request_id)`` hands it to the state machine
        (which refuses it, the app untouched, or returns what to do), then its answer is
        awaited; one with an error fails the request with it."""
        request_id = next(self._change_requests)
        answer = self._changes[request_id] = asyncio.get_running_loop().create_future()
        try:
            instructions = await ask(request_id)
        except st.Refused as refused:
            del self._changes[request_id]
            raise RequestError(refused.code, refused.message) from None
        await self.carry_out(instructions)
        error = await answer
        if error:
            raise RequestError(ErrorCode.CONFLICT, error)
        await self._send_heartbeat()  # before the answer: the status it leads to shows the change's tasks

    async def _answer_change(self, answer: st.AnswerRescale | st.AnswerReplace) -> None:
        waiting = self._changes.pop(answer.request_id, None)
        if waiting is not None and not waiting.done():
            waiting.set_result(answer.error)

    async def _answer_replace(self, answer: st.AnswerReplace) -> None:
        if (version := self.versions.answered(answer.request_id, answer.error, answer.rolled_back)) is not None:
            self._record_version(version)
            await self._store_versions()  # before the answer: what the client hears, a relaunch knows
        await self._answer_change(answer)

    def _record_deployment(self, deploy: st.Deploy, ran: list[ProcessorInfo]) -> None:
        """The timeline's account of a deployment: a rescale (also a failed one's way back)
        or a restart from a checkpoint after a failure."""
        now_ms = int(time.time() * 1000)
        before = {p.id: p.parallelism for p in ran}
        rescaled = [f"{p.name} {before[p.id]} → {p.parallelism}" for p in self.dag.processors
                    if before.get(p.id, p.parallelism) != p.parallelism]
        if rescaled:
            self.timeline.event(now_ms, "rescale", ", ".join(rescaled))
        if self.state.restarts > self._restarts_recorded:
            self._restarts_recorded = self.state.restarts
            start = f"from checkpoint {deploy.restore.checkpoint_id}" if deploy.restore else "from the start"
            self.timeline.event(now_ms, "restart", f"restart {self.state.restarts}, epoch {deploy.epoch}, {start}")

    def _record_version(self, version: AppVersion) -> None:
        """The timeline's account of a replacement: each state its version comes to."""
        name = self.plan.graph.processors[version.processor].name
        error = f": {version.error}" if version.error else ""
        self.timeline.event(int(time.time() * 1000), "replace",
                            f"{name} (step {version.step}): version {version.version} {version.state}{error}")

    async def _store_events(self) -> None:
        """The timeline's events, once they changed, for a relaunched AppMaster; a failed
        write is logged (a relaunch would miss them) and tried again on the next heartbeat."""
        if self.store is None or self.timeline.recorded == self._events_stored:
            return
        try:
            await self.store.put_events(list(self.timeline.events))
            self._events_stored = self.timeline.recorded
        except Exception as exc:
            log.warning("storing_events_failed", error=f"{type(exc).__name__}: {exc}")

    async def on_metrics_history(self, _: QueryMetricsHistory) -> MetricsHistory:
        """The charts' figures over the last 15 minutes, as the heartbeats sampled them."""
        return self.timeline.history(self.app_id, self.dag.processors if self.dag else [],
                                     int(self.heartbeat_interval * 1000))

    async def _store_versions(self) -> None:
        """The code history, for a relaunched AppMaster (it loads the versions that run
        from it); a failed write is logged, and a relaunch that then misses a version the
        epoch record names fails the app with VersionsLost."""
        try:
            await self.store.put_versions(self.versions.history)
        except Exception as exc:
            log.error("storing_versions_failed", error=f"{type(exc).__name__}: {exc}")

    # --- savepoints ----------------------------------------------------------------

    async def on_savepoint(self, msg: TakeSavepoint) -> SavepointTaken:
        """Checkpoint now, then keep that checkpoint's state by step under ``msg.name``;
        with ``msg.stop`` the app then ends (TERMINATED)."""
        self._refuse_if_staged()
        if self.state is None or not self.state.running:
            raise RequestError(ErrorCode.UNAVAILABLE, f"app {self.app_id} is not running: no savepoint now",
                               retryable=True)
        if msg.name and not SAVEPOINT_NAME.fullmatch(msg.name):
            raise RequestError(ErrorCode.BAD_REQUEST, f"savepoint name {msg.name!r}: use {SAVEPOINT_NAME_RULE}")
        if msg.name and await self.store.savepoint(msg.name) is not None:
            raise RequestError(ErrorCode.CONFLICT, f"a savepoint named {msg.name!r} already exists")
        request_id = next(self._savepoint_requests)
        done = self._savepoints[request_id] = asyncio.get_running_loop().create_future()
        try:
            actions = self.state.savepoint_requested(request_id, msg.stop, time.monotonic())
        except st.Refused as refused:
            self._savepoints.pop(request_id, None)
            raise RequestError(refused.code, f"app {self.app_id}: {refused.message}", retryable=True) from None
        await self.carry_out(actions)
        meta: cp.CheckpointMeta = await done
        name = msg.name or f"app{self.app_id}-{meta.checkpoint_id}"
        try:
            steps = await self._write_savepoint(name, meta)
        except BaseException:
            await self.carry_out(self.state.savepoint_written(request_id, ok=False))
            raise
        log.info("savepoint_taken", name=name, checkpoint_id=meta.checkpoint_id, stop=msg.stop)
        await self.carry_out(self.state.savepoint_written(request_id))
        return SavepointTaken(self.app_id, name, meta.checkpoint_id, meta.size_bytes, sorted(steps))

    async def _write_savepoint(self, name: str, meta: cp.CheckpointMeta) -> dict[str, int]:
        """Copy a completed checkpoint's state, step by step, under the savepoint's name
        (once a compaction of it, which replaces its objects, is done)."""
        if self._compaction is not None:
            await asyncio.wait([self._compaction])
        parts: dict[tuple[str, int], bytes] = {}
        steps: dict[str, int] = {}
        for processor in self.plan.graph.processors:
            indexes = sorted(i for p, i in meta.tasks if p == processor.id)  # the tasks that took it
            for index in indexes:
                chain = await self.store.snapshot_chain(meta.checkpoint_id, meta.epoch, (processor.id, index))
                pickled = await asyncio.to_thread(savepoint_parts, processor, chain)  # off the loop: the heartbeats
                del chain
                for step, data in pickled.items():
                    parts[(step, index)] = data
                    steps[step] = len(indexes)
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
            claimed = claim(self.plan, record.steps, allow_unclaimed)
            size, tasks = await self._seed(record, claimed)
        except SavepointMismatch as exc:
            raise AppFailure(AppError("SavepointMismatch", f"savepoint {name!r}: {exc}",
                                      "restoring a savepoint")) from None
        meta = cp.CheckpointMeta(SAVEPOINT_CHECKPOINT_ID, self.epoch, time.monotonic(), 0.0, size, tuple(tasks), False)
        await self.store.put_record(meta.to_dict())
        log.info("restoring_savepoint", name=name, steps=sorted(claimed), from_app=record.app_id)
        return meta

    async def _seed(self, record: SavepointRecord, claimed: dict) -> tuple[int, list[tuple[int, int]]]:
        """Store each task's seeded snapshot of the savepoint's claimed steps."""
        size, tasks = 0, []
        for processor in self.plan.graph.processors:
            saved = {step: [pickle.loads(await self.store.savepoint_part(record, step, index))
                            for index in range(record.steps[step])]
                     for step, owner in claimed.items() if owner is processor}
            for index, state in enumerate(task_states(processor, saved, record.layout)):
                data = TaskSnapshot.seeded(SAVEPOINT_CHECKPOINT_ID, state).encode()
                await self.store.put_snapshot(SAVEPOINT_CHECKPOINT_ID, self.epoch, (processor.id, index), data)
                size += len(data)
                tasks.append((processor.id, index))
        return size, tasks

    # --- handlers --------------------------------------------------------------

    async def on_register(self, msg: RegisterExecutor) -> ExecutorRegistered:
        if self.state is None:
            raise RequestError(ErrorCode.UNAVAILABLE, f"app {self.app_id} is still starting", retryable=True)
        try:
            actions = self.state.executor_registered(msg.executor_id, msg.worker_id,
                                                     [(t.processor, t.index) for t in msg.tasks], msg.pid,
                                                     time.monotonic())
        except st.Refused as refused:
            raise RequestError(refused.code, f"app {self.app_id}: {refused.message}") from None
        log.info("executor_registered", executor_id=msg.executor_id, worker_id=msg.worker_id)
        await self.carry_out(actions)
        return ExecutorRegistered(self.app_id, msg.executor_id, self.heartbeat_interval)

    async def on_heartbeat(self, msg: ExecutorHeartbeat) -> None:
        if self.state is None:
            return
        try:
            known = self.state.executor_heartbeat(msg.executor_id, time.monotonic())
        except st.Refused as refused:
            raise RequestError(refused.code, refused.message) from None
        if known:
            counters = self.counters.setdefault(msg.executor_id, {})
            current = {(c.task.processor, c.task.index): c for c in msg.tasks if c.epoch == self.epoch}
            counters.update(current)
            await self.carry_out(self.state.input_watermarks(
                {task: c.watermark for task, c in current.items()}, time.monotonic(),
                {task: c.latest_event_ms for task, c in current.items() if c.latest_event_ms is not None}))

    async def on_stopped(self, msg: ExecutorStopped) -> None:
        if self.state is None or msg.kind != ExecutorKind.EXECUTOR:
            return
        if self.state.ending:
            self.stopped.add(msg.executor_id)
            return
        await self.carry_out(self.state.executor_stopped(msg.executor_id, msg.worker_id, msg.exit_detail(),
                                                         msg.worker_gone, time.monotonic()))

    async def on_worker_lost(self, msg: WorkerLost) -> None:
        if self.state is not None:
            await self.carry_out(self.state.worker_lost(msg.worker_id, time.monotonic()))

    async def on_task_finished(self, msg: TaskFinished) -> None:
        if self.state is None or msg.epoch != self.epoch:
            return
        key = (msg.counters.task.processor, msg.counters.task.index)
        self.counters.setdefault(msg.executor_id, {})[key] = msg.counters
        await self.carry_out(self.state.task_finished(key, msg.epoch))

    async def on_task_failed(self, msg: TaskFailed) -> None:
        if self.state is None:
            return
        log.warning("task_failed", task=self._task_name(msg.task), kind=msg.error.kind or None, step=msg.error.step,
                    error=f"{msg.error.error_type}: {msg.error.message}", record=msg.error.record or None,
                    location=msg.error.location or None, exception=msg.error.traceback)
        await self.carry_out(self.state.task_failed((msg.task.processor, msg.task.index), msg.epoch, msg.error,
                                                    msg.recoverable, msg.executor_id, time.monotonic()))

    async def on_task_ended(self, msg: TaskEnded) -> None:
        if self.state is not None:
            await self.carry_out(self.state.task_ended((msg.task.processor, msg.task.index), msg.epoch,
                                                       time.monotonic()))

    async def on_checkpointed(self, msg: TaskCheckpointed) -> None:
        if self.state is not None:
            await self.carry_out(self.state.checkpoint_acked(msg.checkpoint_id, msg.epoch,
                                                             (msg.task.processor, msg.task.index), msg.size_bytes,
                                                             msg.ended, time.monotonic(), msg.alignment_ms / 1000,
                                                             msg.root, msg.depth, msg.records_in))

    async def on_declined(self, msg: CheckpointDeclined) -> None:
        if self.state is not None:
            await self.carry_out(self.state.checkpoint_declined(msg.checkpoint_id, msg.epoch,
                                                                (msg.task.processor, msg.task.index), msg.reason,
                                                                time.monotonic()))

    # --- reports ---------------------------------------------------------------------

    async def stop_executors(self, reason: str) -> None:
        for executor in self.state.live_executors() if self.state else []:
            if executor.executor_id in self.stopped or not executor.worker_id:
                continue
            try:
                await self.bus.request(
                    subjects.worker_shutdown(executor.worker_id, self.app_id),
                    ShutdownExecutor(self.app_id, executor.executor_id, reason),
                    timeout=5,
                )
            except RequestError as exc:
                log.warning("executor_shutdown_failed", executor_id=executor.executor_id, error=exc.message)

    async def _request_state(self, state: str, error: AppError | None) -> tuple[str, bool]:
        """Tell the master the app's state: ("", False) once it answered, else (why, whether
        to try again: it did not answer in time)."""
        try:
            await self.bus.request(subjects.appmaster_state(self.app_id),
                                   ApplicationStateChanged(self.app_id, state, error), timeout=5,
                                   retry_s=MASTER_RETRY_S)
        except RequestTimeout as exc:
            return exc.message, True
        except RequestError as exc:
            return exc.message, False
        if state not in AppState.TERMINAL:  # (the master records when the app ended)
            self.timeline.event(int(time.time() * 1000), "state", state)
        return "", False

    def _checkpoint_stats(self) -> CheckpointStats | None:
        if self.coordinator is None:
            return None
        stats, latest = self.coordinator.stats(), self.coordinator.latest()
        return CheckpointStats(
            interval_ms=self.config.checkpoint_interval_ms,
            last_id=latest.checkpoint_id if latest else 0,
            last_completed_ms=self._last_completed_ms if latest and stats.latest_completed_at is not None else 0,
            last_duration_ms=int(latest.duration_s * 1000) if latest else 0,
            last_size_bytes=latest.size_bytes if latest else 0,
            completed=stats.completed, failed=stats.failed, last_failure=self._checkpoint_failure,
            epoch=self.epoch, history=checkpoint_history(stats.history, time.monotonic(), time.time()),
        )

    async def _send_heartbeat(self) -> None:
        live = self.state.live_executors() if self.state else []
        # the tasks each executor hosts now (a rescale moves and drops some: their counters go), as they
        # counted in this epoch (a task's counters of the epoch before are not its records since)
        counters = [c for e in live for task in e.tasks
                    if (c := self.counters.get(e.executor_id, {}).get(task)) is not None and c.epoch == self.epoch]
        # every task hosted is listed from the start of an epoch (status shows a change's tasks at once),
        # at zero until its executor reports it; the clock and the metrics take only what was reported
        reported = {(c.task.processor, c.task.index) for c in counters}
        listed = counters + [TaskCounters(TaskId(*task), epoch=self.epoch, executor_id=e.executor_id)
                             for e in live for task in e.tasks if task not in reported]
        clock, stalled = None, []
        if self.clock is not None:
            now = time.monotonic()
            for c in counters:
                self.clock.update(self._task_name(c.task), c.watermark, c.records_in, c.finished, now)
            clock, stalled = self.clock.clock(), self.clock.stalled(now)
            for name in set(stalled) - self._stalled_logged:
                log.warning("task_stalled", task=name, stall_timeout_s=self.clock.stall_after_s)
            self._stalled_logged = set(stalled)
        now_ms = int(time.time() * 1000)
        processors = self.metrics.update(counters, time.monotonic(), now_ms) if self.metrics is not None else []
        self.timeline.sample(now_ms, processors)
        await self._store_events()
        restarts, blacklist = (self.state.restarts, sorted(self.state.blacklist)) if self.state else (0, [])
        await self.bus.publish(subjects.appmaster_heartbeat(self.app_id),
                               AppMasterHeartbeat(self.app_id, len(live), listed, clock, stalled, restarts, blacklist,
                                                  *self.guarantee, self._checkpoint_stats(), self.dag, processors,
                                                  self.launch.attempt,
                                                  self.versions.history if self.versions else [],
                                                  list(self.timeline.events)))

    def _task_name(self, task: TaskId) -> str:
        """``count[1]``: called per task on every heartbeat, so no table of names is built
        (a processor's id is its position in the plan); ``task 3.1`` for an unknown one."""
        processors = self.plan.graph.processors
        if 0 <= task.processor < len(processors):
            return f"{processors[task.processor].name}[{task.index}]"
        return task.named({})

    async def heartbeat_loop(self) -> None:
        while True:
            await self._send_heartbeat()
            await asyncio.sleep(self.heartbeat_interval)


def dag_of(app: Application) -> AppDag:
    """The plan as the dashboard and ``gearbus status`` show it."""
    described = app.graph.describe()
    return AppDag([ProcessorInfo(d["id"], d["name"], d["parallelism"], d["task"], processor_files(p))
                   for d, p in zip(described["processors"], app.graph.processors)],
                  [EdgeInfo(e["from"], e["to"], e["partitioner"]) for e in described["edges"]])


def main(argv: list[str] | None = None) -> int:
    args = parse_launched_args("appmaster", argv)
    launch = launch_from_env()
    configure("appmaster", f"app{launch.app_id}-appmaster", app_id=launch.app_id)
    return run_service(AppMaster(args.nats, launch, os.environ.get(WORKER_ENV, ""), launch_security(launch)))
