"""A secure cluster, as `gearbus security init --tls` sets it up: nats-server in operator
mode with TLS, every role with its own credential. What each identity must not do is
refused by the server, and nobody without a credential can make any process run code."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys

import nats
import pytest

from gearbus.artifact import pack
from gearbus.client import Client
from gearbus.cluster import LocalCluster
from gearbus.security import SecurityDir, add_user, init
from services.master.credentials import AppCredentials
from shared import digests, subjects
from shared.bus import RemoteError, RequestError
from shared.messages import (
    AppState,
    AppType,
    ErrorCode,
    ExecutorKind,
    LaunchExecutor,
    RequestResource,
    SubmitApplication,
)
from shared.security import Security
from tests.support.cli import gearbus
from tests.support.cluster import wait_for_cluster, wait_state
from tests.support.paths import APPS, EXAMPLES, REPO
from tests.support.ticker import read_ticks, wait_for_ticks

MARKER_APP = os.path.join(APPS, "marker.py")
REFUSAL_TIMEOUT_S = 10


def secure_cluster_of(security_dir: SecurityDir, log_dir) -> LocalCluster:
    return LocalCluster(workers=2, slots=4, log_dir=str(log_dir), security=security_dir)


@pytest.fixture
def security_dir(tmp_path) -> SecurityDir:
    return init(str(tmp_path / "security"), tls=True)


@pytest.fixture
def secure_cluster(security_dir, tmp_path):
    with secure_cluster_of(security_dir, tmp_path / "logs") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def shared_security_dir(tmp_path_factory) -> SecurityDir:
    return init(str(tmp_path_factory.mktemp("shared-security") / "security"), tls=True)


@pytest.fixture(scope="module")
def shared_secure_cluster(shared_security_dir, tmp_path_factory):
    """One secure cluster for this file's tests that make nothing happen in it (each checks
    that nothing did): a cluster of their own cost each ~2.5 s of start-up and stop
    (tests/conftest.py keeps the file on one xdist worker)."""
    with secure_cluster_of(shared_security_dir, tmp_path_factory.mktemp("shared-secure-logs")) as cluster:
        yield cluster


def app_security(security_dir: SecurityDir, app_id: int) -> Security:
    """The credential a master would issue to app ``app_id``'s processes."""
    issued = AppCredentials.load(security_dir.app_signer, security_dir.security("master")).issue(app_id)
    return security_dir.security("client").with_credential(issued)


class Connection:
    """A raw nats-py connection under one identity, collecting the server's refusals."""

    def __init__(self, nc: nats.NATS, errors: asyncio.Queue):
        self.nc, self.errors = nc, errors

    @classmethod
    async def open(cls, url: str, security: Security) -> Connection:
        errors: asyncio.Queue = asyncio.Queue()

        async def on_error(exc):
            errors.put_nowait(str(exc))

        nc = await nats.connect(url, error_cb=on_error, allow_reconnect=False, **security.nats_options())
        return cls(nc, errors)

    async def refusal(self) -> str:
        async with asyncio.timeout(REFUSAL_TIMEOUT_S):
            return await self.errors.get()

    async def assert_refused(self, action: str, subject: str) -> None:
        if action == "publish":
            await self.nc.publish(subject, b"\x80")
        else:
            await self.nc.subscribe(subject)
        await self.nc.flush()
        refusal = (await self.refusal()).lower()
        kind = "publish" if action == "publish" else "subscription"
        assert f"permissions violation for {kind} to \"{subject.lower()}\"" in refusal, refusal

    async def assert_allowed(self, subject: str) -> None:
        await self.nc.publish(subject, b"\x80")
        await self.nc.flush()
        assert self.errors.empty(), f"{subject}: {self.errors.get_nowait()}"


@pytest.mark.parametrize("stages", [[], ["--stages"]], ids=["one-stage", "two-stages"])
async def test_a_secure_cluster_runs_wordcount_exactly(secure_cluster, security_dir, tmp_path, stages):
    """Two stages: each stage's own credential reaches the app's intermediate stream."""
    source = os.path.join(EXAMPLES, "data", "sample.txt")
    output = tmp_path / "counts.jsonl"
    async with Client(secure_cluster.url, timeout=60, security=security_dir.security("client")) as client:
        app_id = await client.submit(pack(os.path.join(EXAMPLES, "wordcount.py")),
                                     ["--input", source, "--output", str(output), *stages])
        final = await client.wait(app_id, timeout=120)
    assert final.state == AppState.SUCCEEDED, final.error
    assert len(final.stage_apps) == (2 if stages else 0)
    with open(source, encoding="utf-8") as f:
        expected = collections.Counter(f.read().split())
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert {r["word"]: r["count"] for r in rows} == expected and len(rows) == len(expected)


async def test_connections_without_a_valid_credential_are_refused(shared_secure_cluster, shared_security_dir,
                                                                  tmp_path):
    url, security_dir = shared_secure_cluster.url, shared_security_dir
    tls_only = Security(tls_ca=os.path.join(security_dir.path, "ca.pem"),
                        tls_cert=os.path.join(security_dir.path, "client-cert.pem"),
                        tls_key=os.path.join(security_dir.path, "client-key.pem"))
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(url, allow_reconnect=False, connect_timeout=5, **tls_only.nats_options())
    stranger = init(str(tmp_path / "another"), tls=False).security("client")  # a valid JWT of another operator
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(url, allow_reconnect=False, connect_timeout=5,
                           **tls_only.with_credential(stranger.credential).nats_options())
    with pytest.raises(ConnectionError, match="refused no credential .pass --creds.: 'Authorization Violation'"):
        async with Client(url, timeout=5, security=tls_only):
            pass
    untrusted = init(str(tmp_path / "other-ca"), tls=True).security("client")
    with pytest.raises(ConnectionError, match="is not trusted: certificate signature failure .--tls-ca"):
        async with Client(url, timeout=5, security=untrusted):
            pass


async def test_an_expired_server_certificate_is_a_clear_error(tmp_path):
    expired = init(str(tmp_path / "expired"), tls=True, cert_days=-1)
    with LocalCluster(workers=0, log_dir=str(tmp_path / "logs"), masters=0, security=expired) as cluster:
        with pytest.raises(ConnectionError, match="is not trusted: certificate has expired .renew it"):
            async with Client(cluster.url, timeout=5, security=expired.security("client")):
                pass


@pytest.mark.parametrize("identity, forbidden", [
    ("client", [("publish", "worker.worker-0.launch"), ("publish", "worker.worker-0.app.1.shutdown"),
                ("publish", "master.worker.register"), ("publish", "master.app.1.register"),
                ("publish", "master.app.1.heartbeat"), ("publish", "appmaster.1.executor.register"),
                ("publish", "executor.1.0.control"), ("publish", "data.1.0.0"), ("publish", "credit.1.0.0"),
                ("publish", "$KV.gearbus_state.apps.1"), ("publish", "$KV.gearbus_masters.leader"),
                ("publish", "$KV.gearbus_checkpoints.app1.latest"), ("publish", "$JS.API.STREAM.DELETE.KV_gearbus_state"),
                ("subscribe", "worker.*.launch"), ("subscribe", "data.>"), ("subscribe", "master.>"),
                ("subscribe", "_INBOX.>")]),
    ("master", [("publish", "data.1.0.0"), ("publish", "credit.1.0.0"), ("publish", "executor.1.0.control"),
                ("publish", "appmaster.1.executor.register"), ("publish", "$KV.gearbus_checkpoints.app1.latest"),
                ("subscribe", "data.>"), ("subscribe", "worker.*.launch"), ("subscribe", "_INBOX.client.>")]),
    ("dashboard", [("publish", "app.submit"), ("publish", "worker.worker-0.launch"), ("publish", "data.1.0.0"),
                   ("publish", "master.app.1.state"), ("publish", "$KV.gearbus_state.apps.1"),
                   ("subscribe", "app.*.state"), ("subscribe", "_INBOX.client.>")]),
    ("worker", [("publish", "app.submit"), ("publish", "app.kill"), ("publish", "worker.worker-0.launch"),
                ("publish", "master.app.1.register"), ("publish", "master.app.1.executor.launch"),
                ("publish", "executor.1.0.control"), ("publish", "data.1.0.0"),
                ("publish", "$KV.gearbus_state.workers.worker-0"), ("publish", "$JS.API.STREAM.PURGE.KV_gearbus_state"),
                ("subscribe", "data.>"), ("subscribe", "app.submit")]),
    ("app7", [("publish", "app.submit"), ("publish", "worker.worker-0.launch"), ("publish", "master.app.1.register"),
              ("publish", "master.app.1.heartbeat"), ("publish", "master.app.1.executor.launch"),
              ("publish", "appmaster.1.executor.register"), ("publish", "executor.1.0.control"),
              ("publish", "data.1.0.0"), ("publish", "credit.1.0.0"), ("publish", "worker.worker-0.app.1.shutdown"),
              ("publish", "master.worker.heartbeat"), ("publish", "$KV.gearbus_state.apps.7"),
              ("publish", "$KV.gearbus_checkpoints.app1.latest"), ("publish", "$O.gearbus_checkpoints_app1.M.eA"),
              ("publish", "$JS.API.STREAM.PURGE.OBJ_gearbus_checkpoints_app1"),
              ("publish", "$JS.API.STREAM.DELETE.OBJ_gearbus_checkpoints_app7"),
              ("subscribe", "data.1.>"), ("subscribe", "appmaster.1.>"), ("subscribe", "_INBOX.client.>")]),
])
async def test_each_identity_is_refused_what_it_must_not_do(shared_secure_cluster, shared_security_dir, identity,
                                                           forbidden):
    cluster, security_dir = shared_secure_cluster, shared_security_dir
    security = app_security(security_dir, 7) if identity == "app7" else security_dir.security(identity)
    allowed = {"client": "app.list", "dashboard": "app.status", "worker": "master.worker.heartbeat",
               "master": "app.7.state", "app7": "data.7.0.0"}[identity]
    server_log = os.path.join(cluster.log_dir, "nats-server.log")
    logged_before = os.path.getsize(server_log)  # the shared server's log: only what this test made counts
    connection = await Connection.open(cluster.url, security)
    try:
        for action, subject in forbidden:
            await connection.assert_refused(action, subject)
        await connection.assert_allowed(allowed)  # the identity works: the refusals are its permissions
    finally:
        await connection.nc.close()
    async with Client(cluster.url, timeout=30, security=security_dir.security("client")) as client:
        assert await client.list() == []  # nothing happened in the cluster
    assert cluster.processes() == []
    with open(server_log, encoding="utf-8") as log:
        log.seek(logged_before)
        logged = log.read()
    for action, subject in forbidden:  # and the server logged each refusal
        assert f'{"Publish" if action == "publish" else "Subscription"} Violation - Subject "{subject}"' in logged


async def test_an_app_credential_speaks_only_for_its_own_app(shared_secure_cluster, shared_security_dir):
    """Its subjects are its own; a message on them naming another app is refused too."""
    async with Client(shared_secure_cluster.url, timeout=30, security=app_security(shared_security_dir, 7)) \
            as app7:
        with pytest.raises(RemoteError) as other_app:
            await app7.bus.request(subjects.resource_request(7), RequestResource(8, 1), timeout=10, retry_s=30)
        assert other_app.value.code == ErrorCode.BAD_REQUEST and "app 8" in other_app.value.message
        with pytest.raises(RemoteError) as unknown:
            await app7.bus.request(subjects.resource_request(7), RequestResource(7, 1), timeout=10, retry_s=30)
        assert unknown.value.code == ErrorCode.NOT_FOUND  # its own subject is served: there is no app 7


async def test_nobody_without_a_master_identity_makes_a_process_run_code(secure_cluster, security_dir, tmp_path):
    marker = tmp_path / "ran"
    artifact = pack(MARKER_APP)
    launch = LaunchExecutor(app_id=1, executor_id=-1, kind=ExecutorKind.APPMASTER, artifact=artifact.name,
                            entry=artifact.entry, args=["--marker", str(marker)])
    async with Client(secure_cluster.url, timeout=60, security=security_dir.security("client")) as client:
        await client.upload(artifact)  # a client may put an artifact; only a submission runs it

        with pytest.raises(nats.errors.Error, match="Authorization Violation"):  # no credential: no connection
            await nats.connect(secure_cluster.url, allow_reconnect=False, connect_timeout=5,
                               **Security(tls_ca=os.path.join(security_dir.path, "ca.pem"),
                                          tls_cert=os.path.join(security_dir.path, "client-cert.pem"),
                                          tls_key=os.path.join(security_dir.path, "client-key.pem")).nats_options())
        for identity in ("client", "dashboard", "worker", "app1"):  # a launch straight to a worker
            security = app_security(security_dir, 1) if identity == "app1" else security_dir.security(identity)
            connection = await Connection.open(secure_cluster.url, security)
            try:
                for worker in ("worker-0", "worker-1"):
                    await connection.nc.publish(subjects.worker_launch(worker), launch.encode())
                    await connection.nc.flush()
                    assert "permissions violation" in (await connection.refusal()).lower()
            finally:
                await connection.nc.close()
        dashboard = await Connection.open(secure_cluster.url, security_dir.security("dashboard"))
        try:
            submit = SubmitApplication("marker", artifact.name, artifact.entry, args=["--marker", str(marker)])
            await dashboard.nc.publish(subjects.APP_SUBMIT, submit.encode())
            await dashboard.nc.flush()
            assert "permissions violation" in (await dashboard.refusal()).lower()
        finally:
            await dashboard.nc.close()
        assert secure_cluster.processes() == [] and await client.list() == []
        assert not marker.exists()

        app_id = await client.submit(artifact, ["--marker", str(marker)])  # the control: a client's submission runs
        assert (await client.wait(app_id, timeout=60)).state == AppState.SUCCEEDED
    assert marker.exists()


async def test_an_artifact_that_changed_after_the_upload_is_not_run(secure_cluster, security_dir, tmp_path):
    marker = tmp_path / "ran"
    artifact = pack(MARKER_APP)
    async with Client(secure_cluster.url, timeout=60, security=security_dir.security("client")) as client:
        await client.upload(artifact)
        submit = SubmitApplication("marker", artifact.name, artifact.entry, args=["--marker", str(marker)],
                                   artifact_digest=digests.sha256_hex(artifact.data + b"\n# changed"))
        with pytest.raises(RemoteError) as changed:
            await client._request(subjects.APP_SUBMIT, submit, timeout=30, idempotent=False)
    assert changed.value.code == ErrorCode.BAD_REQUEST and "changed after the upload" in changed.value.message
    assert not marker.exists()


@pytest.mark.parametrize("args, message", [
    (["--creds", "/no/such.creds"], "--creds /no/such.creds: no such file"),
    (["--creds", os.path.join(REPO, "README.md")], "neither a NATS credentials file (.creds) nor a user nkey seed"),
    (["--tls-ca", "/no/ca.pem"], "--tls-ca /no/ca.pem: no such file"),
    (["--tls-cert", os.path.join(REPO, "README.md")], "--tls-cert and --tls-key go together"),
])
@pytest.mark.parametrize("command", [["-m", "services.worker"], ["-m", "services.master"],
                                     ["-m", "gearbus.cli", "list"], ["-m", "services.dashboard"]])
def test_a_bad_credential_file_is_a_clear_error_before_connecting(command, args, message):
    done = subprocess.run([sys.executable, *command, "--nats", "nats://127.0.0.1:1", *args], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2 and message in done.stderr, done.stderr


COPY_APP = '''
import argparse
from gearbus import Pipeline

def application(args):
    parser = argparse.ArgumentParser(prog="copy")
    parser.add_argument("--creds", default=None)
    parser.add_argument("--output", required=True)
    opts = parser.parse_args(args)
    p = Pipeline("copy")
    p.read_jetstream("ORDERS", until="now", creds=opts.creds, name="orders").write_jsonl(opts.output)
    return p
'''


async def test_a_pipeline_reads_a_stream_of_your_own_with_a_user_made_for_it(secure_cluster, security_dir, tmp_path):
    """`gearbus security user` makes a credential for the data; the JetStream step takes it.
    Without it the step's connection is refused, and says so."""
    done = subprocess.run([sys.executable, "-m", "gearbus.cli", "security", "user", security_dir.path, "orders",
                           "--stream", "ORDERS", "--publish", "orders.>"], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    orders_creds = security_dir.creds("orders")
    orders = security_dir.security("client").with_credential(open(orders_creds).read())
    nc = await nats.connect(secure_cluster.url, **orders.nats_options())
    try:
        js = nc.jetstream()
        await js.add_stream(name="ORDERS", subjects=["orders.>"])
        for n in range(200):
            await js.publish(f"orders.{n % 3}", json.dumps({"order": n}).encode())
        with pytest.raises(nats.errors.Error):  # the data user is no gearbus role
            await nc.request(subjects.APP_LIST, b"", timeout=5)
    finally:
        await nc.close()
    app_file = tmp_path / "copy.py"
    app_file.write_text(COPY_APP)
    async with Client(secure_cluster.url, timeout=60, security=security_dir.security("client")) as client:
        output = tmp_path / "orders.jsonl"
        app_id = await client.submit(pack(str(app_file)), ["--creds", orders_creds, "--output", str(output)])
        final = await client.wait(app_id, timeout=120)
        assert final.state == AppState.SUCCEEDED, final.error
        assert sorted(json.loads(line)["order"] for line in output.read_text().splitlines()) == list(range(200))

        refused = await client.submit(pack(str(app_file)), ["--output", str(tmp_path / "none.jsonl")])
        final = await client.wait(refused, timeout=120)
    assert final.state == AppState.FAILED and "refused no credential" in final.error.message


async def test_a_restart_from_a_savepoint_reads_the_old_apps_store_with_the_new_apps_credential(
        secure_cluster, security_dir, tmp_path):
    """Each app's snapshots are its own; the master lets the app that starts from a
    savepoint read the store of the app that took it, and nothing is lost or repeated."""
    ticks = tmp_path / "ticks.jsonl"
    async with Client(secure_cluster.url, timeout=60, security=security_dir.security("client")) as client, \
            Client(secure_cluster.url, timeout=60, security=security_dir.security("master")) as watcher:
        first = await client.submit(pack(os.path.join(EXAMPLES, "ticker.py")),
                                    ["--output", str(ticks), "--rate", "200"])
        await wait_state(client, first, AppState.ACTIVE)
        await wait_for_ticks(client, ticks, 100, 30, watcher)
        second = (await client.restart(first)).app_id
        await wait_state(client, second, AppState.ACTIVE)
        seen = await wait_for_ticks(client, ticks, max(read_ticks(ticks)) + 100, 30, watcher)
        await client.kill(second)
    assert sorted(seen) == list(range(max(seen) + 1)), "numbers lost or written twice across the restart"


async def test_only_a_credential_the_operator_granted_shell_may_run_one(secure_cluster, security_dir):
    """A shell app runs a command on every worker it names: the client credential may not
    submit one (the server refuses its publish, the master one submitted elsewhere), each
    refused with why; a user made with --allow-shell runs it."""
    async with Client(secure_cluster.url, timeout=30, security=security_dir.security("client")) as client, \
            Client(secure_cluster.url, timeout=30, security=security_dir.security("master")) as watcher:
        await wait_for_cluster(client, lambda info: sum(w.alive for w in info.workers) == 2, watcher=watcher)
        with pytest.raises(RequestError) as refused:
            await client.submit_shell(["touch", "/tmp/never"], ["worker-0"])
        assert refused.value.code == ErrorCode.FORBIDDEN
        assert "may not submit shell apps" in refused.value.message and "--allow-shell" in refused.value.message
        elsewhere = SubmitApplication("sneaky", "", "", args=["true"], app_type=AppType.SHELL, workers=["worker-0"])
        with pytest.raises(RemoteError) as refused:
            await client._request(subjects.APP_SUBMIT, elsewhere, timeout=10, idempotent=False)
        assert refused.value.code == ErrorCode.FORBIDDEN and "submitted on app.submit.shell only" in \
            refused.value.message
        assert await client.list() == []
    add_user(security_dir.path, "ops", allow_shell=True)
    code, out, err = await gearbus("shell", "--nats", secure_cluster.url, *security_dir.role_args("ops"),
                                   "--workers", "worker-1", "--", "echo", "granted")
    assert code == 0 and out == "[worker-1] granted\n", err


def run_master(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "services.master", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO)


def log_events(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


async def test_a_master_the_server_refuses_logs_why_and_exits_with_its_real_code(tmp_path):
    secure = init(str(tmp_path / "security"))
    stranger = init(str(tmp_path / "another"))  # a valid set of another operator
    with LocalCluster(workers=0, masters=0, log_dir=str(tmp_path / "logs"), security=secure) as cluster:
        done = await asyncio.get_running_loop().run_in_executor(
            None, lambda: run_master("--nats", cluster.url, *stranger.role_args("master")))
    events = log_events(done.stderr)
    assert done.returncode == 2, done.stderr
    started = [e for e in events if e["event"] == "service_start_failed"]
    assert len(started) == 1 and "refused the credential of 'master'" in started[0]["error"], done.stderr
    assert [e["exit_code"] for e in events if e["event"] == "service_closed"] == [2], done.stderr
    assert [e for e in events if e["level"] != "info"] == started, done.stderr  # nothing else went wrong


def test_a_master_on_a_secured_cluster_without_an_app_signer_refuses_to_start(security_dir):
    args = security_dir.role_args("master")
    without_signer = args[:args.index("--app-signer")] + args[args.index("--app-signer") + 2:]
    done = run_master("--nats", "nats://127.0.0.1:1", *without_signer)
    assert done.returncode == 2, done.stderr
    assert "--creds is the JWT of user 'master' (a secured cluster)" in done.stderr
    assert "pass --app-signer FILE, the account signing key" in done.stderr
