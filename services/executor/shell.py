"""A shell app's executor (the shell application type, docs/application-types.md): runs
the app's command once, as a subprocess of its own (the argv as given: no shell reads it),
sends its stdout and stderr lines to the AppMaster in order as they come, then its exit
code. A command that does not exist exits 127 with a line on stderr saying so, as a shell
would. Asked to stop (StopShellCommand, past the app's timeout) or stopped itself (SIGTERM:
the app was killed), it ends the command's process group with SIGTERM, then SIGKILL after
``STOP_GRACE_S`` to whatever of the group is left (children that outlive the command's own
process included), and reports how it ended."""

from __future__ import annotations

import asyncio
import os
import signal

import structlog

from services.launch import WORKER_ENV, WORKER_GONE_SIGNAL, die_with_parent, launch_from_env, launch_security, parse_launched_args
from shared import subjects
from shared.bus import RequestError
from shared.logging import configure
from shared.messages import (MAX_SHELL_LINE_CHARS, ExecutorRegistered, LaunchExecutor, Message, RegisterExecutor,
                             ShellExited, ShellLine, ShellLines, ShellStream, StopShellCommand)
from shared.security import Security
from shared.service import Service, run_service

log = structlog.get_logger()

STOP_GRACE_S = 2.0  # SIGTERM, then SIGKILL after this (within the worker's own 5 s grace for this process)
LINGER_S = 0.05  # lines wait this long for more before they are sent
BATCH_BYTES = 256 * 1024  # at most this much per ShellLines, encoded (well under NATS's 1 MB default payload)
LINE_OVERHEAD = 32  # what a ShellLine costs on the wire beside its text (a msgpack map of two)
PENDING_BYTES = 4 * 1024 * 1024  # lines not sent yet beyond this: the command's output is read no further for now
READ_BYTES = 64 * 1024
LINE_BYTES = 4 * MAX_SHELL_LINE_CHARS  # a longer line is passed on cut (the AppMaster keeps MAX_SHELL_LINE_CHARS)
SEND_TIMEOUT_S = 5.0
SEND_PATIENCE_S = 30.0  # the AppMaster not answering this long (relaunched, gone): the command is stopped
CLOSING_PATIENCE_S = 2.0  # while this process is being stopped
REGISTER_PATIENCE_S = 15.0
EXIT_NOT_FOUND = 127  # a shell's codes: no such command,
EXIT_CANNOT_RUN = 126  # and a command that cannot be run
EXIT_WORKER_GONE = 128 + WORKER_GONE_SIGNAL  # this process, when its worker died
#: Variables of the launch (the app's NATS credential among them) that the command must not see.
PRIVATE_ENV_PREFIX = "GEARBUS_"


def exit_code_of(returncode: int) -> int:
    """A process's end as a shell reports it: its code, or 128 + N when signal N ended it."""
    return returncode if returncode >= 0 else 128 - returncode


class ShellExecutor(Service):
    role = "executor"

    def __init__(self, servers, launch: LaunchExecutor, worker_id: str, security: Security = Security()):
        super().__init__(servers, node_id=f"app{launch.app_id}-executor{launch.executor_id}", security=security)
        self.launch = launch
        self.app_id, self.executor_id, self.worker_id = launch.app_id, launch.executor_id, worker_id
        self.process: asyncio.subprocess.Process | None = None
        self.pending: list[ShellLine] = []
        self.pending_bytes = 0
        self.lines_ready = asyncio.Event()  # pending lines to send, or the last were added
        self.room = asyncio.Event()  # pending lines below PENDING_BYTES
        self.room.set()
        self.all_read = False
        self.seq = 0
        self.stop_reason = ""
        self.command: asyncio.Task | None = None
        self._terminating: asyncio.Task | None = None
        self._closing = False

    async def setup(self) -> None:
        signal.signal(WORKER_GONE_SIGNAL, self._worker_gone)
        await self.bus.serve(subjects.executor_control(self.app_id, self.executor_id),
                             {StopShellCommand: self.on_stop})
        await self.bus.request(subjects.appmaster_executor_register(self.app_id),
                               RegisterExecutor(self.app_id, self.executor_id, self.worker_id, os.getpid()),
                               expect=ExecutorRegistered, retry_s=REGISTER_PATIENCE_S, idempotent=True)
        self.command = self.spawn(self.run_command(), "command")

    async def shutdown(self) -> None:
        """SIGTERM (the app was killed, or the worker stops): end the command (or keep it
        from starting), and report it while the AppMaster may still hear."""
        self._closing = True
        self.stop_reason = self.stop_reason or "stopped: the app was killed"
        if self.process is not None:
            await self.terminate()
        if self.command is not None and not self.command.done():
            await asyncio.wait([self.command], timeout=2 * CLOSING_PATIENCE_S)

    def _worker_gone(self, signum, frame) -> None:
        """The worker died (its death signal to this process): the command's whole group
        dies with it, as this process does (the AppMaster counts the command lost)."""
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os._exit(EXIT_WORKER_GONE)

    # --- handlers ----------------------------------------------------------------------

    async def on_stop(self, msg: StopShellCommand) -> None:
        self.stop_reason = msg.reason or "stopped by its AppMaster"
        log.info("shell_command_stopping", reason=self.stop_reason)
        if self._terminating is None and self.process is not None:  # else run_command stops it once started
            self._terminating = self.spawn(self.terminate(), "terminate")

    # --- the command --------------------------------------------------------------------

    async def run_command(self) -> None:
        argv = list(self.launch.args)
        env = {k: v for k, v in os.environ.items() if not k.startswith(PRIVATE_ENV_PREFIX)}
        try:
            if not argv:
                raise ValueError("no command")
            self.process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGKILL))
        except (OSError, ValueError) as exc:
            code = EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_CANNOT_RUN
            what = "command not found" if code == EXIT_NOT_FOUND else \
                f"cannot run it: {getattr(exc, 'strerror', None) or exc}"
            log.warning("shell_command_not_started", argv=argv, exit_code=code, error=what)
            self._add(ShellStream.STDERR, f"{argv[0] if argv else '(no command)'}: {what}".encode())
            await self._finish(code)
            return
        log.info("shell_command_started", argv=argv, pid=self.process.pid)
        if self.stop_reason and self._terminating is None:  # asked to stop while it was being started
            self._terminating = self.spawn(self.terminate(), "terminate")
        sender = self.spawn(self._send_lines(), "send-lines")
        await asyncio.gather(self._read(self.process.stdout, ShellStream.STDOUT),
                             self._read(self.process.stderr, ShellStream.STDERR))
        returncode = await self.process.wait()
        self.all_read = True
        self.lines_ready.set()
        await sender
        await self._finish(exit_code_of(returncode), returncode)

    async def terminate(self) -> None:
        """SIGTERM to the command's process group; SIGKILL after the grace to what is left of
        it, the command's own process or any child of it (the group outlives its leader, and
        a child holding the pipes keeps the command from ending)."""
        process = self.process
        if process is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_GRACE_S
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:  # the group is gone
                return
            while sig == signal.SIGTERM and loop.time() < deadline:
                if process.returncode is not None and not _group_alive(process.pid):
                    return
                await asyncio.sleep(0.05)
        log.warning("shell_command_killed", pid=process.pid, grace_s=STOP_GRACE_S)

    async def _finish(self, code: int, returncode: int | None = None) -> None:
        if not self.all_read:  # not started: its one line
            self.all_read = True
            self.lines_ready.set()
            await self._send_lines()
        reason = self.stop_reason
        if returncode is not None and returncode < 0:
            ended = f"ended by {signal.Signals(-returncode).name}"
            reason = f"{reason}; {ended}" if reason else ended
        log.info("shell_command_exited", exit_code=code, reason=reason)
        await self._send(subjects.appmaster_shell_exited(self.app_id),
                         ShellExited(self.app_id, self.executor_id, code, reason))
        self.stop()

    # --- output ---------------------------------------------------------------------------

    async def _read(self, stream: asyncio.StreamReader, name: str) -> None:
        """Split a pipe into lines (a line longer than LINE_BYTES passes on cut, the rest of it skipped)."""
        buffer, skipping = b"", False
        while chunk := await stream.read(READ_BYTES):
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for raw in complete:
                if skipping:
                    skipping = False
                else:
                    self._add(name, raw)
            if len(buffer) > LINE_BYTES:
                if not skipping:
                    self._add(name, buffer)
                buffer, skipping = b"", True
            while not self.room.is_set():
                await self.room.wait()
        if buffer and not skipping:
            self._add(name, buffer)

    def _add(self, stream: str, raw: bytes) -> None:
        text = raw[:LINE_BYTES].decode("utf-8", "replace").removesuffix("\r")
        self.pending.append(ShellLine(stream, text))
        self.pending_bytes += _wire_size(text)
        self.lines_ready.set()
        if self.pending_bytes > PENDING_BYTES:
            self.room.clear()

    async def _send_lines(self) -> None:
        """Send pending lines in order, a batch at a time (one in flight), until all are read and sent."""
        while True:
            if not self.pending:
                if self.all_read:
                    return
                self.lines_ready.clear()
                await self.lines_ready.wait()
                continue
            if self.pending_bytes < BATCH_BYTES and not self.all_read:
                await asyncio.sleep(LINGER_S)
            batch, size = [], 0
            for line in self.pending:
                if batch and size + _wire_size(line.text) > BATCH_BYTES:
                    break
                batch.append(line)
                size += _wire_size(line.text)
            del self.pending[:len(batch)]
            self.pending_bytes -= size
            if self.pending_bytes <= PENDING_BYTES:
                self.room.set()
            await self._send(subjects.appmaster_shell_lines(self.app_id),
                             ShellLines(self.app_id, self.executor_id, self.seq, batch))
            self.seq += 1

    async def _send(self, subject: str, message: Message) -> None:
        """A request to the AppMaster, asked again while it does not answer; one it refuses,
        or that nobody answers in time, ends the command: nobody would hear of it."""
        try:
            await self.bus.request(subject, message, SEND_TIMEOUT_S, idempotent=True,
                                   retry_s=CLOSING_PATIENCE_S if self._closing else SEND_PATIENCE_S)
        except RequestError as exc:
            log.error("shell_appmaster_unreachable", subject=subject, error=exc.message)
            if not self._closing:
                await self.terminate()
                raise RuntimeError(f"the AppMaster did not take {type(message).__name__}: {exc.message}") from None


def _wire_size(text: str) -> int:
    """What a line costs in a ShellLines message (an empty one too)."""
    return len(text.encode()) + LINE_OVERHEAD


def _group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a process (a zombie one included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_launched_args("executor", argv)
    launch = launch_from_env()
    configure("executor", f"app{launch.app_id}-executor{launch.executor_id}", app_id=launch.app_id,
              executor_id=launch.executor_id)
    return run_service(ShellExecutor(args.nats, launch, os.environ.get(WORKER_ENV, ""), launch_security(launch)))
