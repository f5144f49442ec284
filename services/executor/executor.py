"""The executor role: hosts tasks of one application and runs their data plane."""

from __future__ import annotations

import asyncio
import gc
import os
import signal

import structlog

from gearbus.api.graph import Application, GraphError
from gearbus.api.io_tasks import DataSourceTask
from gearbus.api.partitioners import key_owner
from gearbus.runtime import state_query
from gearbus.runtime.failures import failure_report
from gearbus.runtime.core import Snapshot
from gearbus.runtime.replace import carried_over, compose
from gearbus.runtime.savepoints import SavepointMismatch, rescaled_snapshot, restored_from, whole_snapshot
from gearbus.runtime.snapshots import TaskSnapshot
from services.checkpoint_store import CheckpointStore
from gearbus.runtime import executor_tasks as lifecycle
from services.executor.heartbeat import Heartbeat
from gearbus.runtime.executor_tasks import EXIT_FENCED, EXIT_WORKER_GONE, ExecutorTasks, LaunchRefused
from gearbus.control.config import AppConfig
from services.executor.task_runner import TaskRunner
from services.app_code import fetch_application
from services.launch import WORKER_ENV, WORKER_GONE_SIGNAL, launch_from_env, launch_security, parse_launched_args
from shared import subjects
from shared.bus import RequestError, object_chunk_bytes
from shared.logging import configure
from shared.messages import (
    AppError,
    FailureKind,
    AppVersion,
    CheckpointComplete,
    CheckpointDeclined,
    ErrorCode,
    ExecutorHeartbeat,
    ExecutorKind,
    ExecutorRegistered,
    ExecutorStopped,
    LaunchExecutor,
    LaunchTasks,
    QueryTaskState,
    RegisterExecutor,
    ReRegister,
    StartAllTasks,
    StateValue,
    TaskCheckpointed,
    TaskCounters,
    TaskEnded,
    TaskFailed,
    TaskFinished,
    TaskId,
    TaskRegistered,
    TriggerCheckpoint,
)
from shared.security import Security
from shared.service import Service, run_service

log = structlog.get_logger()

REPORT_REPEAT_S = 1.0  # a task's end (finished or failed) is reported again this often until its attempt is replaced
REGISTER_PATIENCE_S = 15.0  # an AppMaster unreachable this long at registration (reconnecting, relaunched) is final


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
        self.app: Application | None = None  # as planned, with the code versions its processors run
        self.submitted: Application | None = None  # version 1 of the app's code, as submitted
        self.plan: Application | None = None  # at the parallelism of the epoch it runs (a rescale changes it)
        self.config: AppConfig | None = None  # the app's, as it applies here
        self.tasks = ExecutorTasks()  # the tasks' lives: this shell carries out what it decides
        self.runners: dict[TaskId, TaskRunner] = {}  # the current epoch's
        self._running: dict[TaskId, asyncio.Task] = {}
        self.store: CheckpointStore | None = None
        self.heartbeat_interval = 1.0
        self.heartbeat: Heartbeat | None = None
        self._instructions = {
            lifecycle.RetireTasks: self._retire, lifecycle.OpenTasks: self._open, lifecycle.StartTasks: self._start,
            lifecycle.RewireTasks: self._rewire, lifecycle.ResumeTasks: self._resume,
            lifecycle.InjectBarrier: self._inject, lifecycle.StoreSnapshot: self._store_snapshot,
            lifecycle.AckCheckpoint: self._ack, lifecycle.DeclineCheckpoint: self._decline,
            lifecycle.Commit: self._commit_in_background, lifecycle.StopTask: self._stop_task,
            lifecycle.ReportEnded: self._report_ended, lifecycle.ReportFinished: self._report_finished,
            lifecycle.ReportFailed: self._report_failed, lifecycle.Exit: self._exit,
        }

    # --- lifecycle -------------------------------------------------------------

    async def setup(self) -> None:
        self.app = self.plan = self.submitted = await fetch_application(self.bus, self.launch)
        self.config = AppConfig.parse({**self.app.config, **self.launch.config}).resolved()
        self.store = CheckpointStore(self.bus.js, self.app_id, chunk_bytes=object_chunk_bytes(self.bus.nc))
        await self.bus.serve(
            subjects.executor_control(self.app_id, self.executor_id),
            {LaunchTasks: self.on_launch_tasks, StartAllTasks: self.on_start_all_tasks},
        )
        await self.bus.serve(subjects.executor_state_query(self.app_id, self.executor_id),
                             {QueryTaskState: self.on_state_query})
        await self.bus.listen(subjects.executor_reregister(self.app_id), {ReRegister: self.on_reregister})
        await self.bus.listen(subjects.checkpoint_trigger(self.app_id), {TriggerCheckpoint: self.on_trigger})
        await self.bus.listen(subjects.checkpoint_complete(self.app_id), {CheckpointComplete: self.on_complete})
        await self.register()
        self._start_heartbeat()

    async def register(self) -> None:
        """Register with the AppMaster; with a relaunched one, say which tasks run here."""
        hosted = self.tasks.hosted()
        registered = await self.bus.request(
            subjects.appmaster_executor_register(self.app_id),
            RegisterExecutor(self.app_id, self.executor_id, self.worker_id, os.getpid(),
                             tasks=hosted, finished=[task for task in hosted if self.tasks.finished(task)]),
            expect=ExecutorRegistered, retry_s=REGISTER_PATIENCE_S, idempotent=True,
        )
        self.heartbeat_interval = registered.heartbeat_interval_s

    async def on_reregister(self, msg: ReRegister) -> None:
        log.info("reregistering_with_appmaster", reason=msg.reason)
        self.spawn(self.register(), "reregister")

    async def shutdown(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        await self._carry_out(self.tasks.stop())

    # --- handlers --------------------------------------------------------------

    async def on_launch_tasks(self, msg: LaunchTasks) -> TaskRegistered:
        """Run ``msg.tasks`` in attempt ``msg.epoch``, restored from its checkpoint (the
        machine decides what retires and what opens)."""
        plan = self.plan
        if msg.epoch > self.tasks.epoch:  # the code and plan of the epoch launched (the same launch again keeps them)
            await self._load_versions(msg.versions)
            try:
                plan = self.app.with_parallelism(msg.parallelism)
            except GraphError as exc:
                raise RequestError(ErrorCode.BAD_REQUEST, f"parallelism {msg.parallelism}: {exc}") from None
        digest = self.app.graph.digest()
        if msg.dag_digest != digest:
            raise RequestError(
                ErrorCode.CONFLICT,
                f"executor {self.executor_id} built a different DAG ({digest}) than the AppMaster "
                f"({msg.dag_digest}): application() must build the same graph from the same arguments",
            )
        processors = self.app.graph.processors
        for task_id in msg.tasks:
            if not 0 <= task_id.processor < len(processors):
                raise RequestError(ErrorCode.BAD_REQUEST, f"no processor {task_id.processor} in this application")
        beyond = [f"{t.processor}.{t.index}" for t in msg.tasks
                  if t.index >= plan.graph.processors[t.processor].parallelism]
        if beyond:
            raise RequestError(ErrorCode.BAD_REQUEST, f"tasks {', '.join(beyond)} are beyond their processor's "
                                                      "parallelism in this plan")
        self.plan = plan
        sources = [t for t in msg.tasks if issubclass(processors[t.processor].task_class, DataSourceTask)]
        try:
            instructions = self.tasks.launch(msg, sources)
        except LaunchRefused as exc:
            raise RequestError(ErrorCode.CONFLICT, f"executor {self.executor_id} {exc}") from None
        await self._carry_out(instructions)
        return TaskRegistered(self.executor_id, self.tasks.hosted())

    async def _load_versions(self, versions: dict[int, AppVersion]) -> None:
        """The app with these processors running later versions' code (each version
        loaded once); one that does not load refuses the launch (new code on trial is then
        rolled back)."""
        loaded = {}
        for processor, version in versions.items():
            try:
                loaded[processor] = await fetch_application(self.bus, version)
            except Exception as exc:
                raise RequestError(ErrorCode.BAD_REQUEST, f"executor {self.executor_id} cannot load version "
                                                          f"{version.version}: {type(exc).__name__}: {exc}") from None
        self.app = compose(self.submitted, loaded)

    async def on_start_all_tasks(self, msg: StartAllTasks) -> None:
        await self._carry_out(self.tasks.start_all())

    async def on_trigger(self, msg: TriggerCheckpoint) -> None:
        """Sources inject the barrier; a trigger repeated because acks went missing (a NATS
        server restarted) gets this executor's acks again."""
        await self._carry_out(self.tasks.trigger(msg.epoch, msg.checkpoint_id, msg.park))

    async def on_complete(self, msg: CheckpointComplete) -> None:
        await self._carry_out(self.tasks.checkpoint_complete(msg.epoch, msg.checkpoint_id, msg.final))
        if msg.compacted:
            for runner in self.runners.values():
                runner.core.compacted(msg.compacted)

    def _task_name(self, task: TaskId) -> str:
        return task.named({p.id: p.name for p in self.app.graph.processors} if self.app is not None else {})

    async def on_state_query(self, msg: QueryTaskState) -> StateValue:
        """Read a running task's state of one key, between two of its batches."""
        runner = self.runners.get(msg.task)
        ops = getattr(runner.task, "ops", None) if runner is not None else None
        if ops is None:
            raise RequestError(ErrorCode.UNAVAILABLE, f"{self._task_name(msg.task)} does not run here now",
                               retryable=True)
        try:
            key = state_query.parse_key(msg.key)
            owner = key_owner(key, runner.processor.parallelism)
            if owner != msg.task.index:
                raise state_query.StateQueryError(f"key {msg.key} belongs to "
                                                  f"{self._task_name(TaskId(msg.task.processor, owner))}")
            found, value = state_query.read(ops, msg.step, key)
        except state_query.StateQueryError as exc:
            raise RequestError(ErrorCode.BAD_REQUEST, str(exc)) from None
        return StateValue(self.app_id, msg.step, msg.key, msg.task, found, state_query.as_json(value))

    async def on_snapshot(self, runner: TaskRunner, snapshot: Snapshot, alignment_s: float) -> None:
        await self._carry_out(self.tasks.snapshot_taken(runner.task_id, runner.epoch, snapshot, alignment_s))

    async def on_task_ended(self, runner: TaskRunner) -> None:
        await self._carry_out(self.tasks.task_ended(runner.task_id, runner.epoch))

    async def on_task_done(self, runner: TaskRunner, error: AppError | None, recoverable: bool) -> None:
        await self._carry_out(self.tasks.task_done(runner.task_id, runner.epoch, error, recoverable))

    # --- instructions: carrying out what the task machine decided ----------------

    async def _carry_out(self, instructions: list[lifecycle.Instruction]) -> None:
        for instruction in instructions:
            await self._instructions[type(instruction)](instruction)

    async def _retire(self, retire: lifecycle.RetireTasks) -> None:
        """Stop the tasks' loops and close their subscriptions."""
        retiring = [self.runners[task] for task in retire.tasks if task in self.runners]
        self.runners = {task: r for task, r in self.runners.items() if task not in retire.tasks}
        for runner in retiring:
            await runner.close()
            await runner.stop()
        loops = [self._running.pop(task) for task in retire.tasks if task in self._running]
        running = [loop for loop in loops if not loop.done()]
        for loop in running:
            loop.cancel()
        if running:
            await asyncio.wait(running, timeout=5)

    async def _open(self, open_tasks: lifecycle.OpenTasks) -> None:
        """Create the launch's runners (restored from its checkpoint) and open their inboxes."""
        launch = open_tasks.launch
        old: dict[tuple[int, int], TaskSnapshot] = {}  # the old tasks' snapshots read for a rescale's new ones
        try:
            for task_id in open_tasks.tasks:
                envelope = None
                if launch.restore_checkpoint:
                    envelope = await self._restored(launch, task_id, old)
                    if task_id.processor in launch.drop_state:  # new code without some steps of the old
                        envelope = carried_over(self.plan.graph.processors[task_id.processor], envelope,
                                                launch.drop_state[task_id.processor])
                runner = TaskRunner(
                    self.bus.nc, self.plan, self.app_id, task_id, self.executor_id, self.config, self.on_task_done,
                    self.on_snapshot, self.on_task_ended, launch.start_ms, launch.epoch, envelope, self.servers,
                    launch.hold_from.get(task_id.processor), self.bus.security,
                )
                self.runners = {**self.runners, task_id: runner}  # replaced, never resized: the heartbeat reads it
                await runner.subscribe()
        except Exception:
            await self._carry_out(self.tasks.launch_failed(launch.epoch))
            raise
        hosted = {(r.task_id.processor, r.task_id.index): r for r in self.runners.values()}
        for runner in self.runners.values():
            runner.link_local(hosted)
        await self.bus.nc.flush()
        self.tasks.opened(launch.epoch)
        log.info("tasks_launched", epoch=launch.epoch, tasks=len(self.runners),
                 restore_checkpoint=launch.restore_checkpoint)

    async def _rewire(self, rewire: lifecycle.RewireTasks) -> None:
        """Parked tasks go on in the new epoch, on the channels of the plan launched."""
        for task in rewire.tasks:
            self.runners[task].rewire(self.plan, rewire.epoch)
        log.info("tasks_kept_running", epoch=rewire.epoch, tasks=len(rewire.tasks))

    async def _resume(self, resume: lifecycle.ResumeTasks) -> None:
        for task in resume.tasks:
            self.runners[task].resume()

    async def _restored(self, launch: LaunchTasks, task_id: TaskId, old: dict[tuple[int, int], TaskSnapshot]
                        ) -> TaskSnapshot:
        """What ``task_id`` restores of the launch's checkpoint, added up a key group at a
        time as the task restores it, off the loop: its own snapshot's chain; or, for a
        rescaled processor, its share of the old tasks' it needs (each read once per
        launch, into ``old``). A state it cannot divide refuses the launch."""
        processor, checkpoint = self.plan.graph.processors[task_id.processor], launch.restore_checkpoint
        taken_at = launch.restore_parallelism.get(task_id.processor)
        if taken_at is None:
            chain = await self.store.snapshot_chain(checkpoint, launch.restore_epoch, (task_id.processor, task_id.index))
            return whole_snapshot(processor, chain)
        wanted = [(task_id.processor, index) for index in restored_from(processor, taken_at, task_id.index)]
        for task in wanted:
            if task not in old:
                old[task] = whole_snapshot(processor, await self.store.snapshot_chain(checkpoint, launch.restore_epoch,
                                                                                      task))
        try:
            return rescaled_snapshot(processor, taken_at, {index: old[(p, index)] for p, index in wanted},
                                     task_id.index)
        except SavepointMismatch as exc:
            raise RequestError(ErrorCode.BAD_REQUEST, f"{self._task_name(task_id)} cannot restore its share of "
                                                      f"checkpoint {checkpoint}: {exc}") from None

    async def _start(self, start: lifecycle.StartTasks) -> None:
        for task in start.tasks:
            runner = self.runners[task]
            self._running[task] = self.spawn(runner.run(), f"task-{runner.name}")

    async def _inject(self, inject: lifecycle.InjectBarrier) -> None:
        for task in inject.tasks:
            self.runners[task].inject(inject.checkpoint_id, inject.park)

    async def _store_snapshot(self, store: lifecycle.StoreSnapshot) -> None:
        """Serialise now (the task goes on changing its state), store in the background."""
        runner, snapshot = self.runners[store.task], store.snapshot
        try:
            data = snapshot.state.encode()
        except Exception as exc:
            await self._carry_out(self.tasks.snapshot_declined(store.task, store.epoch, snapshot.checkpoint_id,
                                                               lifecycle.unserialisable(runner.name, exc,
                                                                                        snapshot.state.state)))
            return
        self.spawn(self._put_snapshot(runner, store, data), f"snapshot-{runner.name}")

    async def _put_snapshot(self, runner: TaskRunner, store: lifecycle.StoreSnapshot, data: bytes) -> None:
        checkpoint_id = store.snapshot.checkpoint_id
        try:
            await self.store.put_snapshot(checkpoint_id, store.epoch, (store.task.processor, store.task.index), data)
        except Exception as exc:
            await self._carry_out(self.tasks.snapshot_declined(
                store.task, store.epoch, checkpoint_id,
                f"storing the snapshot of {runner.name} failed: {type(exc).__name__}: {exc}"))
            return
        await self._carry_out(self.tasks.snapshot_stored(store.task, store.epoch, checkpoint_id, len(data),
                                                         store.snapshot.ended, store.alignment_s,
                                                         store.snapshot.state.root, store.snapshot.state.depth,
                                                         store.snapshot.records_in))

    async def _ack(self, ack: lifecycle.AckCheckpoint) -> None:
        await self.bus.publish(subjects.appmaster_checkpoint_ack(self.app_id),
                               TaskCheckpointed(self.executor_id, ack.task, ack.checkpoint_id, ack.epoch,
                                                ack.size_bytes, ack.ended, int(ack.alignment_s * 1000), ack.root,
                                                ack.depth, ack.records_in))

    async def _decline(self, decline: lifecycle.DeclineCheckpoint) -> None:
        log.warning("checkpoint_declined", task=self.runners[decline.task].name, checkpoint_id=decline.checkpoint_id,
                    reason=decline.reason)
        await self.bus.publish(subjects.appmaster_checkpoint_ack(self.app_id),
                               CheckpointDeclined(self.executor_id, decline.task, decline.checkpoint_id, decline.epoch,
                                                  decline.reason))

    async def _commit_in_background(self, commit: lifecycle.Commit) -> None:
        runner = self.runners[commit.task]
        self.spawn(self._commit(runner, commit), f"commit-{runner.name}")

    async def _commit(self, runner: TaskRunner, commit: lifecycle.Commit) -> None:
        try:
            await runner.commit(commit.checkpoint_id)
        except Exception as exc:
            error = failure_report(exc, runner.context, FailureKind.FAULT)  # a rollback commits again
            log.error("commit_failed", task=runner.name, checkpoint_id=commit.checkpoint_id, error=error.message,
                      exc_info=exc)
            await self._carry_out(self.tasks.commit_failed(commit.task, runner.epoch, error))
            return
        await self._carry_out(self.tasks.committed(commit.task, runner.epoch, commit.checkpoint_id, commit.final))

    async def _stop_task(self, stop: lifecycle.StopTask) -> None:
        await self.runners[stop.task].stop()

    async def _report_ended(self, report: lifecycle.ReportEnded) -> None:
        await self.bus.publish(subjects.appmaster_task_ended(self.app_id),
                               TaskEnded(self.executor_id, report.task, report.epoch))

    async def _report_finished(self, report: lifecycle.ReportFinished) -> None:
        await self._report(report.task, subjects.appmaster_task_finished(self.app_id),
                           TaskFinished(self.executor_id, self._counters(self.runners[report.task]), report.epoch))

    async def _report_failed(self, report: lifecycle.ReportFailed) -> None:
        await self._flush_counters()
        await self._report(report.task, subjects.appmaster_task_failed(self.app_id),
                           TaskFailed(self.executor_id, report.task, report.error, report.epoch, report.recoverable))

    async def _report(self, task: TaskId, subject: str, report: TaskFinished | TaskFailed) -> None:
        """Report a task's end, and again every REPORT_REPEAT_S while its attempt runs here.
        The report is a core NATS message: one sent while the AppMaster reconnects after
        losing its server (or before its interest reached the sender's server) is lost, and
        an AppMaster that never hears of a failed task waits on it for good (checkpoints
        time out, nothing restarts it). Repeats are harmless: the AppMaster acts once per
        attempt, and a recovery's launch of the next attempt ends them."""
        await self.bus.publish(subject, report)
        self.spawn(self._repeat_report(task, self.runners.get(task), subject, report),
                   f"report-{task.processor}.{task.index}")

    async def _repeat_report(self, task: TaskId, runner: TaskRunner | None, subject: str,
                             report: TaskFinished | TaskFailed) -> None:
        while True:
            await asyncio.sleep(REPORT_REPEAT_S)
            if runner is None or self.runners.get(task) is not runner:
                return
            await self.bus.publish(subject, report)

    async def _exit(self, exit_: lifecycle.Exit) -> None:
        self.stop(exit_code=exit_.code)

    async def _flush_counters(self) -> None:
        """A heartbeat now, answered before the failure is reported: an app that fails before
        the next beat still shows what its tasks here processed."""
        try:
            await self.bus.request(subjects.appmaster_executor_heartbeat(self.app_id), self._heartbeat_message(),
                                   timeout=max(self.heartbeat_interval, 0.5))
        except RequestError as exc:
            log.warning("final_counters_not_sent", error=exc.message)

    def _heartbeat_message(self) -> ExecutorHeartbeat:
        return ExecutorHeartbeat(self.app_id, self.executor_id, [self._counters(r) for r in self.runners.values()])

    def _counters(self, runner: TaskRunner) -> TaskCounters:
        return runner.counters(finished=self.tasks.finished(runner.task_id))

    def _start_heartbeat(self) -> None:
        """Heartbeats go from a thread of their own (see services/executor/heartbeat.py)."""
        deadline = self.config.appmaster_timeout_s
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
        self.spawn(self._carry_out(self.tasks.fenced(reason)), "fenced")

    def _orphaned(self) -> tuple[str, ExecutorStopped, int]:
        """What the heartbeat thread publishes when the worker died (see heartbeat.py)."""
        return (subjects.appmaster_executor_stopped(self.app_id),
                ExecutorStopped(self.worker_id, self.app_id, self.executor_id, ExecutorKind.EXECUTOR,
                                EXIT_WORKER_GONE, worker_gone=True),
                EXIT_WORKER_GONE)

    def _on_appmaster_gone(self, silent_s: float, error: str) -> None:
        log.error("appmaster_gone", silent_s=round(silent_s, 1), error=error)
        self.spawn(self._carry_out(self.tasks.appmaster_gone(error)), "appmaster-gone")


#: The young generation's threshold (container allocations between collections) in an
#: executor. Tasks allocate their records a batch at a time, and most die with the batch;
#: at Python's default of 700 every young collection scans the batch still alive, which
#: cost the Nexmark queries a quarter to a third of their throughput (bench/nexmark.py).
YOUNG_GC_THRESHOLD = 50_000


def main(argv: list[str] | None = None) -> int:
    gc.set_threshold(YOUNG_GC_THRESHOLD, *gc.get_threshold()[1:])
    args = parse_launched_args("executor", argv)
    launch = launch_from_env()
    worker_id = os.environ.get(WORKER_ENV, "")
    configure("executor", f"app{launch.app_id}-executor{launch.executor_id}", app_id=launch.app_id,
              executor_id=launch.executor_id)
    return run_service(Executor(args.nats, launch, worker_id, os.getppid() if worker_id else None,
                                launch_security(launch)))
