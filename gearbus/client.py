"""The Python client of a gearbus cluster: upload, submit, status, list, kill, info, wait."""

from __future__ import annotations

import asyncio
import getpass
import os
from collections.abc import Sequence

import nats.js.errors

from gearbus.artifact import Artifact
from shared import digests, subjects
from shared.bus import Bus, RequestError, RequestTimeout
from shared.messages import (
    AppType,
    ErrorCode,
    ReadShellOutput,
    ShellOutput,
    ApplicationList,
    ApplicationRestarted,
    ApplicationStateChanged,
    ApplicationStatus,
    AppRescaled,
    AppState,
    AppStimuli,
    AppSummary,
    ClusterInfo,
    KillApplication,
    ListApplications,
    LogChunk,
    LogsReply,
    MetricsHistory,
    QueryApplication,
    QueryCluster,
    QueryLogs,
    QueryMetricsHistory,
    QueryState,
    QueryStimuli,
    ProcessorReplaced,
    ReplaceProcessor,
    RescaleApplication,
    RestartApplication,
    SavepointTaken,
    StateValue,
    SubmitApplication,
    SubmitApplicationResult,
    TakeSavepoint,
    decode,
)
from shared.security import Security

SUBMIT_TIMEOUT_S = 180.0  # the master may wait 60 s for a slot, then 60 s for the AppMaster
STATE_TIMEOUT_S = 20.0  # the master allows the AppMaster 15 s (it asks the task's executor)
RESCALE_TIMEOUT_S = 610.0  # the master allows the AppMaster 600 s
SAVEPOINT_TIMEOUT_S = 130.0  # the master allows the AppMaster 120 s (a checkpoint, then copying its state)
QUERY_ATTEMPT_S = 5.0  # a status/list/info/kill not answered this fast is asked again
#: A NATS URL that accepts no connection this fast is an error, and so is one whose server does not
#: greet this fast (a NATS server greets at once): with the interpreter's start-up (1-2 s on a busy
#: machine) a command reports it within the 5 s it promises.
REACHABLE_WITHIN_S = 1.5


class Client:
    def __init__(self, servers: str | Sequence[str], timeout: float = 10.0, security: Security = Security(),
                 connect_timeout: float | None = None):
        """``connect_timeout``: wait that long for NATS, retrying (a long-running service);
        by default an unreachable URL is an error at once (a command)."""
        self.bus = Bus(servers, name="gearbus-client", security=security)
        self.timeout = timeout
        self.connect_timeout = connect_timeout

    async def __aenter__(self) -> Client:
        await self.bus.connect(reachable_within=REACHABLE_WITHIN_S, patience_s=self.connect_timeout)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.bus.close()

    async def _request(self, subject, message, expect=(), timeout: float | None = None, idempotent: bool = True):
        """A request to the master, retried while no master answers (fail-over); a query
        is also asked again when a reply does not come within a few seconds."""
        attempt = timeout or (min(QUERY_ATTEMPT_S, self.timeout) if idempotent else self.timeout)
        return await self.bus.request(subject, message, attempt, expect=expect, retry_s=self.timeout,
                                      idempotent=idempotent)

    async def upload(self, artifact: Artifact) -> str:
        """Put the artifact in the object store unless an identical one is there. The masters
        create the store (a client may not: it can only put artifacts), so on a cluster that
        is starting this waits for it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while True:
            try:
                store = await self.bus.js.object_store(subjects.ARTIFACT_BUCKET)
                break
            except nats.js.errors.BucketNotFoundError:
                if loop.time() > deadline:
                    raise RequestTimeout(f"no {subjects.ARTIFACT_BUCKET} object store after {self.timeout:g} s: "
                                         "is a gearbus master running?") from None
                await asyncio.sleep(0.2)
        try:
            await store.get_info(artifact.name)
        except nats.js.errors.NotFoundError:
            await store.put(artifact.name, artifact.data)
        return artifact.name

    async def submit(self, artifact: Artifact, args: Sequence[str] = (), name: str = "", config: dict | None = None,
                     priority: int = 0) -> int:
        """Submit the app; its relative file paths mean paths in this process's working
        directory, as when it was built here (gearbus/api/paths.py)."""
        await self.upload(artifact)
        message = SubmitApplication(
            name=name or artifact.entry, artifact=artifact.name, entry=artifact.entry,
            artifact_kind=artifact.kind, args=list(args), user=getpass.getuser(), priority=priority,
            config=dict(config or {}), artifact_digest=digests.sha256_hex(artifact.data),
            submitter_dir=os.getcwd(),
        )
        result = await self._request(subjects.APP_SUBMIT, message, SubmitApplicationResult, SUBMIT_TIMEOUT_S,
                                     idempotent=False)
        return result.app_id

    async def submit_shell(self, argv: Sequence[str], workers: Sequence[str], timeout_s: float = 0.0,
                           name: str = "") -> int:
        """Run ``argv`` (no shell reads it) once on each of ``workers`` as a shell app; its id.
        On a secured cluster only a credential the operator granted shell may (RequestError
        ``forbidden`` otherwise, saying so)."""
        message = SubmitApplication(name=name or f"shell {argv[0]}", artifact="", entry="", args=list(argv),
                                    user=getpass.getuser(), config={"timeout_s": timeout_s} if timeout_s else {},
                                    app_type=AppType.SHELL, workers=list(workers))
        try:
            result = await self._request(subjects.APP_SUBMIT_SHELL, message, SubmitApplicationResult,
                                         SUBMIT_TIMEOUT_S, idempotent=False)
        except RequestError as exc:
            if exc.code != ErrorCode.FORBIDDEN:
                raise
            raise RequestError(exc.code, f"this credential may not submit shell apps: {exc.message}; the operator "
                                         "grants it with `gearbus security user DIR NAME --allow-shell`") from None
        return result.app_id

    async def shell_output(self, app_id: int, offsets: dict[str, int] | None = None,
                           wait_s: float = 0.0) -> ShellOutput:
        """A shell app's lines per worker from ``offsets`` (per worker: the ``next_line`` of the
        last answer) on, and how each command ended; with ``wait_s``, the answer waits up to
        that long for something new."""
        return await self._request(subjects.APP_SHELL_OUTPUT,
                                   ReadShellOutput(app_id, dict(offsets or {}), int(wait_s * 1000)), ShellOutput,
                                   wait_s + QUERY_ATTEMPT_S + 5)

    async def status(self, app_id: int) -> AppSummary:
        reply = await self._request(subjects.APP_STATUS, QueryApplication(app_id), ApplicationStatus)
        return reply.app

    async def list(self, include_finished: bool = True) -> list[AppSummary]:
        reply = await self._request(subjects.APP_LIST, ListApplications(include_finished), ApplicationList)
        return reply.apps

    async def kill(self, app_id: int) -> None:
        await self._request(subjects.APP_KILL, KillApplication(app_id))

    async def savepoint(self, app_id: int, name: str = "", stop: bool = False) -> SavepointTaken:
        """Write a named checkpoint of a running app (and end it, with ``stop``)."""
        return await self._request(subjects.APP_SAVEPOINT, TakeSavepoint(app_id, name, stop), SavepointTaken,
                                   SAVEPOINT_TIMEOUT_S, idempotent=False)

    async def state(self, app_id: int, step: str, key: str) -> StateValue:
        """What keyed step ``step`` of a running app holds for ``key`` (JSON), read from the
        task that owns the key while the app runs."""
        return await self._request(subjects.APP_STATE, QueryState(app_id, step, key), StateValue, STATE_TIMEOUT_S)

    async def rescale(self, app_id: int, parallelism: dict[str, int]) -> AppRescaled:
        """Run steps of a running app at another parallelism (``{step: n}``), while it runs;
        the answer comes once the tasks run at it."""
        return await self._request(subjects.APP_RESCALE, RescaleApplication(app_id, dict(parallelism)), AppRescaled,
                                   RESCALE_TIMEOUT_S, idempotent=False)

    async def replace(self, app_id: int, step: str, artifact: Artifact, args: Sequence[str] = (),
                      drop_state: bool = False, at_ms: int = 0) -> ProcessorReplaced:
        """Run the processor holding ``step`` with the code of the processor holding it in
        ``artifact`` (uploaded first) while the app runs, for records of event time
        ``at_ms`` on (0: from the next checkpoint); the answer comes once the new code took
        a checkpoint (new code failing before that is rolled back: RequestError)."""
        await self.upload(artifact)
        message = ReplaceProcessor(app_id, step, artifact.name, artifact.entry, artifact.kind, list(args), drop_state,
                                   digests.sha256_hex(artifact.data), at_ms, submitter_dir=os.getcwd())
        return await self._request(subjects.APP_REPLACE, message, ProcessorReplaced, RESCALE_TIMEOUT_S,
                                   idempotent=False)

    async def stimuli(self, app_id: int) -> AppStimuli:
        """A running app's AppMaster's stimulus log: its state machine's last events, each
        with what it decided."""
        return await self._request(subjects.APP_DEBUG, QueryStimuli(app_id), AppStimuli)

    async def metrics_history(self, app_id: int) -> MetricsHistory:
        """A running app's processors' figures over the last 15 minutes, as its AppMaster kept them."""
        return await self._request(subjects.APP_METRICS_HISTORY, QueryMetricsHistory(app_id), MetricsHistory)

    async def restart(self, app_id: int) -> ApplicationRestarted:
        """Submit the app again (a running one continues from a savepoint); the new app's id."""
        return await self._request(subjects.APP_RESTART, RestartApplication(app_id), ApplicationRestarted,
                                   SAVEPOINT_TIMEOUT_S + SUBMIT_TIMEOUT_S, idempotent=False)

    async def logs(self, app_id: int, executor_id: int | None = None, offsets: dict[str, int] | None = None,
                   timeout: float = 3.0) -> list[LogChunk]:
        """What the app's processes wrote (stdout and stderr), gathered from every live worker,
        from ``offsets`` on (per log name: pass ``chunk.offset + len(chunk.text.encode())`` to
        read on)."""
        workers = sum(w.alive for w in (await self.info()).workers)
        replies = await self.bus.gather(subjects.LOGS_QUERY, QueryLogs(app_id, executor_id, dict(offsets or {})),
                                        LogsReply, workers, timeout)
        return sorted((chunk for reply in replies for chunk in reply.chunks), key=lambda c: c.name)

    async def info(self) -> ClusterInfo:
        return await self._request(subjects.MASTER_INFO, QueryCluster(), ClusterInfo)

    async def wait(self, app_id: int, timeout: float | None = None,
                   seen: dict[str, float] | None = None) -> AppSummary:
        """Wait until the app reaches a terminal state; return its final summary.

        ``seen``, when given, gets the monotonic time at which each state was observed.
        """
        ended = asyncio.Event()
        loop = asyncio.get_running_loop()
        seen = {} if seen is None else seen

        async def on_event(msg):
            try:
                event = decode(msg.data, (ApplicationStateChanged,))
            except ValueError:
                return
            seen.setdefault(event.state, loop.time())
            if event.state in AppState.TERMINAL:
                ended.set()

        sub = await self.bus.nc.subscribe(subjects.app_state_events(app_id), cb=on_event)
        try:
            summary = await self.status(app_id)  # after subscribing, so no change is missed
            if summary.state in AppState.TERMINAL:
                return summary
            await asyncio.wait_for(ended.wait(), timeout)
            return await self.status(app_id)
        finally:
            await sub.unsubscribe()
