"""Fixtures: the in-process engine (the cluster's runtime without processes), a real
nats-server on a free port with a temporary JetStream directory, and an embedded cluster
of real master and worker processes. Also what applies to the whole suite: the markers
each test folder implies and the hypothesis profiles."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import pytest_asyncio
from hypothesis import settings
from xdist.scheduler import LoadGroupScheduling

from gearbus.api.dsl import BasePipeline
from gearbus.api.graph import Application
from gearbus.client import Client
from gearbus.cluster import LocalCluster
from gearbus.natsserver import NatsServer
from gearbus.planner import plan
from gearbus.runners.inprocess import InProcessEngine
from shared.bus import RequestError
from tests.support.cluster import wait_for_workers
from tests.support.fuzzing import FULL_PROFILE, QUICK_PROFILE

TESTS = Path(__file__).parent
FOLDER_MARKERS = {"unit", "integration", "chaos"}

settings.register_profile(FULL_PROFILE, deadline=None)
settings.register_profile(QUICK_PROFILE, deadline=None)
settings.load_profile(FULL_PROFILE if os.environ.get("CI") else QUICK_PROFILE)


#: The files that take longest (measured in .ci/run's two workers, 30 s or more), run
#: first, so that no long test is left running alone at the end (.ci/run hands the tests
#: out one at a time in this order, the Spark tests as one unit: --dist loadgroup with
#: SparkOnOneWorker, and --no-loadscope-reorder). The CLI's file, whose tests time
#: commands, goes first beside the fuzzing (one core), before any Spark file starts a JVM.
SLOWEST_FILES = [
    "integration/test_cli.py", "unit/test_fuzz_decoders.py", "integration/test_spark_jetstream.py",
    "chaos/test_exactly_once.py", "integration/test_spark_joins.py", "integration/test_nexmark_recovery.py",
    "integration/test_spark_runner.py", "integration/test_backfill.py", "integration/test_recovery.py",
    "chaos/test_files_exactly_once.py", "integration/test_security.py", "integration/test_cluster.py",
    "integration/test_nexmark.py", "integration/test_examples.py", "integration/test_nats_cluster.py",
    "integration/test_dashboard_browser.py", "integration/test_state_query.py",
]
assert all((TESTS / name).is_file() for name in SLOWEST_FILES), "SLOWEST_FILES names a file that is gone"


#: The files of the Spark tests (marked ``spark``): one worker runs them all, in one JVM.
SPARK_FILES = {
    "integration/test_backfill.py", "integration/test_nexmark_spark.py", "integration/test_spark_jetstream.py",
    "integration/test_spark_jetstream_pipeline.py", "integration/test_spark_joins.py", "integration/test_spark_runner.py",
}


#: Files whose tests share one cluster (a module-scoped fixture): one worker runs each such file whole.
SHARED_CLUSTER_FILES = {"integration/test_config_at_submit.py", "integration/test_dsl_cluster.py",
                        "integration/test_jetstream_before_data.py", "integration/test_paths.py",
                        "integration/test_raw_protocol.py", "integration/test_security.py", "integration/test_shell.py",
                        "integration/test_stages.py"}


class SparkOnOneWorker(LoadGroupScheduling):
    """.ci/run's ``--dist loadgroup``, with every Spark test in one group: xdist 3.8 groups
    tests by suffixing their node ids, which pytest 9.2's structured ids no longer take
    (pytest-xdist#1386), so each Spark test went to whichever worker was free and both
    started a JVM. This picks the group by file instead (and keeps each of
    SHARED_CLUSTER_FILES on one worker, with the cluster its tests share)."""

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::")[0].removeprefix("tests/")
        if path in SHARED_CLUSTER_FILES:
            return path
        return "spark" if path in SPARK_FILES else super()._split_scope(nodeid)


def pytest_xdist_make_scheduler(config, log):
    return SparkOnOneWorker(config, log) if config.getvalue("dist") == "loadgroup" else None


def pytest_collection_modifyitems(config, items):
    """Mark each test by its folder: tests/unit -> unit, tests/integration -> integration,
    tests/chaos -> chaos; run the slowest files first (the rest keep their order)."""
    for item in items:
        path = item.path.relative_to(TESTS)
        if path.parts[0] in FOLDER_MARKERS:
            item.add_marker(path.parts[0])
        assert (path.as_posix() in SPARK_FILES) == bool(item.get_closest_marker("spark")), \
            f"{item.nodeid}: a Spark test goes in a file of SPARK_FILES, and only Spark tests do"
    rank = {name: n for n, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(TESTS).as_posix(), len(rank)))


@pytest.fixture
def inprocess() -> Callable[..., InProcessEngine]:
    """Make an in-process engine for a pipeline (planned for the test runner) or an
    application: every rule of the cluster's runtime over an in-memory transport, one
    interleaving per ``seed``; for tests that need no real processes."""

    def make(app: BasePipeline | Application, *, seed: int = 0, checkpoint_every: int = 0, epoch: int = 0,
             batch_records: int | None = None) -> InProcessEngine:
        application = plan(app, "test") if isinstance(app, BasePipeline) else app
        return InProcessEngine(application, batch_records, checkpoint_every, epoch, seed)

    return make


@pytest.fixture
def backends():
    """State backends a test opens: closed, their files removed, after it."""
    with contextlib.ExitStack() as stack:
        yield stack


@pytest.fixture
def nats_server(tmp_path):
    server = NatsServer(store_dir=str(tmp_path / "jetstream"), log_path=str(tmp_path / "nats-server.log"))
    os.makedirs(server.store_dir, exist_ok=True)
    with server:
        yield server


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


async def until_registered(made: LocalCluster) -> LocalCluster:
    """``made``, once every one of its workers is registered."""
    async with Client(made.url, timeout=30) as client:
        try:
            await wait_for_workers(client, made.num_workers)
        except (TimeoutError, RequestError):
            raise AssertionError(f"the cluster did not come up:\n{made.logs_tail()}") from None
    return made


@pytest_asyncio.fixture
async def cluster(cluster_factory):
    """Two workers with four slots each, registered and ready."""
    return await until_registered(cluster_factory(workers=2, slots=4))


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory):
    """Two workers with four slots each, registered and ready, shared by the tests of a file
    that each leave it as they found it (the file goes in SHARED_CLUSTER_FILES): a cluster
    of their own cost each ~2.5 s of start-up and stop."""
    with LocalCluster(workers=2, slots=4, log_dir=str(tmp_path_factory.mktemp("shared-cluster"))) as made:
        yield asyncio.run(until_registered(made))


@pytest_asyncio.fixture
async def shared_client(shared_cluster):
    async with Client(shared_cluster.url, timeout=30) as c:
        yield c


@pytest_asyncio.fixture
async def client(cluster):
    async with Client(cluster.url, timeout=30) as c:
        yield c
