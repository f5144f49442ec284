"""compose.yaml, checked without a Docker engine: the file is parsed, and each gearbus
service's command is run locally, exactly as written (only the NATS URL and the
interpreter are swapped), against a test nats-server. The cluster it makes must
register both workers, run WordCount correctly and stop cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import urllib.request

import pytest
import yaml

from gearbus.artifact import pack
from gearbus.client import Client
from gearbus.natsserver import find_binary, free_port, wait_listening
from gearbus.security import SecurityDir
from shared.messages import AppState
from shared.security import Security
from tests.support.cluster import wait_for_cluster
from tests.support.paths import REPO, WORDCOUNT

COMPOSE = os.path.join(REPO, "compose.yaml")
COMPOSE_NATS_URL = "nats://nats:4222"

REGISTER_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0


def load_compose() -> dict:
    with open(COMPOSE) as f:
        return yaml.safe_load(f)


def command_of(service: dict) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]


def local_command(service: dict, nats_url: str, http_port: int) -> list[str]:
    """The service's compose command, run here: the test server's URL, this Python, and a
    free loopback port for the dashboard."""
    argv = [part.replace(COMPOSE_NATS_URL, nats_url) for part in command_of(service)]
    if argv and argv[0] == "python":
        argv[0] = sys.executable
    if "--port" in argv:
        argv[argv.index("--port") + 1] = str(http_port)
        argv[argv.index("--host") + 1] = "127.0.0.1"
    return argv


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_compose_file_declares_the_cluster():
    compose = load_compose()
    services = open_services(compose)
    assert set(services) == {"nats", "master", "master-standby", "worker-1", "worker-2", "dashboard"}

    nats = services["nats"]
    version = str(nats["image"]).removeprefix("nats:").split(".")
    assert int(version[0]) == 2 and int(version[1]) >= 11, "the leader lease needs per-message TTLs (2.11+)"
    nats_args = command_of(nats)
    assert "-js" in nats_args or "--jetstream" in nats_args
    assert nats.get("volumes"), "the JetStream store needs a volume"

    assert services["master"]["build"] == "."
    for name in ("master", "master-standby", "worker-1", "worker-2"):
        service = services[name]
        depends = service["depends_on"]
        assert "nats" in (depends if isinstance(depends, (list, dict)) else [depends])
        argv = command_of(service)
        assert argv[:3] == ["python", "-m", "services.master" if name.startswith("master") else "services.worker"]
        assert flag(argv, "--nats") == COMPOSE_NATS_URL
    assert flag(command_of(services["master"]), "--master-id") == "master-0"
    assert flag(command_of(services["master-standby"]), "--master-id") == "master-1"
    for name in ("worker-1", "worker-2"):
        argv = command_of(services[name])
        assert flag(argv, "--worker-id") == name
        assert flag(argv, "--slots") == "4"
    dashboard = command_of(services["dashboard"])
    assert dashboard[:3] == ["python", "-m", "services.dashboard"] and flag(dashboard, "--nats") == COMPOSE_NATS_URL
    assert services["dashboard"]["ports"] == [f"127.0.0.1:{flag(dashboard, '--port')}:{flag(dashboard, '--port')}"]


async def wait_for_compose_workers(client: Client, expected: dict[str, int], processes: dict,
                                   watcher: Client | None = None) -> None:
    """Return once every expected worker is registered and alive with its slots;
    fail early if a service exits."""

    def ready(info) -> bool:
        seen = {w.worker_id: w.slots for w in info.workers if w.alive}
        if all(seen.get(worker_id) == slots for worker_id, slots in expected.items()):
            return True
        exited = {name: p.returncode for name, p in processes.items() if p.returncode is not None}
        assert not exited, f"services exited before the workers registered: {exited}"
        return False

    await wait_for_cluster(client, ready, REGISTER_TIMEOUT_S, watcher)


def write_input(path: str, lines: int = 2000) -> collections.Counter:
    rng = random.Random(20240611)
    vocabulary = [f"w{i}" for i in range(300)] + ["gear", "pump", "nats", "stream", "ÄÖü", "x"]
    expected: collections.Counter = collections.Counter()
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(lines):
            words = [rng.choice(vocabulary) for _ in range(rng.randint(0, 12))]
            expected.update(words)
            f.write("  ".join(words) + "\n")
    return expected


def read_counts(path: str) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                assert record["word"] not in counts, f"{record['word']!r} written twice"
                counts[record["word"]] = record["count"]
    return counts


def logs(log_dir, names) -> str:
    out = []
    for name in names:
        path = os.path.join(log_dir, f"{name}.log")
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                out.append(f"--- {name} ---\n{f.read()[-4000:]}")
    return "\n".join(out)


def open_services(compose: dict) -> dict:
    """The services `docker compose up` starts: those of no profile."""
    return {name: service for name, service in compose["services"].items() if not service.get("profiles")}


async def run_wordcount_and_stop(argvs: dict[str, list[str]], nats_url: str, http_port: int, expected_workers,
                                 tmp_path, security: Security = Security(), watcher_security: Security = Security()) -> None:
    """Start the services as given, run WordCount through them and check every count,
    check the dashboard serves the app, then SIGTERM them all: each must exit 0.
    ``watcher_security``: an identity that may watch worker heartbeats."""
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    names = list(argvs)
    processes: dict[str, asyncio.subprocess.Process] = {}
    try:
        for name, argv in argvs.items():
            with open(log_dir / f"{name}.log", "wb") as log:
                # Its own process group, so the finally below also reaches any
                # AppMaster or executor a worker left behind.
                processes[name] = await asyncio.create_subprocess_exec(
                    *argv, cwd=REPO, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
                    start_new_session=True)

        async with Client(nats_url, timeout=30, security=security) as client, \
                Client(nats_url, timeout=30, security=watcher_security) as watcher:
            try:
                await wait_for_compose_workers(client, expected_workers, processes, watcher)
            except TimeoutError:
                raise AssertionError(f"workers did not register within {REGISTER_TIMEOUT_S:g} s\n"
                                     + logs(log_dir, names)) from None
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{logs(log_dir, names)}") from None

            input_path = str(tmp_path / "text.txt")
            output_path = str(tmp_path / "counts.jsonl")
            expected = write_input(input_path)
            app_id = await client.submit(pack(WORDCOUNT),
                                         ["--input", input_path, "--output", output_path, "--parallelism", "2"])
            summary = await client.wait(app_id, timeout=60)
            assert summary.state == AppState.SUCCEEDED, (summary, logs(log_dir, names))
            assert read_counts(output_path) == expected
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/v1/apps/{app_id}", timeout=10) as page:
                assert json.load(page)["state"] == AppState.SUCCEEDED  # the dashboard serves the cluster

        for process in processes.values():
            process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                codes = {name: await process.wait() for name, process in processes.items()}
        except TimeoutError:
            running = [name for name, p in processes.items() if p.returncode is None]
            raise AssertionError(f"{running} still running {STOP_TIMEOUT_S:g} s after SIGTERM\n"
                                 + logs(log_dir, names)) from None
        assert codes == {name: 0 for name in names}, logs(log_dir, names)
    finally:
        for process in processes.values():
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def workers_of(services: dict) -> dict[str, int]:
    return {flag(command_of(service), "--worker-id"): int(flag(command_of(service), "--slots"))
            for service in services.values() if command_of(service)[2:3] == ["services.worker"]}


async def test_compose_services_run_wordcount_and_stop_cleanly(nats_server, tmp_path):
    services = open_services(load_compose())
    names = [name for name in services if name != "nats"]
    assert sorted(names) == ["dashboard", "master", "master-standby", "worker-1", "worker-2"]
    http_port = free_port()
    expected_workers = workers_of(services)
    assert expected_workers == {"worker-1": 4, "worker-2": 4}
    argvs = {name: local_command(services[name], nats_server.url, http_port) for name in names}
    for argv in argvs.values():
        assert COMPOSE_NATS_URL not in argv and nats_server.url in argv
    await run_wordcount_and_stop(argvs, nats_server.url, http_port, expected_workers, tmp_path)


async def test_the_secure_profile_runs_wordcount_with_a_credential_per_role_and_tls(tmp_path):
    """Its commands as written, with ./security, /data and the ports moved into the test's
    directory and free loopback ports; the nats service runs the local nats-server binary."""
    services = {name: service for name, service in load_compose()["services"].items()
                if service.get("profiles") == ["secure"]}
    assert sorted(services) == ["dashboard-secure", "master-secure", "nats-secure", "security-init",
                                "worker-secure-1", "worker-secure-2"]
    port, http_port = free_port(), free_port()
    url = f"nats://127.0.0.1:{port}"
    security_dir = str(tmp_path / "security")

    def here(argv: list[str]) -> list[str]:
        moved = []
        for part in argv:
            part = part.replace("nats://nats-secure:4222", url).replace("/security", security_dir)
            moved.append({"0.0.0.0:4222": f"127.0.0.1:{port}", "/data": str(tmp_path / "jetstream"),
                          "python": sys.executable}.get(part, part))
        return moved

    for mount in ("nats-secure", "master-secure", "worker-secure-1", "dashboard-secure", "security-init"):
        assert any(v.startswith("./security:/security") for v in services[mount]["volumes"]), mount
    init_argv = here(command_of(services["security-init"]))
    for _ in range(2):  # a restart keeps the set it wrote
        done = subprocess.run(init_argv, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    written = SecurityDir(security_dir)
    assert written.tls and os.path.exists(written.creds("client"))

    nats_argv = command_of(services["nats-secure"])
    assert nats_argv == ["-c", "/security/nats-server.conf"]
    server = subprocess.Popen([find_binary(), *here(nats_argv)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(server, port, 10)
        argvs = {name: here(command_of(services[name])) for name in services if name not in ("security-init",
                                                                                            "nats-secure")}
        argvs["dashboard-secure"][argvs["dashboard-secure"].index("--port") + 1] = str(http_port)
        argvs["dashboard-secure"][argvs["dashboard-secure"].index("--host") + 1] = "127.0.0.1"
        with pytest.raises(ConnectionError, match="Authorization Violation"):  # it is secure: no entry without one
            client_tls = written.security("client")
            async with Client(url, timeout=10, security=client_tls.with_credential("")) as nobody:
                await nobody.list()
        await run_wordcount_and_stop(argvs, url, http_port, workers_of(services), tmp_path,
                                     security=written.security("client"), watcher_security=written.security("master"))
    finally:
        server.terminate()
        server.wait(10)
