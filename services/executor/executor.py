"""The executor role: hosts tasks of one application and runs their data plane."""

from __future__ import annotations

import asyncio
import os
import signal

import structlog

from gearbus.api.graph import Application
from gearbus.api.io_tasks import DataSourceTask
from gearbus.runtime.chain import failure_report
from gearbus.runtime.core import Snapshot
from gearbus.runtime.snapshots import TaskSnapshot
from services.checkpoint_store import CheckpointStore
from services.executor.heartbeat import Heartbeat
from services.executor.outputs import DataPlaneConfig
from services.executor.task_runner import TaskRunner
from services.launch import (WORKER_ENV, WORKER_GONE_SIGNAL, fetch_application, launch_from_env,
                             launch_security, parse_launched_args)
from shared import subjects
from shared.bus import RequestError
from shared.logging import configure
from shared.messages import (
    AppError,
    CheckpointComplete,
    CheckpointDeclined,
    ErrorCode,
    ExecutorHeartbeat,
    ExecutorKind,
    ExecutorRegistered,
    ExecutorStopped,
    LaunchExecutor,
    LaunchTasks,
    RegisterExecutor,
    ReRegister,
    StartAllTasks,
    TaskCheckpointed,
    TaskEnded,
    TaskFailed,
    TaskFinished,
    TaskRegistered,
    TriggerCheckpoint,
)
from shared.security import Security
from shared.service import Service, run_service

log = structlog.get_logger()

DEFAULT_APPMASTER_TIMEOUT_S = 30.0  # app config "appmaster_timeout_s": then an orphaned executor stops
EXIT_APPMASTER_GONE = 3
EXIT_FENCED = 4
EXIT_WORKER_GONE = 5
ACKS_KEPT = 4  # checkpoints whose acks an executor can repeat
REPORT_REPEAT_S = 1.0  # a task's end (finished or failed) is reported again this often until its attempt is replaced


class Executor(Service):
    role = "executor"

    def __init__(self, servers, launch: LaunchExecutor, worker_id: str, worker_pid: int | None = None,
                 security: Security = Security()):
        """``worker_pid``: the worker that launched this process (None: not launched by one)."""
        super().__init__(servers, node_id=f"app{launch.app_id}-executor{launch.executor_id}", security=security)
        self.servers = [servers] if isinstance(servers, str) else list(servers)
        self.launch = launch
        self.app_id = launch.app_id
        self.executor_id = launch.executor_id
        self.worker_id = worker_id
        self.worker_pid = worker_pid
        self.app: Application | None = None
        self.config: DataPlaneConfig | None = None
        self.epoch = -1  # the attempt whose tasks run here (-1: none launched yet)
        self.runners: list[TaskRunner] = []
        self._running: dict[TaskRunner, asyncio.Task] = {}
        self.store: CheckpointStore | None = None
        self.heartbeat_interval = 1.0
        self.heartbeat: Heartbeat | None = None
        self._acks: dict[int, list[TaskCheckpointed]] = {}  # the last checkpoints' acks, to repeat if asked

    # --- lifecycle -------------------------------------------------------------

    async def setup(self) -> None:
        self.app = await fetch_application(self.bus, self.launch)
        self.config = DataPlaneConfig.from_config({**self.app.config, **self.launch.config})
        self.store = CheckpointStore(self.bus.js, self.app_id)
        await self.bus.serve(
            subjects.executor_control(self.app_id, self.executor_id),
            {LaunchTasks: self.on_launch_tasks, StartAllTasks: self.on_start_all_tasks},
        )
        await self.bus.listen(subjects.executor_reregister(self.app_id), {ReRegister: self.on_reregister})
        await self.bus.listen(subjects.checkpoint_trigger(self.app_id), {TriggerCheckpoint: self.on_trigger})
        await self.bus.listen(subjects.checkpoint_complete(self.app_id), {CheckpointComplete: self.on_complete})
        await self.register()
        self._start_heartbeat()

    async def register(self) -> None:
        """Register with the AppMaster; with a relaunched one, say which tasks run here."""
        registered = await self.bus.request(
            subjects.appmaster_executor_register(self.app_id),
            RegisterExecutor(self.app_id, self.executor_id, self.worker_id, os.getpid(),
                             tasks=[r.task_id for r in self.runners],
                             finished=[r.task_id for r in self.runners if r.finished]),
            expect=ExecutorRegistered,
        )
        self.heartbeat_interval = registered.heartbeat_interval_s

    async def on_reregister(self, msg: ReRegister) -> None:
        log.info("reregistering_with_appmaster", reason=msg.reason)
        self.spawn(self.register(), "reregister")

    async def shutdown(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        await self._stop_runners()

    # --- handlers --------------------------------------------------------------

    async def on_launch_tasks(self, msg: LaunchTasks) -> TaskRegistered:
        """Run ``msg.tasks`` in attempt ``msg.epoch``, restored from its checkpoint. The tasks
        of an older attempt stop first; the same launch again changes nothing."""
        digest = self.app.graph.digest()
        if msg.dag_digest != digest:
            raise RequestError(
                ErrorCode.CONFLICT,
                f"executor {self.executor_id} built a different DAG ({digest}) than the AppMaster "
                f"({msg.dag_digest}): application() must build the same graph from the same arguments",
            )
        for task_id in msg.tasks:
            if not 0 <= task_id.processor < len(self.app.graph.processors):
                raise RequestError(ErrorCode.BAD_REQUEST, f"no processor {task_id.processor} in this application")
        if msg.epoch < self.epoch:
            raise RequestError(ErrorCode.CONFLICT, f"executor {self.executor_id} already runs attempt {self.epoch}; "
                                                   f"launch of attempt {msg.epoch} refused")
        if msg.epoch == self.epoch:
            return TaskRegistered(self.executor_id, [r.task_id for r in self.runners])
        await self._stop_runners()
        self.epoch = msg.epoch
        self._acks.clear()
        runners = []
        for task_id in msg.tasks:
            envelope = None
            if msg.restore_checkpoint:
                data = await self.store.get_snapshot(msg.restore_checkpoint, msg.restore_epoch,
                                                     (task_id.processor, task_id.index))
                envelope = TaskSnapshot.decode(data)
            runner = TaskRunner(
                self.bus.nc, self.app, self.app_id, task_id, self.executor_id, self.config, self.on_task_done,
                self.on_snapshot, self.on_task_ended, msg.start_ms, msg.epoch, envelope, self.servers,
            )
            await runner.subscribe()
            runners.append(runner)
        self.runners = runners
        hosted = {(r.task_id.processor, r.task_id.index): r for r in runners}
        for runner in runners:
            runner.link_local(hosted)
        await self.bus.nc.flush()
        log.info("tasks_launched", epoch=msg.epoch, tasks=len(runners), restore_checkpoint=msg.restore_checkpoint)
        return TaskRegistered(self.executor_id, list(msg.tasks))

    async def _stop_runners(self) -> None:
        """Stop the tasks of the current attempt and close their subscriptions."""
        for runner in self.runners:
            await runner.close()
            await runner.stop()
        running = [task for task in self._running.values() if not task.done()]
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=5)
        self._running.clear()
        self.runners = []

    async def on_start_all_tasks(self, msg: StartAllTasks) -> None:
        for runner in self.runners:
            if runner not in self._running:
                self._running[runner] = self.spawn(runner.run(), f"task-{runner.name}")

    async def on_trigger(self, msg: TriggerCheckpoint) -> None:
        """Sources inject the barrier (again is harmless); a trigger repeated because acks
        went missing (a NATS server restarted) gets this executor's acks again."""
        if msg.epoch != self.epoch:
            return
        for ack in self._acks.get(msg.checkpoint_id, ()):
            await self.bus.publish(subjects.appmaster_checkpoint_ack(self.app_id), ack)
        for runner in self.runners:
            if isinstance(runner.task, DataSourceTask):
                runner.inject(msg.checkpoint_id)

    async def on_complete(self, msg: CheckpointComplete) -> None:
        if msg.epoch != self.epoch:
            return
        for runner in self.runners:
            self.spawn(self._commit(runner, msg.checkpoint_id, msg.final), f"commit-{runner.name}")

    async def _commit(self, runner: TaskRunner, checkpoint_id: int, final: bool) -> None:
        try:
            await runner.checkpoint_complete(checkpoint_id, final)
        except Exception as exc:
            error = failure_report(exc, runner.context)
            log.error("commit_failed", task=runner.name, checkpoint_id=checkpoint_id, error=error.message, exc_info=exc)
            await runner.stop()
            await self.on_task_done(runner, error, True)

    def on_snapshot(self, runner: TaskRunner, snapshot: Snapshot) -> None:
        """Serialise now (the task goes on changing its state), store and acknowledge in
        the background."""
        try:
            data = snapshot.state.encode()
        except Exception as exc:
            self.spawn(self._decline(runner, snapshot.checkpoint_id, f"the state of {runner.name} cannot be "
                                                                     f"serialised: {type(exc).__name__}: {exc}"),
                       f"decline-{runner.name}")
            return
        self.spawn(self._store_snapshot(runner, snapshot, data), f"snapshot-{runner.name}")

    async def _store_snapshot(self, runner: TaskRunner, snapshot: Snapshot, data: bytes) -> None:
        task = (runner.task_id.processor, runner.task_id.index)
        try:
            await self.store.put_snapshot(snapshot.checkpoint_id, runner.epoch, task, data)
        except Exception as exc:
            await self._decline(runner, snapshot.checkpoint_id, f"storing the snapshot of {runner.name} failed: "
                                                                f"{type(exc).__name__}: {exc}")
            return
        ack = TaskCheckpointed(self.executor_id, runner.task_id, snapshot.checkpoint_id, runner.epoch, len(data),
                               snapshot.ended)
        if runner.epoch == self.epoch:
            self._acks.setdefault(snapshot.checkpoint_id, []).append(ack)
            for old in sorted(self._acks)[:-ACKS_KEPT]:
                del self._acks[old]
        await self.bus.publish(subjects.appmaster_checkpoint_ack(self.app_id), ack)

    async def _decline(self, runner: TaskRunner, checkpoint_id: int, reason: str) -> None:
        log.warning("checkpoint_declined", task=runner.name, checkpoint_id=checkpoint_id, reason=reason)
        await self.bus.publish(subjects.appmaster_checkpoint_ack(self.app_id),
                               CheckpointDeclined(self.executor_id, runner.task_id, checkpoint_id, runner.epoch,
                                                  reason))

    async def on_task_ended(self, runner: TaskRunner) -> None:
        await self.bus.publish(subjects.appmaster_task_ended(self.app_id),
                               TaskEnded(self.executor_id, runner.task_id, runner.epoch))

    async def on_task_done(self, runner: TaskRunner, error: AppError | None, recoverable: bool) -> None:
        """Report a task's end, and again every REPORT_REPEAT_S while its attempt runs here.
        The report is a core NATS message: one sent while the AppMaster reconnects after
        losing its server (or before its interest reached the sender's server) is lost, and
        an AppMaster that never hears of a failed task waits on it for good (checkpoints
        time out, nothing restarts it). Repeats are harmless: the AppMaster acts once per
        attempt, and a recovery's launch of the next attempt ends them."""
        if error is None:
            subject = subjects.appmaster_task_finished(self.app_id)
            report = TaskFinished(self.executor_id, runner.counters(), runner.epoch)
        else:
            await self._flush_counters()
            subject = subjects.appmaster_task_failed(self.app_id)
            report = TaskFailed(self.executor_id, runner.task_id, error, runner.epoch, recoverable)
        await self.bus.publish(subject, report)
        self.spawn(self._repeat_report(runner, subject, report), f"report-{runner.name}")

    async def _repeat_report(self, runner: TaskRunner, subject: str, report: TaskFinished | TaskFailed) -> None:
        while True:
            await asyncio.sleep(REPORT_REPEAT_S)
            if runner not in self.runners:
                return
            await self.bus.publish(subject, report)

    async def _flush_counters(self) -> None:
        """A heartbeat now, answered before the failure is reported: an app that fails before
        the next beat still shows what its tasks here processed."""
        try:
            await self.bus.request(subjects.appmaster_executor_heartbeat(self.app_id), self._heartbeat_message(),
                                   timeout=max(self.heartbeat_interval, 0.5))
        except RequestError as exc:
            log.warning("final_counters_not_sent", error=exc.message)

    def _heartbeat_message(self) -> ExecutorHeartbeat:
        return ExecutorHeartbeat(self.app_id, self.executor_id, [r.counters() for r in self.runners])

    def _start_heartbeat(self) -> None:
        """Heartbeats go from a thread of their own (see services/executor/heartbeat.py)."""
        deadline = float({**self.app.config, **self.launch.config}.get("appmaster_timeout_s",
                                                                        DEFAULT_APPMASTER_TIMEOUT_S))
        self.heartbeat = Heartbeat(
            self.servers, f"gearbus-executor-app{self.app_id}-{self.executor_id}-heartbeat",
            subjects.appmaster_executor_heartbeat(self.app_id),
            self._heartbeat_message,
            self.heartbeat_interval, deadline, self._on_fenced, self._on_appmaster_gone, EXIT_FENCED,
            parent_pid=self.worker_pid, orphaned=self._orphaned, security=self.bus.security)
        if self.worker_pid:  # from now on the heartbeat thread reports the worker's death, then exits
            signal.signal(WORKER_GONE_SIGNAL, signal.SIG_IGN)
        self.heartbeat.start(asyncio.get_running_loop())
        self.spawn(self._loop_turns(), "loop-turns")

    async def _loop_turns(self) -> None:
        """Tell the heartbeat thread the task loop turns."""
        while True:
            self.heartbeat.loop_turned()
            await asyncio.sleep(0.25)

    def _on_fenced(self, reason: str) -> None:
        async def stop() -> None:
            await self._stop_runners()
            self.stop(exit_code=EXIT_FENCED)

        self.spawn(stop(), "fenced")

    def _orphaned(self) -> tuple[str, ExecutorStopped, int]:
        """What the heartbeat thread publishes when the worker died (see heartbeat.py)."""
        return (subjects.appmaster_executor_stopped(self.app_id),
                ExecutorStopped(self.worker_id, self.app_id, self.executor_id, ExecutorKind.EXECUTOR,
                                EXIT_WORKER_GONE, worker_gone=True),
                EXIT_WORKER_GONE)

    def _on_appmaster_gone(self, silent_s: float, error: str) -> None:
        log.error("appmaster_gone", silent_s=round(silent_s, 1), error=error)
        self.stop(exit_code=EXIT_APPMASTER_GONE)


def main(argv: list[str] | None = None) -> int:
    args = parse_launched_args("executor", argv)
    launch = launch_from_env()
    worker_id = os.environ.get(WORKER_ENV, "")
    configure("executor", f"app{launch.app_id}-executor{launch.executor_id}", app_id=launch.app_id,
              executor_id=launch.executor_id)
    return run_service(Executor(args.nats, launch, worker_id, os.getppid() if worker_id else None,
                                launch_security(launch)))
