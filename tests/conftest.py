"""Fixtures: the in-process engine (the cluster's runtime without processes), a real
nats-server on a free port with a temporary JetStream directory, and an embedded cluster
of real master and worker processes."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable

import pytest
import pytest_asyncio

from gearbus.api.dsl import Pipeline
from gearbus.api.graph import Application
from gearbus.client import Client
from gearbus.cluster import LocalCluster
from gearbus.natsserver import NatsServer
from gearbus.planner import plan
from gearbus.runners.inprocess import InProcessEngine
from shared import subjects
from shared.bus import RequestError
from shared.messages import ClusterInfo

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples")
sys.path.insert(0, REPO)


@pytest.fixture
def inprocess() -> Callable[..., InProcessEngine]:
    """Make an in-process engine for a pipeline (planned for the test runner) or an
    application: every rule of the cluster's runtime over an in-memory transport, one
    interleaving per ``seed``; for tests that need no real processes."""

    def make(app: Pipeline | Application, *, seed: int = 0, checkpoint_every: int = 0, epoch: int = 0,
             batch_records: int | None = None) -> InProcessEngine:
        application = plan(app, "test") if isinstance(app, Pipeline) else app
        return InProcessEngine(application, batch_records, checkpoint_every, epoch, seed)

    return make


@pytest.fixture
def nats_server(tmp_path):
    server = NatsServer(store_dir=str(tmp_path / "jetstream"), log_path=str(tmp_path / "nats-server.log"))
    os.makedirs(server.store_dir, exist_ok=True)
    with server:
        yield server


async def wait_until(client: Client, subject: str, probe: Callable[[], Awaitable], timeout: float = 30.0,
                     watcher: Client | None = None):
    """Return the first truthy ``await probe()``, asking again each time a message
    arrives on ``subject`` (a heartbeat or state event says something may have changed).
    ``watcher``: the connection that may subscribe to ``subject`` (on a secure cluster a
    client may not), else ``client``'s."""
    woken = asyncio.Event()

    async def wake(msg):
        woken.set()

    sub = await (watcher or client).bus.nc.subscribe(subject, cb=wake)
    try:
        async with asyncio.timeout(timeout):
            while True:
                woken.clear()
                result = await probe()
                if result:
                    return result
                await woken.wait()
    finally:
        await sub.unsubscribe()


async def wait_for_cluster(client: Client, ready: Callable[[ClusterInfo], bool], timeout: float = 30.0,
                           watcher: Client | None = None) -> None:
    """Return once ``ready(info)`` holds for the master's ClusterInfo (asked again on
    each worker heartbeat, which a worker sends only once registered)."""

    async def probe():
        return ready(await client.info())

    await wait_until(client, subjects.WORKER_HEARTBEAT, probe, timeout, watcher)


async def wait_for_workers(client: Client, count: int, timeout: float = 30.0) -> None:
    """Return once the master lists ``count`` live workers."""
    await wait_for_cluster(client, lambda info: sum(w.alive for w in info.workers) >= count, timeout)


@pytest.fixture
def cluster_factory(nats_server, tmp_path):
    """Start embedded clusters on the test's nats-server; all are stopped at the end."""
    started: list[LocalCluster] = []

    def make(workers: int = 2, slots: int = 4) -> LocalCluster:
        cluster = LocalCluster(workers=workers, slots=slots, log_dir=str(tmp_path / f"logs{len(started)}"),
                               nats=nats_server)
        started.append(cluster.start())
        return cluster

    yield make
    for cluster in started:
        cluster.stop()


@pytest_asyncio.fixture
async def cluster(cluster_factory):
    """Two workers with four slots each, registered and ready."""
    made = cluster_factory(workers=2, slots=4)
    async with Client(made.url, timeout=30) as client:
        try:
            await wait_for_workers(client, 2)
        except (TimeoutError, RequestError):
            raise AssertionError(f"the cluster did not come up:\n{made.logs_tail()}") from None
    return made


@pytest_asyncio.fixture
async def client(cluster):
    async with Client(cluster.url, timeout=30) as c:
        yield c
