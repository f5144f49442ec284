"""Runners: one pipeline, several places to run it (Samza's ApplicationRunner idea).

- TestRunner: in this process, no NATS; the cluster's runtime, deterministic per seed; for users' unit tests.
- LocalRunner: an embedded cluster (nats-server, master, workers) on this machine.
- ClusterRunner: an existing cluster, by NATS URL.

Each has a blocking ``run()``; Local and Cluster runners also have async ``start()``,
``status()``, ``wait()`` and ``stop()`` for embedding in another asyncio program.
"""

from __future__ import annotations

import asyncio
import copy
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from gearbus.api.dsl import BasePipeline
from gearbus.api.graph import Application, GraphError
from gearbus.api.task import TaskContext
from gearbus.artifact import Artifact, load_local, load_pipeline as load_pipeline_file, pack
from gearbus.client import Client
from gearbus.cluster import LocalCluster
from gearbus.control.config import AppConfig
from gearbus.connectors import intermediate
from gearbus.connectors.jetstream import JetStreamError, on_connection
from gearbus.planner import plan
from gearbus.security import init as init_security
from gearbus.runners.inprocess import InProcessEngine, PipelineFailed
from gearbus.stages import stream_specs
from shared.messages import AppError, AppState, AppSummary
from shared.security import Security


@dataclass
class RunResult:
    """How a run ended: the state and, when it did not succeed, the error."""

    state: str
    app_id: int = 0
    error: AppError | None = None
    name: str = ""

    @property
    def succeeded(self) -> bool:
        return self.state == AppState.SUCCEEDED


class TestRunner:
    """Runs a pipeline (or an app file) in this process."""

    __test__ = False  # not a pytest test class

    def __init__(self, seed: int = 0):
        """``seed``: which of the interleavings the cluster could take this run takes."""
        self.seed = seed

    def run(self, app: BasePipeline | Application | str, args: Sequence[str] = (), raise_on_failure: bool = True) -> RunResult:
        """Run to the end. Sources read batches of the app's ``batch_records`` (as the
        executors do), so watermarks advance at the same points as on the bus."""
        application = _resolve(app, args, "test")
        try:
            InProcessEngine(application, seed=self.seed).run()
        except PipelineFailed as failure:
            if raise_on_failure:
                raise
            return RunResult(AppState.FAILED, error=failure.error, name=application.name)
        return RunResult(AppState.SUCCEEDED, name=application.name)


def load_pipeline(app: BasePipeline | str, args: Sequence[str] = ()) -> BasePipeline:
    """A Pipeline object as it is, or the one an app file builds from ``args``."""
    return app if isinstance(app, BasePipeline) else load_pipeline_file(app, list(args))


def _resolve(app, args, runner: str) -> Application:
    if isinstance(app, BasePipeline):
        application = plan(app, runner)
    elif isinstance(app, Application):
        application = app
    else:
        application = load_local(app, list(args), runner)
    return application


class ClusterRunner:
    """Submits to a running cluster (Samza's RemoteApplicationRunner: run, status, kill)."""

    def __init__(self, nats_url: str | Sequence[str], request_timeout: float = 30.0, security: Security = Security()):
        self.nats_url = nats_url
        self.request_timeout = request_timeout
        self.security = security
        self.client: Client | None = None
        self.app_id: int | None = None

    async def start(self, app_path: str, args: Sequence[str] = (), config: dict | None = None) -> int:
        """Check the app locally, submit it and return its id without waiting."""
        artifact, name = prepare(app_path, args, "cluster", self.nats_url, config)
        self.client = Client(self.nats_url, timeout=self.request_timeout, security=self.security)
        await self.client.__aenter__()
        self.app_id = await self.client.submit(artifact, args, name=name, config=config)
        return self.app_id

    async def status(self) -> AppSummary:
        return await self.client.status(self.app_id)

    async def wait(self, timeout: float | None = None, seen: dict[str, float] | None = None) -> AppSummary:
        return await self.client.wait(self.app_id, timeout=timeout, seen=seen)

    async def kill(self) -> None:
        await self.client.kill(self.app_id)

    async def stop(self) -> None:
        """Kill the app if it still runs, and disconnect."""
        if self.client is None:
            return
        try:
            if self.app_id is not None and (await self.status()).state not in AppState.TERMINAL:
                await self.kill()
        finally:
            await self.client.__aexit__(None, None, None)
            self.client = None

    def run(self, app_path: str, args: Sequence[str] = (), timeout: float | None = None) -> RunResult:
        return asyncio.run(self._run(app_path, args, timeout))

    async def _run(self, app_path, args, timeout) -> RunResult:
        try:
            await self.start(app_path, args)
            final = await self.wait(timeout)
        finally:
            await self.stop()
        return RunResult(final.state, final.app_id, final.error, final.name)


class LocalRunner(ClusterRunner):
    """Starts an embedded cluster, runs the app on it, and tears the cluster down."""

    def __init__(self, workers: int = 2, slots: int = 4, log_dir: str | None = None, secure: bool = False):
        """``secure``: every role with its own credential and TLS, from a `gearbus security
        init` directory made for this run (and removed with the cluster)."""
        self.security_dir = init_security(tempfile.mkdtemp(prefix="gearbus-security-"), tls=True) if secure else None
        super().__init__("", security=self.security_dir.security("client") if secure else Security())
        self.cluster = LocalCluster(workers=workers, slots=slots, log_dir=log_dir, security=self.security_dir)

    def role_security(self, role: str) -> Security:
        """What another process of this run (the dashboard) connects with."""
        return self.security_dir.security(role) if self.security_dir else Security()

    async def start(self, app_path: str, args: Sequence[str] = (), config: dict | None = None) -> int:
        prepare(app_path, args, "local", config=config)  # fail on a bad app before starting any process
        self.cluster.start()
        self.nats_url = self.cluster.url
        try:
            return await super().start(app_path, args, config)
        except BaseException:
            self.cluster.stop()
            raise

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            await asyncio.get_running_loop().run_in_executor(None, self.cluster.stop)
            if self.security_dir:
                shutil.rmtree(self.security_dir.path, ignore_errors=True)


def prepare(app_path: str, args: Sequence[str], runner: str, servers: str | Sequence[str] | None = None,
            config: dict | None = None) -> tuple[Artifact, str]:
    """Build and plan the app here first, so a bad file, bad arguments, a step the runner
    cannot run, a bad config (the app's with the submission's ``config`` over it), or
    (with the cluster's ``servers``) a stream that does not exist are reported before
    anything is submitted."""
    app = load_local(app_path, list(args), runner)
    if config:
        AppConfig.parse({**app.config, **config})
    if servers:
        servers = [servers] if isinstance(servers, str) else list(servers)
        check_sources(app, servers)
        check_streams(app, servers)
    return pack(app_path), app.name


def check_streams(app: Application, servers: list[str]) -> None:
    """The app's intermediate streams are free to take: none is a stream of something else.
    Where this machine cannot look (a secured cluster's client may not read streams), the
    master checks it when the app starts, and fails it before any stage runs."""
    specs = stream_specs(app)
    if not specs:
        return

    async def check(nc) -> None:
        for spec in specs:
            info = await intermediate.existing(nc, spec.name)
            try:
                if info is not None:
                    intermediate.refuse_taken(spec.name, info, app.name)
            except intermediate.StreamTaken as exc:
                raise GraphError(f"step {spec.edge!r}: {exc}") from None

    try:
        on_connection(servers, check, name="gearbus-submit")
    except JetStreamError:
        return


def check_sources(app: Application, servers: list[str]) -> None:
    """Open (and close) the first task of every source that can be checked from here."""
    for processor in app.graph.processors:
        source = processor.data_source
        if source is None or not source.checked_at_submit:
            continue
        probe = copy.deepcopy(source)
        try:
            probe.open(TaskContext(0, app.name, processor, 0, 0, nats_servers=servers))
        except Exception as exc:
            step = (processor.config.get("steps") or [processor.name])[0]
            raise GraphError(f"step {step!r}: {exc}") from None
        finally:
            probe.close()


__all__ = ["ClusterRunner", "LocalRunner", "PipelineFailed", "RunResult", "TestRunner", "prepare"]
