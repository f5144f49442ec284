"""How a process launched by a worker learns what to run (loading the user's code is
services.app_code's: the worker imports this module, and needs none of that).

The worker passes the LaunchExecutor message it received, msgpack-encoded and base64'd,
in the GEARBUS_LAUNCH environment variable (with the app's own NATS credential in it), its
worker id in GEARBUS_WORKER_ID, a scratch directory in GEARBUS_WORKDIR, its TLS files in
GEARBUS_TLS_*, and the NATS servers on the command line.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import os
import signal
import socket
import sys
from collections.abc import Callable

from shared.messages import LaunchExecutor, decode
from shared.security import ENV_CREDS, Security

LAUNCH_ENV = "GEARBUS_LAUNCH"
WORKER_ENV = "GEARBUS_WORKER_ID"
WORKDIR_ENV = "GEARBUS_WORKDIR"  # a scratch directory the worker removes when the process exits
#: The signal an executor gets when its worker dies (fatal until the executor is ready to
#: report its own end: see services/executor/heartbeat.py).
WORKER_GONE_SIGNAL = signal.SIGUSR1
PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int) -> Callable[[], None]:
    """For a child before exec: get ``sig`` when the process that starts it dies, even by
    SIGKILL (Linux)."""
    def set_death_signal() -> None:
        if sys.platform.startswith("linux"):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    return set_death_signal


def state_directory() -> str | None:
    """Where a launched process's tasks keep disk state: under its scratch directory, so
    the worker removes it with the process (None outside a worker: a temporary one)."""
    workdir = os.environ.get(WORKDIR_ENV)
    return os.path.join(workdir, "state") if workdir else None


def worker_place() -> str:
    """Where a launched process runs, for the errors a user reads: its worker's id and
    host ("" outside a worker)."""
    worker = os.environ.get(WORKER_ENV)
    return f"worker {worker} (host {socket.gethostname()})" if worker else ""


def encode_launch(message: LaunchExecutor) -> str:
    return base64.b64encode(message.encode()).decode()


def launch_from_env() -> LaunchExecutor:
    data = os.environ.get(LAUNCH_ENV)
    if not data:
        raise SystemExit(f"{LAUNCH_ENV} is not set: this process is started by a gearbus worker")
    return decode(base64.b64decode(data), (LaunchExecutor,))


def launch_security(launch: LaunchExecutor) -> Security:
    """The app's own credential from the launch, with the TLS files the worker passed on."""
    return Security.load(environ={k: v for k, v in os.environ.items() if k != ENV_CREDS}).with_credential(
        launch.credentials)


def parse_launched_args(role: str, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m services.{role}", description=f"gearbus {role} (started by a worker)")
    parser.add_argument("--nats", action="append", required=True, help="NATS server URL (repeatable)")
    return parser.parse_args(argv)
