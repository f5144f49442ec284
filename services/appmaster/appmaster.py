"""The AppMaster role: one per application. Plans tasks, obtains executors, launches
and starts tasks, collects heartbeats, and ends the app when its tasks end or fail."""

from __future__ import annotations

import asyncio
import collections
import os
import time
import traceback

import structlog

from gearbus.api.graph import Application
from services.appmaster.clock import ClockService
from services.launch import WORKER_ENV, fetch_application, launch_from_env, parse_launched_args
from shared import subjects
from shared.bus import RequestError, RequestTimeout
from shared.logging import configure
from shared.messages import (
    AppError,
    AppMasterHeartbeat,
    AppMasterRegistered,
    ApplicationStateChanged,
    AppState,
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
    RegisterAppMaster,
    RegisterExecutor,
    ReRegister,
    RequestResource,
    ResourceAllocated,
    ShutdownExecutor,
    StartAllTasks,
    TaskCounters,
    TaskFailed,
    TaskFinished,
    TaskId,
    TaskRegistered,
    WorkerLost,
)
from shared.service import Service, run_service

log = structlog.get_logger()

DEFAULT_EXECUTORS = 2
STARTUP_TIMEOUT_S = 60.0
EXECUTOR_TIMEOUT_HEARTBEATS = 5  # an executor silent this many heartbeat intervals is lost (hung or host lost)
DEFAULT_MAX_RESTARTS = 10  # app config "max_restarts": executor losses the app survives
DEFAULT_BLACKLIST_AFTER = 3  # app config "blacklist_after": executor failures on one worker before avoiding it
ADOPTION_WINDOW_HEARTBEATS = 2  # a relaunched AppMaster waits this long for the running executors
MASTER_RETRY_S = 30.0  # how long requests to the master are retried while it fails over
DEFAULT_STALL_TIMEOUT_S = 30.0  # app config "stall_timeout_s"  # an executor silent this long is lost (hung process or lost host)


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


class AppMaster(Service):
    role = "appmaster"

    def __init__(self, servers, launch: LaunchExecutor, worker_id: str):
        super().__init__(servers, node_id=f"app{launch.app_id}-appmaster")
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
        self.restarts = 0
        self.blacklist: set[str] = set()
        self._failures: collections.Counter[str] = collections.Counter()
        self._recovering = asyncio.Lock()
        self.adopting = False
        self._finished_on_adoption: set[tuple[int, int]] = set()
        self._ending = False

    # --- lifecycle -------------------------------------------------------------

    async def setup(self) -> None:
        self.outcome = asyncio.get_running_loop().create_future()
        await self.bus.serve(subjects.appmaster_executor_register(self.app_id), {RegisterExecutor: self.on_register})
        await self.bus.serve(subjects.appmaster_executor_heartbeat(self.app_id), {ExecutorHeartbeat: self.on_heartbeat})
        await self.bus.listen(subjects.appmaster_executor_stopped(self.app_id), {ExecutorStopped: self.on_stopped})
        await self.bus.listen(subjects.appmaster_task_finished(self.app_id), {TaskFinished: self.on_task_finished})
        await self.bus.listen(subjects.appmaster_task_failed(self.app_id), {TaskFailed: self.on_task_failed})
        await self.bus.listen(subjects.appmaster_worker_lost(self.app_id), {WorkerLost: self.on_worker_lost})
        await self.register()
        await self.bus.listen(subjects.MASTER_ELECTED, {MasterElected: self.on_master_changed})
        await self.bus.listen(subjects.appmaster_reregister(self.app_id), {ReRegister: self.on_master_changed})
        self.spawn(self.heartbeat_loop(), "heartbeat")
        self.spawn(self.drive(), "drive")

    async def register(self) -> None:
        registered = await self.bus.request(
            subjects.APPMASTER_REGISTER,
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
            log.info("app_active", executors=len(self.executors), tasks=len(self.unfinished))
            await self.outcome
        except AppFailure as failure:
            state, error = AppState.FAILED, failure.error
        except Exception as exc:
            state = AppState.FAILED
            error = AppError(type(exc).__name__, str(exc), "appmaster", traceback.format_exc())
            log.error("app_failed", error=f"{type(exc).__name__}: {exc}")
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

    async def start_app(self) -> None:
        self.app = await self._load()
        config = self.config = {**self.app.config, **self.launch.config}
        self.start_ms = self.launch.start_ms or int(time.time() * 1000)
        tasks = self._plan_tasks()
        wanted = max(1, min(int(config.get("executors", DEFAULT_EXECUTORS)), len(tasks)))
        allocated = await self.bus.request(
            subjects.RESOURCE_REQUEST,
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
        for slot in slots:
            if slot.tasks:
                await self._launch_tasks(slot, restart=False)
        self.unfinished = {(t.processor, t.index) for t in tasks}
        self.clock = ClockService([self._task_name(t) for t in tasks],
                                  float(config.get("stall_timeout_s", DEFAULT_STALL_TIMEOUT_S)), time.monotonic())
        for slot in slots:
            if slot.tasks:
                await self.bus.request(subjects.executor_control(self.app_id, slot.executor_id), StartAllTasks())

    async def adopt_app(self) -> None:
        """A relaunched AppMaster: the executors still running register with it (with the
        tasks they host); tasks nobody reports are restarted elsewhere."""
        self.app = await self._load()
        self.config = {**self.app.config, **self.launch.config}
        self.start_ms = self.launch.start_ms or int(time.time() * 1000)
        tasks = self._plan_tasks()
        self.adopting = True
        await self.bus.publish(subjects.executor_reregister(self.app_id), ReRegister("the AppMaster was relaunched"))
        await asyncio.sleep(ADOPTION_WINDOW_HEARTBEATS * self.heartbeat_interval)  # executors answer within it
        self.adopting = False
        hosted = {(t.processor, t.index) for slot in self.executors.values() for t in slot.tasks}
        self.unfinished = {(t.processor, t.index) for t in tasks} - self._finished_on_adoption
        self.clock = ClockService([self._task_name(t) for t in tasks],
                                  float(self.config.get("stall_timeout_s", DEFAULT_STALL_TIMEOUT_S)), time.monotonic())
        orphans = [t for t in tasks if (t.processor, t.index) not in hosted and (t.processor, t.index) in self.unfinished]
        log.info("app_adopted", executors=len(self.executors), orphaned_tasks=len(orphans))
        if orphans:
            lost = ExecutorSlot(-1, "")
            lost.tasks = orphans
            await self._recover(lost, "their executors did not survive the AppMaster", worker_suspect=False)

    async def _launch_tasks(self, slot: ExecutorSlot, restart: bool) -> None:
        finished = [t for t in self._plan_tasks() if (t.processor, t.index) not in self.unfinished] if restart else []
        await self.bus.request(
            subjects.executor_control(self.app_id, slot.executor_id),
            LaunchTasks(slot.tasks, self.app.graph.digest(), self.start_ms, restart, finished),
            expect=TaskRegistered,
        )

    # --- recovery ------------------------------------------------------------------

    def executor_lost(self, slot: ExecutorSlot, reason: str, worker_suspect: bool = False) -> None:
        """An executor is gone while the app runs: restart its tasks elsewhere.
        ``worker_suspect``: its worker may be gone too (it went silent), so avoid it."""
        if self._ending or slot.lost:
            return
        slot.lost = slot.stopped = True
        log.error("executor_lost", executor_id=slot.executor_id, worker_id=slot.worker_id, reason=reason)
        if not slot.registered.done():
            slot.registered.set_exception(AppFailure(AppError("ExecutorLost", reason, "starting executors")))
        if self.app is None or self.clock is None:  # still starting: the start-up fails instead
            self._fail(AppError("ExecutorLost", reason, f"executor {slot.executor_id}"))
            return
        self.spawn(self._recover(slot, reason, worker_suspect), f"recover-executor-{slot.executor_id}")

    def _count_failure(self, worker_id: str, reason: str, where: str) -> bool:
        """Record a failure on ``worker_id``; False once the restart budget is spent."""
        self.restarts += 1
        failures = self._failures[worker_id] = self._failures[worker_id] + 1
        if failures >= int(self.config.get("blacklist_after", DEFAULT_BLACKLIST_AFTER)) \
                and worker_id not in self.blacklist:
            log.warning("worker_blacklisted", worker_id=worker_id, failures=failures)
            self.blacklist.add(worker_id)
        budget = int(self.config.get("max_restarts", DEFAULT_MAX_RESTARTS))
        if self.restarts > budget:
            self._fail(AppError("RestartBudgetExhausted", f"{reason}; gave up after {budget} restarts", where))
            return False
        return True

    async def _recover(self, lost: ExecutorSlot, reason: str, worker_suspect: bool) -> None:
        async with self._recovering:
            where = f"executor {lost.executor_id}"
            if self._ending or not self._count_failure(lost.worker_id, reason, where):
                return
            tasks = [t for t in lost.tasks if (t.processor, t.index) in self.unfinished]
            log.warning("restarting_tasks", tasks=[self._task_name(t) for t in tasks], restarts=self.restarts,
                        guarantee="at-most-once")
            avoid = {lost.worker_id} if worker_suspect else set()
            while tasks and not self._ending:
                try:
                    slot = await self._relaunch(tasks, self.blacklist | avoid)
                    log.info("tasks_restarted", executor_id=slot.executor_id, worker_id=slot.worker_id)
                    return
                except AppFailure as failure:
                    self._fail(failure.error)
                    return
                except RelaunchFailed as failure:
                    log.warning("relaunch_failed", worker_id=failure.worker_id, error=str(failure))
                    avoid.add(failure.worker_id)
                    if not self._count_failure(failure.worker_id, f"{reason}; relaunching its tasks failed: "
                                                                  f"{failure}", where):
                        return

    async def _relaunch(self, tasks: list[TaskId], avoid: set[str]) -> ExecutorSlot:
        """Get a slot away from ``avoid`` (when the cluster has one), start an executor
        there and run ``tasks`` on it as restarted tasks."""
        allocated = None
        for exclude in (avoid, self.blacklist):  # away from suspects if possible, else anywhere allowed
            try:
                allocated = await self.bus.request(
                    subjects.RESOURCE_REQUEST,
                    RequestResource(self.app_id, 1, priority=self.launch.priority, exclude_workers=sorted(exclude)),
                    timeout=STARTUP_TIMEOUT_S + 5, expect=ResourceAllocated, retry_s=MASTER_RETRY_S)
                break
            except RequestError as exc:
                if exclude == self.blacklist:
                    raise AppFailure(AppError("RecoveryFailed", f"no slot for the lost tasks: {exc.message}",
                                              "recovery")) from None
        slot = ExecutorSlot(len(self.executors), allocated.allocations[0].worker_id)
        slot.tasks = tasks
        self.executors[slot.executor_id] = slot
        try:
            await self._launch_executor(slot)
            await asyncio.wait_for(slot.registered, STARTUP_TIMEOUT_S)
            await self._launch_tasks(slot, restart=True)
            await self.bus.request(subjects.executor_control(self.app_id, slot.executor_id), StartAllTasks())
        except (RequestError, AppFailure, asyncio.TimeoutError) as exc:
            slot.lost = slot.stopped = True
            raise RelaunchFailed(slot.worker_id, exc) from None
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
            priority=self.launch.priority,
        )
        await self.bus.request(subjects.worker_launch(slot.worker_id), launch, expect=ExecutorLaunched)

    async def stop_executors(self, reason: str) -> None:
        for slot in self.executors.values():
            if slot.stopped:
                continue
            try:
                await self.bus.request(
                    subjects.worker_shutdown(slot.worker_id),
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
                await self.bus.request(subjects.APPMASTER_STATE, ApplicationStateChanged(self.app_id, state, error),
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
            self._finished_on_adoption |= {(t.processor, t.index) for t in msg.finished}
        if slot is None:
            raise RequestError(ErrorCode.NOT_FOUND, f"app {self.app_id} launched no executor {msg.executor_id}")
        if slot.registered.done():
            raise RequestError(
                ErrorCode.CONFLICT,
                f"executor id {msg.executor_id} is already registered (from worker {slot.worker_id}); "
                f"duplicate from pid {msg.pid} on worker {msg.worker_id} refused",
            )
        slot.last_heartbeat = time.time()
        slot.registered.set_result(None)
        log.info("executor_registered", executor_id=msg.executor_id, worker_id=msg.worker_id)
        return ExecutorRegistered(self.app_id, msg.executor_id, self.heartbeat_interval)

    async def on_heartbeat(self, msg: ExecutorHeartbeat) -> None:
        slot = self.executors.get(msg.executor_id)
        if slot is None:
            return
        slot.last_heartbeat = time.time()
        slot.missed_logged = False
        for c in msg.tasks:
            slot.counters[(c.task.processor, c.task.index)] = c

    async def on_stopped(self, msg: ExecutorStopped) -> None:
        slot = self.executors.get(msg.executor_id)
        if slot is None or msg.kind != ExecutorKind.EXECUTOR:
            return
        if self._ending:
            slot.stopped = True
            return
        self.executor_lost(slot, f"executor {msg.executor_id} on worker {msg.worker_id} exited with code "
                                 f"{msg.exit_code}")

    async def on_task_finished(self, msg: TaskFinished) -> None:
        key = (msg.counters.task.processor, msg.counters.task.index)
        slot = self.executors.get(msg.executor_id)
        if slot is not None:
            slot.counters[key] = msg.counters
        self.unfinished.discard(key)
        if not self.unfinished and not self.outcome.done():
            log.info("all_tasks_finished")
            self.outcome.set_result(None)

    async def on_task_failed(self, msg: TaskFailed) -> None:
        log.error("task_failed", task=f"{msg.task.processor}.{msg.task.index}", error=msg.error.message)
        self._fail(msg.error)

    async def _send_heartbeat(self) -> None:
        counters = [c for slot in self.executors.values() for c in slot.counters.values()]
        clock, stalled = None, []
        if self.clock is not None:
            now = time.monotonic()
            for c in counters:
                self.clock.update(self._task_name(c.task), c.watermark, c.records_in, c.finished, now)
            clock, stalled = self.clock.clock(), self.clock.stalled(now)
            for name in set(stalled) - self._stalled_logged:
                log.warning("task_stalled", task=name, stall_timeout_s=self.clock.stall_after_s)
            self._stalled_logged = set(stalled)
        await self.bus.publish(subjects.APPMASTER_HEARTBEAT,
                               AppMasterHeartbeat(self.app_id, len(self.executors), counters, clock, stalled,
                                                  self.restarts, sorted(self.blacklist)))

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


def main(argv: list[str] | None = None) -> int:
    args = parse_launched_args("appmaster", argv)
    launch = launch_from_env()
    configure("appmaster", f"app{launch.app_id}-appmaster", app_id=launch.app_id)
    return run_service(AppMaster(args.nats, launch, os.environ.get(WORKER_ENV, "")))
