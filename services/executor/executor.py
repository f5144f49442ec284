"""The executor role: hosts tasks of one application and runs their data plane."""

from __future__ import annotations

import asyncio
import os
import time

import structlog

from gearbus.api.graph import Application
from services.executor.outputs import DataPlaneConfig
from services.executor.task_runner import TaskRunner
from services.launch import WORKER_ENV, fetch_application, launch_from_env, parse_launched_args
from shared import subjects
from shared.bus import RequestError
from shared.logging import configure
from shared.messages import (
    AppError,
    ErrorCode,
    ExecutorHeartbeat,
    ExecutorRegistered,
    LaunchExecutor,
    LaunchTasks,
    RegisterExecutor,
    ReRegister,
    StartAllTasks,
    TaskFailed,
    TaskFinished,
    TaskRegistered,
)
from shared.service import Service, run_service

log = structlog.get_logger()

DEFAULT_APPMASTER_TIMEOUT_S = 30.0  # app config "appmaster_timeout_s": then an orphaned executor stops
EXIT_APPMASTER_GONE = 3


class Executor(Service):
    role = "executor"

    def __init__(self, servers, launch: LaunchExecutor, worker_id: str):
        super().__init__(servers, node_id=f"app{launch.app_id}-executor{launch.executor_id}")
        self.launch = launch
        self.app_id = launch.app_id
        self.executor_id = launch.executor_id
        self.worker_id = worker_id
        self.app: Application | None = None
        self.config: DataPlaneConfig | None = None
        self.runners: list[TaskRunner] = []
        self.heartbeat_interval = 1.0
        self._appmaster_seen = time.monotonic()

    # --- lifecycle -------------------------------------------------------------

    async def setup(self) -> None:
        self.app = await fetch_application(self.bus, self.launch)
        self.config = DataPlaneConfig.from_config({**self.app.config, **self.launch.config})
        await self.bus.serve(
            subjects.executor_control(self.app_id, self.executor_id),
            {LaunchTasks: self.on_launch_tasks, StartAllTasks: self.on_start_all_tasks},
        )
        await self.bus.listen(subjects.executor_reregister(self.app_id), {ReRegister: self.on_reregister})
        await self.register()
        self.spawn(self.heartbeat_loop(), "heartbeat")

    async def register(self) -> None:
        """Register with the AppMaster; with a relaunched one, say which tasks run here."""
        hosted = [r.task_id for r in self.runners]
        finished = [r.task_id for r in self.runners if r.finished]
        registered = await self.bus.request(
            subjects.appmaster_executor_register(self.app_id),
            RegisterExecutor(self.app_id, self.executor_id, self.worker_id, os.getpid(), tasks=hosted,
                             finished=finished),
            expect=ExecutorRegistered,
        )
        self.heartbeat_interval = registered.heartbeat_interval_s
        self._appmaster_seen = time.monotonic()

    async def on_reregister(self, msg: ReRegister) -> None:
        log.info("reregistering_with_appmaster", reason=msg.reason)
        self.spawn(self.register(), "reregister")

    async def shutdown(self) -> None:
        for runner in self.runners:
            await runner.close()

    # --- handlers --------------------------------------------------------------

    async def on_launch_tasks(self, msg: LaunchTasks) -> TaskRegistered:
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
            runner = TaskRunner(
                self.bus.nc, self.app, self.app_id, task_id, self.executor_id, self.config, self.on_task_done,
                msg.start_ms, msg.restart, frozenset((t.processor, t.index) for t in msg.ended_inputs),
            )
            await runner.subscribe()
            self.runners.append(runner)
        hosted = {(r.task_id.processor, r.task_id.index): r for r in self.runners}
        for runner in self.runners:
            runner.link_local(hosted)
        await self.bus.nc.flush()
        return TaskRegistered(self.executor_id, list(msg.tasks))

    async def on_start_all_tasks(self, msg: StartAllTasks) -> None:
        for runner in self.runners:
            self.spawn(runner.run(), f"task-{runner.name}")

    async def on_task_done(self, runner: TaskRunner, error: AppError | None) -> None:
        if error is None:
            await self.bus.publish(
                subjects.appmaster_task_finished(self.app_id), TaskFinished(self.executor_id, runner.counters())
            )
        else:
            await self.bus.publish(
                subjects.appmaster_task_failed(self.app_id), TaskFailed(self.executor_id, runner.task_id, error)
            )

    async def heartbeat_loop(self) -> None:
        """Heartbeats are requests: an AppMaster that stays silent past the deadline is
        gone for good, and an executor without one stops itself."""
        subject = subjects.appmaster_executor_heartbeat(self.app_id)
        deadline = float({**self.app.config, **self.launch.config}.get("appmaster_timeout_s",
                                                                        DEFAULT_APPMASTER_TIMEOUT_S))
        while True:
            beat = ExecutorHeartbeat(self.app_id, self.executor_id, [r.counters() for r in self.runners])
            try:
                await self.bus.request(subject, beat, timeout=max(self.heartbeat_interval, 0.5))
                self._appmaster_seen = time.monotonic()
            except RequestError as exc:
                silent = time.monotonic() - self._appmaster_seen
                if silent > deadline:
                    log.error("appmaster_gone", silent_s=round(silent, 1), error=exc.message)
                    self.stop(exit_code=EXIT_APPMASTER_GONE)
                    return
            await asyncio.sleep(self.heartbeat_interval)


def main(argv: list[str] | None = None) -> int:
    args = parse_launched_args("executor", argv)
    launch = launch_from_env()
    worker_id = os.environ.get(WORKER_ENV, "")
    configure("executor", f"app{launch.app_id}-executor{launch.executor_id}", app_id=launch.app_id,
              executor_id=launch.executor_id)
    return run_service(Executor(args.nats, launch, worker_id))
