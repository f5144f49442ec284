"""A shell app's AppMaster (the shell application type, docs/application-types.md). What
happens is decided by its state machine (gearbus/runtime/shell.py): this shell asks the
master for a slot on each chosen worker and to launch an executor there, passes the
executors' lines and exits to the machine, answers reads of the output, stops commands past
the timeout, stores the output where a reader finds it once the app ended, and reports the
app's state."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

import msgpack
import structlog

from gearbus.control.config import AppConfig
from gearbus.runtime import shell as sh
from services.appmaster import common
from services.launch import WORKER_ENV, launch_from_env, launch_security, parse_launched_args
from shared import subjects
from shared.bus import RequestError, RequestTimeout
from shared.logging import configure
from shared.messages import (AppError, AppMasterHeartbeat, ApplicationStateChanged, AppState, AppStimuli, AppType,
                             ErrorCode, ExecutorKind, ExecutorLaunched, ExecutorRegistered, ExecutorStopped,
                             LaunchExecutor, MasterElected, Placement, QueryStimuli, ReadShellOutput,
                             RegisterExecutor, ReRegister, RequestResource, ResourceAllocated, ShellExited,
                             ShellLines, ShellOutput, ShutdownExecutor, StopShellCommand, WorkerLost)
from shared.security import Security
from shared.service import run_service

log = structlog.get_logger()

RESOURCE_TIMEOUT_S = 65.0  # a slot request waits at most this (the master's own wait, and a margin)
TICK_S = 0.1  # how often the machine is given the time (the timeout)
MAX_WAIT_MS = 10_000  # the longest a read waits for output
STOP_TIMEOUT_S = 5.0
#: A stopped AppMaster waits this long for its commands' ends (each executor's stop takes up to its 2 s grace,
#: and the worker SIGKILLs this process after 5 s)
STOP_WAIT_S = 3.5


class ShellAppMaster(common.AppMasterProcess):
    def __init__(self, servers, launch: LaunchExecutor, worker_id: str, security: Security = Security()):
        super().__init__(servers, launch, worker_id, security)
        self.state: sh.ShellAppState | None = None
        self._changed = asyncio.Event()  # set (and replaced) whenever what a reader sees changed
        self._seen_changes = 0  # the machine's change count when readers were last woken
        self._stored = asyncio.Event()  # the output is stored (or failed to be)
        self._instructions = {
            sh.RequestSlot: self._spawning(self._request_slot, "request-slot"),
            sh.LaunchExecutor: self._spawning(self._launch_executor, "launch-executor"),
            sh.StopCommand: self._spawning(self._stop_command, "stop-command"),
            sh.StoreOutput: self._store_output, sh.ReportState: self._spawning(self._report_state, "report"),
            sh.Shutdown: self._spawning(self._shutdown, "shutdown"), sh.Logged: common.log_instruction,
        }

    # --- lifecycle -----------------------------------------------------------------------

    async def setup(self) -> None:
        app = self.app_id
        await self.bus.serve(subjects.appmaster_executor_register(app), {RegisterExecutor: self.on_register})
        await self.bus.serve(subjects.appmaster_shell_lines(app), {ShellLines: self.on_lines})
        await self.bus.serve(subjects.appmaster_shell_exited(app), {ShellExited: self.on_exited})
        await self.bus.serve(subjects.appmaster_shell_output(app), {ReadShellOutput: self.on_read}, concurrent=True)
        await self.bus.serve(subjects.appmaster_debug(app), {QueryStimuli: self.on_stimuli_query})
        await self.bus.listen(subjects.appmaster_executor_stopped(app), {ExecutorStopped: self.on_stopped})
        await self.bus.listen(subjects.appmaster_worker_lost(app), {WorkerLost: self.on_worker_lost})
        await self.register()
        await self.bus.listen(subjects.MASTER_ELECTED, {MasterElected: self.on_master_changed})
        await self.bus.listen(subjects.appmaster_reregister(app), {ReRegister: self.on_master_changed})
        self.spawn(self.heartbeat_loop(), "heartbeat")
        self.spawn(self.begin(), "begin")

    async def begin(self) -> None:
        if self.launch.attempt:
            await self._fail(AppError("AppMasterLost", "the shell app's AppMaster was lost; a shell app is not "
                                                       "resumed (what its commands wrote since is gone)",
                                      "relaunching the AppMaster"))
            return
        try:
            self.state = sh.ShellAppState(list(self.launch.workers), AppConfig.parse(self.launch.config).timeout_s)
        except ValueError as exc:
            await self._fail(AppError("ConfigError", str(exc), "starting the shell app"))
            return
        log.info("shell_app_starting", workers=self.launch.workers, argv=self.launch.args,
                 timeout_s=self.state.timeout_s)
        await self.carry_out(self.state.start(time.monotonic()))
        self.spawn(self.tick_loop(), "ticks")

    async def shutdown(self) -> None:
        """Stopped (the app was killed, or its worker stops): keep the output for readers, with
        the ends of the commands (their executors are being stopped too, and report them)."""
        if self.state is None:
            return
        await self.carry_out(self.state.stopping("this AppMaster was stopped"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_WAIT_S
        while self.state.phase is sh.Phase.STOPPING and loop.time() < deadline:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), deadline - loop.time())
        await self.carry_out(self.state.stop_waited())
        with contextlib.suppress(asyncio.TimeoutError):  # the last exit's handler may be storing it
            await asyncio.wait_for(self._stored.wait(), STOP_TIMEOUT_S)

    async def _fail(self, error: AppError) -> None:
        """No machine runs to decide this app's end: report it, and stop."""
        log.error("app_failed", error=f"{error.error_type}: {error.message}")
        try:
            await self.bus.request(subjects.appmaster_state(self.app_id),
                                   ApplicationStateChanged(self.app_id, AppState.FAILED, error), timeout=5,
                                   retry_s=common.MASTER_RETRY_S)
        except RequestError as exc:
            log.error("state_report_failed", error=exc.message)
        self.stop()

    async def tick_loop(self) -> None:
        while not self.state.ended:
            await self.carry_out(self.state.tick(time.monotonic()))
            await asyncio.sleep(TICK_S)

    # --- carrying out the machine's instructions ---------------------------------------------

    async def carry_out(self, instructions: list) -> None:
        """Wake the readers waiting if what they see changed (new lines, a command's or the
        app's state: the machine counts it, a tick with nothing due changes nothing), then do
        what the machine asked, in order; an instruction with no handler is a bug, and fails
        loudly."""
        if self.state is not None and self.state.changes != self._seen_changes:
            self._seen_changes = self.state.changes
            self._changed.set()
            self._changed = asyncio.Event()
        await common.dispatch(self._instructions, instructions, "the shell AppMaster")

    def _spawning(self, method, name: str):
        return common.spawning(self, method, name)

    async def _request_slot(self, request: sh.RequestSlot) -> None:
        try:
            await self.bus.request(subjects.resource_request(self.app_id),
                                   RequestResource(self.app_id, 1, placement=Placement.WORKER,
                                                   worker_id=request.worker_id, priority=self.launch.priority),
                                   timeout=RESOURCE_TIMEOUT_S, expect=ResourceAllocated, retry_s=common.MASTER_RETRY_S)
        except RequestError as exc:
            await self.carry_out(self.state.slot_refused(request.executor_id, exc.message))
            return
        await self.carry_out(self.state.slot_granted(request.executor_id))

    async def _launch_executor(self, launch: sh.LaunchExecutor) -> None:
        message = LaunchExecutor(
            app_id=self.app_id, executor_id=launch.executor_id, kind=ExecutorKind.EXECUTOR, artifact="", entry="",
            args=list(self.launch.args), config=dict(self.launch.config), app_name=self.launch.app_name,
            priority=self.launch.priority, worker_id=launch.worker_id, app_type=AppType.SHELL)
        try:
            await self.bus.request(subjects.executor_launch(self.app_id), message, expect=ExecutorLaunched,
                                   retry_s=common.MASTER_RETRY_S)
        except RequestError as exc:
            await self.carry_out(self.state.launch_failed(launch.executor_id, exc.message))

    async def _stop_command(self, stop: sh.StopCommand) -> None:
        try:
            await self.bus.request(subjects.executor_control(self.app_id, stop.executor_id),
                                   StopShellCommand(stop.reason), timeout=STOP_TIMEOUT_S)
        except RequestError as exc:  # its worker's report of the executor's end decides then
            log.warning("stop_command_failed", executor_id=stop.executor_id, error=exc.message)

    async def _store_output(self, _: sh.StoreOutput) -> None:
        """Every worker's output, one value each, before the app's end is reported: what the
        master reads for a client once this AppMaster is gone."""
        try:
            kv = await self.bus.js.key_value(subjects.CHECKPOINT_BUCKET)
            for executor_id, output in enumerate(self.state.outputs()):
                await kv.put(subjects.shell_output_key(self.app_id, executor_id),
                             msgpack.packb(output.to_wire(), use_bin_type=True))
        except Exception as exc:  # the app ends anyway; readers get what the master still knows
            log.error("shell_output_not_stored", error=f"{type(exc).__name__}: {exc}")
        finally:
            self._stored.set()

    async def _report_state(self, report: sh.ReportState) -> None:
        error = ""
        try:
            await self.bus.request(subjects.appmaster_state(self.app_id),
                                   ApplicationStateChanged(self.app_id, report.state, report.error), timeout=5,
                                   retry_s=common.MASTER_RETRY_S)
        except RequestTimeout as exc:
            error = exc.message
        except RequestError as exc:
            error = exc.message
        if report.state in AppState.TERMINAL:
            await self._send_heartbeat()
        await self.carry_out(self.state.state_reported(report.state, error))

    async def _shutdown(self, shutdown: sh.Shutdown) -> None:
        for executor_id, worker_id in self.state.live_executors():
            try:
                await self.bus.request(subjects.worker_shutdown(worker_id, self.app_id),
                                       ShutdownExecutor(self.app_id, executor_id, shutdown.reason), timeout=5)
            except RequestError as exc:
                log.warning("executor_shutdown_failed", executor_id=executor_id, error=exc.message)
        self.stop()

    # --- handlers --------------------------------------------------------------------------

    async def _take(self, event) -> None:
        """Pass an event to the machine; what it refuses is answered with the reason."""
        if self.state is None:
            raise RequestError(ErrorCode.UNAVAILABLE, f"app {self.app_id} is still starting", retryable=True)
        try:
            instructions = event()
        except sh.Refused as refused:
            raise RequestError(refused.code, f"app {self.app_id}: {refused.message}") from None
        await self.carry_out(instructions)

    async def on_register(self, msg: RegisterExecutor) -> ExecutorRegistered:
        await self._take(lambda: self.state.executor_registered(msg.executor_id, msg.worker_id,
                                                                   time.monotonic()))
        log.info("executor_registered", executor_id=msg.executor_id, worker_id=msg.worker_id)
        return ExecutorRegistered(self.app_id, msg.executor_id, self.heartbeat_interval)

    async def on_lines(self, msg: ShellLines) -> None:
        await self._take(lambda: self.state.lines(msg.executor_id, msg.seq, msg.lines))

    async def on_exited(self, msg: ShellExited) -> None:
        await self._take(lambda: self.state.exited(msg.executor_id, msg.exit_code, msg.reason))

    async def on_stopped(self, msg: ExecutorStopped) -> None:
        if self.state is not None and msg.kind == ExecutorKind.EXECUTOR:
            await self.carry_out(self.state.executor_stopped(msg.executor_id, msg.exit_detail()))

    async def on_worker_lost(self, msg: WorkerLost) -> None:
        if self.state is not None:
            await self.carry_out(self.state.worker_lost(msg.worker_id))

    async def on_read(self, msg: ReadShellOutput) -> ShellOutput:
        """The output from the offsets asked; with ``wait_ms``, once there is some, or the app
        ended, or that time passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(msg.wait_ms, 0), MAX_WAIT_MS) / 1000
        while True:
            if self.state is None:
                return ShellOutput(self.app_id, AppState.PENDING)
            changed = self._changed
            views = self.state.output(msg.offsets, msg.max_bytes)
            if self.state.ended or any(v.lines or v.dropped for v in views) or loop.time() >= deadline:
                return ShellOutput(self.app_id, self._state_now(), views, False)
            try:
                await asyncio.wait_for(changed.wait(), deadline - loop.time())
            except asyncio.TimeoutError:
                pass

    def _state_now(self) -> str:
        if self.state.outcome is not None:
            return self.state.outcome[0]
        return AppState.ACTIVE if self.state.active_reported else AppState.PENDING

    async def on_stimuli_query(self, msg: QueryStimuli) -> AppStimuli:
        if self.state is None:
            raise RequestError(ErrorCode.UNAVAILABLE, f"app {self.app_id} is still starting", retryable=True)
        return common.stimuli(self.app_id, self.state.stimuli.entries, self.state.phase.value, 0)

    # --- heartbeats ----------------------------------------------------------------------------

    async def _send_heartbeat(self) -> None:
        executors = len(self.state.live_executors()) if self.state else 0
        await self.bus.publish(subjects.appmaster_heartbeat(self.app_id),
                               AppMasterHeartbeat(self.app_id, executors, attempt=self.launch.attempt))

    async def heartbeat_loop(self) -> None:
        while True:
            await self._send_heartbeat()
            await asyncio.sleep(self.heartbeat_interval)


def main(argv: list[str] | None = None) -> int:
    args = parse_launched_args("appmaster", argv)
    launch = launch_from_env()
    configure("appmaster", f"app{launch.app_id}-appmaster", app_id=launch.app_id)
    return run_service(ShellAppMaster(args.nats, launch, os.environ.get(WORKER_ENV, ""), launch_security(launch)))
