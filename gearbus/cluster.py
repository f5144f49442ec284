"""An embedded cluster on this machine: nats-server, a master and N workers as real
processes. ``gearbus run`` uses it by default; the tests use it as a fixture."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time

from gearbus.natsserver import NatsCluster, NatsServer
from gearbus.security import SecurityDir
from shared.service import role_command


def children_of(pid: int) -> list[int]:
    """The live child processes of ``pid`` (an exited child not reaped yet is gone)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, parent = f.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if int(parent) == pid and state != "Z":
            found.append(int(entry))
    return found


def role_of(pid: int) -> str | None:
    """"appmaster", "executor" or "forkserver" for a process a worker started, else None: a
    forked role is named in ``ps`` (/proc/PID/comm), a fresh one by its command line."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            name = f.read().strip()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read()
    except OSError:
        return None
    for kind in ("appmaster", "executor"):
        if name == f"gb-{kind}".encode() or f"services.{kind}".encode() in command:
            return kind
    return "forkserver" if b"services.worker.forkserver" in command else None


def launched_by(worker_pid: int) -> list[tuple[int, str]]:
    """(pid, "appmaster" | "executor") of every live process a worker launched: its own
    children, and its fork server's."""
    found = []
    for pid in children_of(worker_pid):
        kind = role_of(pid)
        if kind == "forkserver":
            found += [(child, role) for child in children_of(pid) if (role := role_of(child)) in ("appmaster", "executor")]
        elif kind is not None:
            found.append((pid, kind))
    return found


class LocalCluster:
    def __init__(self, workers: int = 2, slots: int = 4, log_dir: str | None = None,
                 nats: NatsServer | NatsCluster | None = None,
                 heartbeat_interval: float = 1.0, masters: int = 1, security: SecurityDir | None = None):
        """``security``: run every role with its credential from a `gearbus security init`
        directory (and an own server that requires them)."""
        self.num_workers = workers
        self.slots = slots
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="gearbus-logs-")
        os.makedirs(self.log_dir, exist_ok=True)
        self._own_nats = nats is None
        self.security = security
        self.nats = nats or NatsServer(log_path=os.path.join(self.log_dir, "nats-server.log"),
                                       include=security.auth_config if security else "")
        self.heartbeat_interval = heartbeat_interval
        self.num_masters = masters
        self.masters: dict[str, subprocess.Popen] = {}
        self.workers: dict[str, subprocess.Popen] = {}

    @property
    def url(self) -> str:
        return self.nats.url

    @property
    def urls(self) -> list[str]:
        return self.nats.urls

    def _spawn(self, name: str, role: str, *args: str) -> subprocess.Popen:
        log = open(os.path.join(self.log_dir, f"{name}.log"), "ab")
        env = dict(os.environ, GEARBUS_LOG_LEVEL=os.environ.get("GEARBUS_LOG_LEVEL", "info"))
        servers = [option for url in self.urls for option in ("--nats", url)]
        if self.security:
            servers += self.security.role_args(role)
        return subprocess.Popen([*role_command(f"services.{role}"), *args, *servers], stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL, env=env)

    def start_master(self, master_id: str = "master-0") -> subprocess.Popen:
        process = self._spawn(master_id, "master", "--master-id", master_id,
                              "--heartbeat-interval", str(self.heartbeat_interval))
        self.masters[master_id] = process
        return process

    def processes(self) -> list[tuple[int, str, str]]:
        """(pid, worker id, "executor" | "appmaster") of every process the live workers run:
        for failure tests and benchmarks that kill them."""
        found = []
        for worker_id, worker in self.workers.items():
            if worker.poll() is not None:
                continue
            found += [(pid, worker_id, kind) for pid, kind in launched_by(worker.pid)]
        return found

    def launches(self) -> dict[tuple[int, int], int]:
        """(app id, executor id; -1 for an AppMaster) -> pid of every live process the live
        workers run, from the ``process_launched`` lines of their logs (a forked process's
        /proc/PID/environ is its fork server's, so the launch is not read there)."""
        live = {pid for pid, _, _ in self.processes()}
        found = {}
        for worker_id in self.workers:
            try:
                with open(os.path.join(self.log_dir, f"{worker_id}.log"), encoding="utf-8", errors="replace") as f:
                    lines = [json.loads(line) for line in f if '"process_launched"' in line]
            except (OSError, ValueError):
                continue
            for line in lines:
                if line.get("event") == "process_launched" and line.get("pid") in live:
                    found[(line["app_id"], line["executor_id"])] = line["pid"]
        return found

    def start_worker(self, worker_id: str, slots: int | None = None) -> subprocess.Popen:
        process = self._spawn(worker_id, "worker", "--worker-id", worker_id, "--slots",
                              str(slots or self.slots), "--log-dir", self.log_dir)
        self.workers[worker_id] = process
        return process

    def power_cut(self) -> None:
        """SIGKILL every process of the cluster at once, the nats-server included when
        the cluster owns it (for tests and benchmarks of a whole-cluster restart)."""
        victims = [pid for pid, _, _ in self.processes()]
        victims += [p.pid for p in [*self.masters.values(), *self.workers.values()] if p.poll() is None]
        if self._own_nats and self.nats.process is not None:
            victims.append(self.nats.process.pid)
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in [*self.masters.values(), *self.workers.values()]:
            p.wait()

    def restart(self) -> None:
        """Start every master and worker again under its id (after :meth:`power_cut`)."""
        if self._own_nats:
            self.nats.start()
        for master_id in list(self.masters):
            self.start_master(master_id)
        for worker_id in list(self.workers):
            self.start_worker(worker_id)

    def start(self) -> LocalCluster:
        """Start every process; registration happens in the background (the master
        queues work until workers offer slots, and clients retry until it answers)."""
        if self._own_nats:
            self.nats.start()
        for i in range(self.num_masters):
            self.start_master(f"master-{i}")
        for i in range(self.num_workers):
            self.start_worker(f"worker-{i}")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM workers (they stop their children), then the masters, then NATS."""
        processes = list(self.workers.values()) + list(self.masters.values())
        for p in processes:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in processes:
            try:
                p.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self._own_nats:
            self.nats.stop()

    def logs_tail(self, lines: int = 20) -> str:
        """The last lines of every process log, for error reports."""
        out = []
        for name in sorted(os.listdir(self.log_dir)):
            with open(os.path.join(self.log_dir, name), "rb") as f:
                tail = f.read().decode(errors="replace").splitlines()[-lines:]
            out.append(f"== {name}\n" + "\n".join(tail))
        return "\n".join(out)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
