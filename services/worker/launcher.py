"""How a worker starts its AppMasters and executors: forked by its fork server
(services/worker/forkserver.py), which has their modules imported already, or as a plain
``python -m`` subprocess when the fork server is turned off (``--no-fork-server``,
``$GEARBUS_NO_FORK_SERVER``) or cannot serve. A launch never fails because of the fork
server: it falls back to a subprocess, and a new fork server is started for the next one."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
from collections.abc import Callable, Coroutine, Mapping, Sequence

import structlog

from services.launch import die_with_parent
from services.worker.forkserver import Launch, process_name
from shared.security import SECURITY_ENV
from shared.service import role_command

log = structlog.get_logger()

NO_FORK_SERVER_ENV = "GEARBUS_NO_FORK_SERVER"
#: What every launched interpreter reads at start-up, so the fork server has it too.
INTERPRETER_ENV = {
    "PYTHONHASHSEED": "0",  # one string hash on every executor: hash partitioning agrees
    "PYTHONUNBUFFERED": "1",  # what a task prints reaches its log (and `gearbus logs`) at once
}
READY_TIMEOUT_S = 60.0  # its imports, on a loaded machine
FORK_TIMEOUT_S = 30.0


class ForkServerUnavailable(Exception):
    pass


class ForkedProcess:
    """A child of the fork server, with the part of asyncio.subprocess.Process's interface
    the worker uses. Its exit code comes from the fork server, which reaps it."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self._exited = asyncio.Event()

    def exited(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is not None:  # reaped: its pid may be another process's now
            raise ProcessLookupError(self.pid)
        os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def orphaned(self) -> None:
        """The fork server died without reporting this child's exit: make sure it ends (its
        death signal may be one it handles), wait until it has, and call it killed."""
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            self.exited(-signal.SIGKILL)
            return
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            gone = asyncio.Event()
            asyncio.get_running_loop().add_reader(fd, gone.set)
            try:
                await gone.wait()
            finally:
                asyncio.get_running_loop().remove_reader(fd)
        except ProcessLookupError:
            pass
        finally:
            os.close(fd)
        self.exited(-signal.SIGKILL)


class _Server:
    """One running fork server and what is in flight with it."""

    def __init__(self, process: asyncio.subprocess.Process):
        self.process = process
        self.ready = asyncio.get_running_loop().create_future()
        self.forks: dict[int, asyncio.Future] = {}  # launch id -> its ForkedProcess
        self.children: dict[int, ForkedProcess] = {}  # by pid, until reported exited

    def on_line(self, line: bytes) -> None:
        message = json.loads(line)
        if "ready" in message:
            self.ready.set_result(None)
        elif "exited" in message:
            child = self.children.pop(message["exited"], None)
            if child is not None:
                child.exited(message["code"])
        else:
            fork = self.forks.pop(message["id"], None)
            if "pid" in message:
                child = self.children[message["pid"]] = ForkedProcess(message["pid"])
                if fork is not None and not fork.done():
                    fork.set_result(child)
            elif fork is not None and not fork.done():
                fork.set_exception(ForkServerUnavailable(message.get("error", "no pid")))

    def gone(self, why: str) -> None:
        for pending in [self.ready, *self.forks.values()]:
            if not pending.done():
                pending.set_exception(ForkServerUnavailable(why))
        self.ready.exception()  # retrieved here: no launch may be waiting for it


class Launcher:
    """Starts role processes for a worker. ``spawn`` runs the fork server's reader as the
    worker's background work (the worker's ``Service.spawn``)."""

    def __init__(self, spawn: Callable[[Coroutine, str], asyncio.Task], fork_server: bool = True):
        self.spawn = spawn
        self.fork_server = fork_server
        self.server: _Server | None = None
        self._ids = itertools.count()
        self._closing = False

    async def start(self) -> None:
        """Start the fork server (it imports in the background; the first launch waits)."""
        if not self.fork_server or self._closing:
            return
        env = {k: v for k, v in os.environ.items() if k not in SECURITY_ENV} | INTERPRETER_ENV
        process = await asyncio.create_subprocess_exec(
            *role_command("services.worker.forkserver"), env=env, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, preexec_fn=die_with_parent(signal.SIGKILL))
        self.server = _Server(process)
        self.spawn(self._serve(self.server), "fork-server")
        log.info("fork_server_started", pid=process.pid)

    async def _serve(self, server: _Server) -> None:
        while line := await server.process.stdout.readline():
            try:
                server.on_line(line)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("fork_server_bad_reply", reply=line[:200].decode(errors="replace"), error=repr(exc))
        code = await server.process.wait()
        was_ready = server.ready.done() and server.ready.exception() is None
        server.gone(f"the fork server exited with code {code}")
        if self.server is server:
            self.server = None
        if not self._closing:
            log.warning("fork_server_exited", exit_code=code, children=len(server.children))
            if not was_ready:  # it cannot start here: do not try again for every launch
                log.error("fork_server_disabled", reason="it exited before it was ready")
                self.fork_server = False
        await asyncio.gather(*(child.orphaned() for child in list(server.children.values())))

    async def launch(self, module: str, args: Sequence[str], env: Mapping[str, str], log_path: str,
                     death_signal: int) -> ForkedProcess | asyncio.subprocess.Process:
        """``python -m <module> <args>`` with ``env`` (which should carry INTERPRETER_ENV),
        output appended to ``log_path``, getting ``death_signal`` when the worker dies."""
        if self.fork_server:
            try:
                return await self._fork(module, args, env, log_path, death_signal)
            except ForkServerUnavailable as exc:
                log.warning("fork_server_unavailable", error=str(exc), module=module, fallback="subprocess")
                await self._restart()
        with open(log_path, "ab") as output:  # the child writes it directly: it outlives this worker
            return await asyncio.create_subprocess_exec(
                *role_command(module), *args, env=dict(env), preexec_fn=die_with_parent(death_signal),
                stdin=asyncio.subprocess.DEVNULL, stdout=output, stderr=asyncio.subprocess.STDOUT)

    async def _fork(self, module: str, args: Sequence[str], env: Mapping[str, str], log_path: str,
                    death_signal: int) -> ForkedProcess:
        server = self.server
        if server is None:
            raise ForkServerUnavailable("no fork server runs")
        try:
            await asyncio.wait_for(asyncio.shield(server.ready), READY_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise ForkServerUnavailable(f"the fork server was not ready after {READY_TIMEOUT_S:.0f} s") from None
        launch = Launch(next(self._ids), module, list(args), dict(env), os.getcwd(), log_path, int(death_signal),
                        process_name(module))
        fork = server.forks[launch.id] = asyncio.get_running_loop().create_future()
        try:
            server.process.stdin.write(launch.encode())
            await server.process.stdin.drain()
            return await asyncio.wait_for(fork, FORK_TIMEOUT_S)
        except (ConnectionError, BrokenPipeError) as exc:
            raise ForkServerUnavailable(f"the fork server's pipe broke: {exc}") from None
        except asyncio.TimeoutError:
            server.process.kill()  # hung: what it forks after this would run unwatched
            raise ForkServerUnavailable(f"the fork server did not fork in {FORK_TIMEOUT_S:.0f} s") from None

    async def _restart(self) -> None:
        if self.server is not None and self.server.process.returncode is None:
            return  # still running: it failed one fork only
        self.server = None
        try:
            await self.start()
        except OSError as exc:
            log.error("fork_server_disabled", reason=f"it cannot be started: {exc}")
            self.fork_server = False

    async def close(self) -> None:
        """Stop the fork server (after the worker has stopped its children: the children of
        a fork server that exits get their death signal)."""
        self._closing = True
        server, self.server = self.server, None
        if server is None or server.process.returncode is not None:
            return
        server.process.stdin.close()
        try:
            await asyncio.wait_for(server.process.wait(), 5)
        except asyncio.TimeoutError:
            server.process.kill()
            await server.process.wait()
