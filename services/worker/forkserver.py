"""The worker's fork server: one pre-imported interpreter per worker that forks its
AppMasters and executors, so each launch skips the half second of CPU a fresh
interpreter spends importing them (docs/operations.md, "The worker's fork server").

Run as ``python -P -m services.worker.forkserver`` by the worker (services/worker/launcher.py)
with the environment every launched process needs at interpreter start (PYTHONHASHSEED,
PYTHONUNBUFFERED). It imports the roles' modules (no event loop, no thread, no NATS
connection), says it is ready, then reads launch requests on stdin, one JSON line each,
and answers on stdout: ``{"id": n, "pid": p}`` (or ``{"id": n, "error": "..."}``) for each
launch, ``{"exited": p, "code": c}`` when a child exits (``code`` as
``asyncio.subprocess.Process.returncode`` gives it: negative for a signal). It exits when
its stdin closes, and dies with the worker (PR_SET_PDEATHSIG); each child gets its own
death signal when the fork server dies, so a worker's death still reaches every child.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import runpy
import selectors
import signal
import sys
from dataclasses import asdict, dataclass

from services.launch import die_with_parent

#: What every AppMaster and executor imports before its main runs (services.apptypes picks
#: the role's implementation from these).
PRELOAD = ("uvloop", "services.apptypes", "services.app_code", "services.appmaster.appmaster",
           "services.appmaster.shell", "services.executor.executor", "services.executor.shell")
READY = {"ready": True}
PR_SET_NAME = 15


@dataclass(frozen=True)
class Launch:
    """One process to start: ``python -m <module> <args>`` with this environment, working
    directory and output file, getting ``death_signal`` when the fork server dies.
    ``name``: its name in ``ps`` (/proc/PID/comm), as the command line shows the fork server's."""

    id: int
    module: str
    args: list[str]
    env: dict[str, str]
    cwd: str
    log_path: str
    death_signal: int
    name: str

    def encode(self) -> bytes:
        return encode_line({"launch": asdict(self)})


def encode_line(message: dict) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode_launch(line: bytes) -> Launch:
    """A launch request; a malformed one raises ValueError naming what is wrong."""
    try:
        fields = json.loads(line)["launch"]
        return Launch(**fields)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"malformed launch request {line[:200]!r}: {exc}") from None


def process_name(module: str) -> str:
    """``ps``'s name for a forked role process: "gb-executor" for services.executor (the
    kernel keeps 15 bytes)."""
    return f"gb-{module.rpartition('.')[2]}"[:15]


def preload() -> None:
    for module in PRELOAD:
        importlib.import_module(module)
    gc.freeze()  # what is imported stays shared with every child: no collection touches (copies) it


class ForkServer:
    """The serving loop. :meth:`serve` returns in a forked child only (with its launch);
    in the fork server it returns None when the worker closes the requests pipe."""

    def __init__(self, requests: int, replies: int):
        self.requests = requests
        self.replies = replies
        self.pid = os.getpid()
        self.wakeup_read, self.wakeup_write = os.pipe()
        os.set_blocking(self.wakeup_write, False)
        self.pending = b""

    def serve(self) -> Launch | None:
        signal.set_wakeup_fd(self.wakeup_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select() through the wakeup fd
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is for the roles, not for this
        self.reply(READY)
        with selectors.DefaultSelector() as selector:
            selector.register(self.requests, selectors.EVENT_READ)
            selector.register(self.wakeup_read, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select():
                    if key.fd == self.wakeup_read:
                        os.read(self.wakeup_read, 4096)
                        continue
                    data = os.read(self.requests, 65536)
                    if not data:
                        return None
                    launch = self.on_data(data)
                    if launch is not None:
                        return launch
                self.reap()

    def on_data(self, data: bytes) -> Launch | None:
        self.pending += data
        while b"\n" in self.pending:
            line, self.pending = self.pending.split(b"\n", 1)
            try:
                launch = decode_launch(line)
            except ValueError as exc:
                print(f"gearbus fork server: {exc}", file=sys.stderr, flush=True)
                continue
            try:
                pid = os.fork()
            except OSError as exc:
                self.reply({"id": launch.id, "error": f"fork failed: {exc}"})
                continue
            if pid == 0:
                self.become_child(launch)
                return launch
            self.reply({"id": launch.id, "pid": pid})
        return None

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.reply({"exited": pid, "code": os.waitstatus_to_exitcode(status)})

    def reply(self, message: dict) -> None:
        data = encode_line(message)
        while data:
            data = data[os.write(self.replies, data):]

    def become_child(self, launch: Launch) -> None:
        """What a fresh ``python -m`` started by the worker would have: its death signal, the
        launch's environment and working directory, stdin from /dev/null, stdout and stderr
        to its log, the default signal handlers; none of the fork server's descriptors."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in (self.requests, self.replies, self.wakeup_read, self.wakeup_write):
            os.close(fd)
        die_with_parent(launch.death_signal)()
        if os.getppid() != self.pid:  # the fork server died before the death signal was set
            os.kill(os.getpid(), launch.death_signal)
        os.chdir(launch.cwd)
        os.environ.clear()
        os.environ.update(launch.env)
        null = os.open(os.devnull, os.O_RDONLY)
        output = os.open(launch.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        os.dup2(null, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(null)
        os.close(output)
        if sys.platform.startswith("linux"):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_NAME, launch.name.encode()[:15], 0, 0, 0)


def run_module(launch: Launch) -> None:
    """Run the launch's role as ``python -m`` would; its SystemExit ends this process."""
    sys.argv = [launch.module, *launch.args]
    runpy.run_module(launch.module, run_name="__main__", alter_sys=True)


def main() -> int:
    # The protocol's pipes move off stdin and stdout, so nothing printed can corrupt them.
    requests, replies = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    preload()
    launch = ForkServer(requests, replies).serve()
    if launch is not None:
        run_module(launch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
