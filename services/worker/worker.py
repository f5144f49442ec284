"""The worker role: offers slots to the master and runs AppMaster and executor
processes as its children, reporting each one's exit."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import tempfile
import uuid
from dataclasses import dataclass, replace

import structlog

from services.launch import LAUNCH_ENV, WORKDIR_ENV, WORKER_ENV, WORKER_GONE_SIGNAL, encode_launch
from services.worker.launcher import INTERPRETER_ENV, NO_FORK_SERVER_ENV, ForkedProcess, Launcher
from services.worker.last_error import last_error_line
from shared import subjects
from shared.bus import (RequestError, RequestTimeout, add_connect_timeout_argument, add_nats_argument, bad_request,
                        nats_servers)
from shared.logging import configure
from shared.messages import (
    ExecutorKind,
    ExecutorLaunched,
    ExecutorStopped,
    LaunchExecutor,
    LogChunk,
    LogsReply,
    MasterElected,
    QueryLogs,
    RegisterWorker,
    ReRegister,
    RunningProcess,
    ShutdownExecutor,
    WorkerHeartbeat,
    WorkerRegistered,
)
from shared.nats_jwt import CredentialsError
from shared.security import SECURITY_ENV, Security, add_arguments
from shared.service import Service, run_service

log = structlog.get_logger()

STOP_GRACE_S = 5.0


@dataclass
class ProcessLog:
    app_id: int
    executor_id: int
    kind: str
    path: str


def _read_from(path: str, offset: int, limit: int) -> tuple[bytes, int]:
    """Up to ``limit`` bytes of the file from ``offset``, cut after the last whole line
    (unless one line alone is longer), and the file's size."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(min(offset, size))
        data = f.read(limit)
    if len(data) == limit and b"\n" in data:
        data = data[: data.rindex(b"\n") + 1]
    return data, size


@dataclass
class Child:
    app_id: int
    executor_id: int
    kind: str
    process: asyncio.subprocess.Process | ForkedProcess
    workdir: str
    log_path: str
    attempt: int = 0  # an AppMaster's LaunchExecutor.attempt

    @property
    def label(self) -> str:
        return f"{self.app_id}/{self.executor_id}"


class Worker(Service):
    role = "worker"

    def __init__(self, servers, worker_id: str, slots: int, log_dir: str, security: Security = Security(),
                 fork_server: bool = True):
        """``log_dir``: where each launched process's output is kept (and served on ``logs.query``);
        ``fork_server``: launch through a pre-imported fork server (services/worker/forkserver.py)."""
        super().__init__(servers, worker_id, security)
        self.worker_id = worker_id
        self.slots = slots
        self.log_dir = log_dir
        self.logs: dict[str, ProcessLog] = {}  # by name, for as long as this worker runs
        self.children: dict[tuple[int, int], Child] = {}
        self.heartbeat_interval = 1.0
        self._registering = asyncio.Lock()
        self.launcher = Launcher(self.spawn, fork_server)

    # --- lifecycle -------------------------------------------------------------

    async def setup(self) -> None:
        await self.launcher.start()
        await self.bus.serve(subjects.worker_launch(self.worker_id), {LaunchExecutor: self.on_launch})
        await self.bus.serve(subjects.worker_shutdown(self.worker_id, "*"), {ShutdownExecutor: self.on_shutdown},
                             app_token=subjects.APP_TOKEN_IN_SHUTDOWN)
        await self.bus.serve(subjects.LOGS_QUERY, {QueryLogs: self.on_logs}, concurrent=True)
        await self.bus.listen(subjects.MASTER_ELECTED, {MasterElected: self.on_master_changed})
        await self.bus.listen(subjects.worker_reregister(self.worker_id), {ReRegister: self.on_master_changed})
        await self.register()
        self.spawn(self.heartbeat_loop(), "heartbeat")

    async def register(self) -> None:
        """Register with the leader, with what this worker runs, retrying with backoff
        until one answers (it may be failing over)."""
        async with self._registering:
            delay = 0.1
            while True:
                running = [RunningProcess(c.app_id, c.executor_id, c.kind) for c in self.children.values()]
                message = RegisterWorker(self.worker_id, socket.gethostname(), os.getpid(), self.slots,
                                         running=running)
                try:
                    reply = await self.bus.request(subjects.WORKER_REGISTER, message, timeout=5,
                                                   expect=WorkerRegistered, retry_s=5)
                    self.heartbeat_interval = reply.heartbeat_interval_s
                    log.info("worker_registered", slots=self.slots, running=len(running))
                    return
                except RequestTimeout as exc:
                    log.info("master_not_answering", error=exc.message, retry_in_s=delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)

    async def on_master_changed(self, msg: MasterElected | ReRegister) -> None:
        """A new leader (or one that does not know us): register again, in the background
        so this subscription keeps serving."""
        log.info("reregistering", reason=type(msg).__name__)
        self.spawn(self.register(), "reregister")

    async def shutdown(self) -> None:
        await asyncio.gather(*(self._stop_child(c) for c in list(self.children.values())))
        await self.launcher.close()

    # --- handlers --------------------------------------------------------------

    async def on_launch(self, msg: LaunchExecutor) -> ExecutorLaunched:
        if msg.kind not in (ExecutorKind.APPMASTER, ExecutorKind.EXECUTOR):
            raise bad_request(f"unknown process kind {msg.kind!r}")
        key = (msg.app_id, msg.executor_id)
        if key in self.children:
            raise RequestError("conflict", f"executor {msg.executor_id} of app {msg.app_id} already runs here")
        if len(self.children) >= self.slots:
            raise RequestError("unavailable", f"worker {self.worker_id} has no free slot", retryable=True)
        module = "services.appmaster" if msg.kind == ExecutorKind.APPMASTER else "services.executor"
        args = [option for url in self.bus.servers for option in ("--nats", url)]
        env = {k: v for k, v in os.environ.items() if k not in SECURITY_ENV}
        env.update(self.bus.security.tls_env())
        # The app's own credential; a master without an app signer (hand-written server users)
        # issues none, and the process then connects as this worker.
        env[LAUNCH_ENV] = encode_launch(replace(msg, credentials=msg.credentials or self.bus.security.credential))
        env[WORKER_ENV] = self.worker_id
        env.update(INTERPRETER_ENV)
        workdir = tempfile.mkdtemp(prefix=f"gearbus-app{msg.app_id}-{msg.kind}{max(msg.executor_id, 0)}-")
        env[WORKDIR_ENV] = workdir
        log_name = f"app{msg.app_id}-{msg.kind}{max(msg.executor_id, 0)}"
        log_path = os.path.join(self.log_dir, f"{self.worker_id}-{log_name}.log")
        try:
            # An AppMaster dies with its worker; an executor gets WORKER_GONE_SIGNAL, which
            # kills it too unless it is far enough along to report its own end first.
            death = WORKER_GONE_SIGNAL if msg.kind == ExecutorKind.EXECUTOR else signal.SIGKILL
            process = await self.launcher.launch(module, args, env, log_path, death)
        except OSError:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        self.logs[f"{self.worker_id}/{log_name}"] = ProcessLog(msg.app_id, msg.executor_id, msg.kind, log_path)
        child = Child(msg.app_id, msg.executor_id, msg.kind, process, workdir, log_path, msg.attempt)
        self.children[key] = child
        self.spawn(self._watch(child), f"watch-{child.label}")
        log.info("process_launched", app_id=msg.app_id, executor_id=msg.executor_id, kind=msg.kind, pid=process.pid)
        return ExecutorLaunched(self.worker_id, process.pid)

    async def on_shutdown(self, msg: ShutdownExecutor) -> None:
        targets = [
            c for c in self.children.values()
            if c.app_id == msg.app_id and (msg.executor_id is None or c.executor_id == msg.executor_id)
        ]
        log.info("shutdown_requested", app_id=msg.app_id, executor_id=msg.executor_id, reason=msg.reason,
                 processes=len(targets))
        for child in targets:
            if msg.force:  # declared lost: it may be hung or stopped, and must not run on
                self._kill_child(child)
            else:
                self.spawn(self._stop_child(child), f"stop-{child.label}")

    async def on_logs(self, msg: QueryLogs) -> LogsReply:
        """The output of the app's processes launched here, from the offsets asked for."""
        chunks, budget = [], max(msg.max_bytes, 0)
        for name, entry in sorted(self.logs.items()):
            if entry.app_id != msg.app_id or (msg.executor_id is not None and entry.executor_id != msg.executor_id):
                continue
            offset = max(msg.offsets.get(name, 0), 0)
            data, size = await asyncio.to_thread(_read_from, entry.path, offset, budget)
            budget -= len(data)
            running = (entry.app_id, entry.executor_id) in self.children
            chunks.append(LogChunk(name, entry.executor_id, entry.kind, offset, data.decode(errors="replace"), size,
                                   running))
        return LogsReply(self.worker_id, chunks)

    # --- children ----------------------------------------------------------------

    async def _watch(self, child: Child) -> None:
        code = await child.process.wait()
        self.children.pop((child.app_id, child.executor_id), None)
        shutil.rmtree(child.workdir, ignore_errors=True)
        last_error = await asyncio.to_thread(last_error_line, child.log_path) if code else ""
        log.info("process_exited", app_id=child.app_id, executor_id=child.executor_id, kind=child.kind,
                 exit_code=code, last_error=last_error)
        stopped = ExecutorStopped(self.worker_id, child.app_id, child.executor_id, child.kind, code,
                                  last_error=last_error, attempt=child.attempt)
        if self.bus.nc.is_connected:
            await self.bus.publish(subjects.EXECUTOR_STOPPED, stopped)
            await self.bus.publish(subjects.appmaster_executor_stopped(child.app_id), stopped)

    def _kill_child(self, child: Child) -> None:
        if child.process.returncode is None:
            log.warning("process_killed", app_id=child.app_id, executor_id=child.executor_id, pid=child.process.pid,
                        reason="fenced")
            try:
                child.process.kill()
            except ProcessLookupError:
                pass

    async def _stop_child(self, child: Child) -> None:
        """SIGTERM, then SIGKILL after a grace period."""
        process = child.process
        if process.returncode is not None:
            return
        try:
            process.terminate()
            await asyncio.wait_for(process.wait(), STOP_GRACE_S)
        except ProcessLookupError:
            return
        except asyncio.TimeoutError:
            log.warning("process_killed", app_id=child.app_id, executor_id=child.executor_id, pid=process.pid)
            process.kill()
            await process.wait()

    async def heartbeat_loop(self) -> None:
        while True:
            running = [c.label for c in self.children.values()]
            await self.bus.publish(
                subjects.WORKER_HEARTBEAT, WorkerHeartbeat(self.worker_id, self.slots, len(running), running)
            )
            await asyncio.sleep(self.heartbeat_interval)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.worker", description="gearbus worker")
    add_nats_argument(parser)
    add_connect_timeout_argument(parser)
    parser.add_argument("--slots", type=int, default=4, help="processes this worker may run (default 4)")
    parser.add_argument("--worker-id", default="", help="this worker's id (default: generated)")
    parser.add_argument("--log-dir", default="",
                        help="where the output of the processes it launches is kept (default: a new temp dir)")
    parser.add_argument("--no-fork-server", action="store_true", default=os.environ.get(NO_FORK_SERVER_ENV, "") not in ("", "0"),
                        help="start each AppMaster and executor as a fresh interpreter, not forked from a "
                             f"pre-imported fork server (for measuring and debugging; also ${NO_FORK_SERVER_ENV}=1)")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.slots < 1:
        parser.error("--slots must be at least 1")
    try:
        security = Security.from_args(args)
    except CredentialsError as exc:
        parser.error(str(exc))
    worker_id = args.worker_id or f"worker-{uuid.uuid4().hex[:8]}"
    log_dir = args.log_dir or tempfile.mkdtemp(prefix=f"gearbus-{worker_id}-logs-")
    os.makedirs(log_dir, exist_ok=True)
    configure("worker", worker_id)
    return run_service(Worker(nats_servers(args.nats), worker_id, args.slots, log_dir, security,
                              fork_server=not args.no_fork_server), args.connect_timeout)
