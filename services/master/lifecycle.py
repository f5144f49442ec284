"""The master's view of each application's life: a state machine without I/O.

The master's async shell feeds it events (a submission, an AppMaster launched, registered,
heartbeating, exited, a worker lost or back, a state report, a kill, this master taking
office, a tick with the time) and carries out the instructions it returns (launch an
AppMaster, fence one, record a state, stop an app's processes, answer the submitter). It
never reads a clock, sleeps or touches NATS, so every ordering of events is tested
without a network (as the checkpoint coordinator is).

Each app not yet ended is in one phase; ``_ALLOWED`` enforces the moves::

    phase        event                                     -> phase        instructions
    (new)        accepted: recorded, its stores being made ACCEPTED
    ACCEPTED     submitted: its stores are made            LAUNCHING    LaunchAppMaster(attempt 0)
    ACCEPTED     its stores could not be made              ENDED        as a failed launch, below
    ENDED        submitted (it was killed while ACCEPTED)  ENDED
    (new)        submitted                                 LAUNCHING    LaunchAppMaster(attempt 0)
    (new)        took office: app in KV, not ended         UNCONFIRMED  (deadline: grace)
    LAUNCHING    launched on worker W                      REGISTERING  (deadline: register timeout)
    LAUNCHING    launch failed                             ENDED | LAUNCHING   see "lost" below
    REGISTERING  registered                                RUNNING      AnswerSubmission(ok) if waited for
    UNCONFIRMED  registered                                RUNNING
    RUNNING      heartbeat                                 RUNNING      (deadline moves on)
    REGISTERING  deadline passed                           "lost"
    RUNNING      deadline passed, AppMaster exited,        "lost"
    UNCONFIRMED    its worker lost, or its worker came
                   back without it
    any          state report: ended, or kill, or the      ENDED        SetState [+ StopAppProcesses]
                   master ends it (a multi-stage app)

A submission is known here from the moment clients can see its app (``accepted``), not
only once the master has made the app's stores and asks for a slot (``submitted``): a kill
in between ends the app and answers the waiting submitter "killed while starting", and
``submitted`` then launches nothing. (Were the app unknown here meanwhile, the kill would
find nothing to end, and the submission would go on to start the killed app.)

"lost": the AppMaster is gone. During the first launch the submission fails (the
submitter is answered with the reason). Later the old AppMaster is fenced (its worker kills
it, should it still run) and a new one is launched with the next attempt number; it adopts
the running executors and resumes the app from its last completed checkpoint. Past the
app's relaunch budget the app has FAILED.

An app found PENDING in KV when this master takes office was being submitted under the
previous leader: if its AppMaster never registers with this master, the submission was
lost (the submitter got no answer and may submit again), so it fails instead of being
relaunched.

Every AppMaster carries its attempt number (in its launch, registration and heartbeats,
and in the worker's report of its exit): a report from an older attempt than the app's
current one changes nothing, and such an AppMaster's registration is refused ("fenced").
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from shared.messages import AppError, AppState


class Phase(enum.Enum):
    ACCEPTED = "accepted"        # recorded PENDING and visible; its stores are being made, no launch yet
    LAUNCHING = "launching"      # an AppMaster launch is under way (slot, then the worker's answer)
    REGISTERING = "registering"  # launched on a worker; waiting for it to register
    RUNNING = "running"          # registered; heartbeats keep its deadline moving
    UNCONFIRMED = "unconfirmed"  # found in KV by a new leader: its AppMaster must register again
    ENDED = "ended"


_ALLOWED: dict[Phase, frozenset[Phase]] = {
    Phase.ACCEPTED: frozenset({Phase.LAUNCHING, Phase.RUNNING, Phase.ENDED}),
    Phase.LAUNCHING: frozenset({Phase.REGISTERING, Phase.RUNNING, Phase.LAUNCHING, Phase.ENDED}),
    Phase.REGISTERING: frozenset({Phase.RUNNING, Phase.LAUNCHING, Phase.ENDED}),
    Phase.RUNNING: frozenset({Phase.RUNNING, Phase.LAUNCHING, Phase.ENDED}),
    Phase.UNCONFIRMED: frozenset({Phase.RUNNING, Phase.LAUNCHING, Phase.ENDED}),
    Phase.ENDED: frozenset(),
}


# -- instructions: what the shell carries out ------------------------------------------------

@dataclass(frozen=True)
class LaunchAppMaster:
    """Record ``attempt`` with the app, get a slot (away from ``avoid`` if another worker
    has room) and start the AppMaster there; then call ``launched`` or ``launch_failed``."""
    app_id: int
    attempt: int
    avoid: str = ""


@dataclass(frozen=True)
class FenceAppMaster:
    """Have ``worker_id`` kill the app's AppMaster, should it still run there."""
    app_id: int
    worker_id: str
    reason: str


@dataclass(frozen=True)
class SetState:
    """Record and announce the app's state."""
    app_id: int
    state: str
    error: AppError | None = None


@dataclass(frozen=True)
class StopAppProcesses:
    """Ask every worker holding the app's slots to stop its processes."""
    app_id: int
    reason: str


@dataclass(frozen=True)
class AnswerSubmission:
    """Answer the waiting submitter: started (``error`` empty), or not, and why."""
    app_id: int
    error: str = ""
    code: str = ""


Instruction = LaunchAppMaster | FenceAppMaster | SetState | StopAppProcesses | AnswerSubmission


class Fenced(Exception):
    """An AppMaster of an older attempt than the app's current one."""


@dataclass
class _App:
    phase: Phase
    attempt: int
    restarts_allowed: int
    worker: str = ""  # where the current AppMaster runs (or was launched)
    deadline: float | None = None
    answering: bool = False  # a submitter waits for the first AppMaster to register
    pending_in_kv: bool = False  # found PENDING by this leader: never relaunched, only confirmed


@dataclass(frozen=True)
class Timeouts:
    """``register_s``: a launched AppMaster must register within it; ``heartbeat_s``: a
    registered one must heartbeat within it; ``reconfirm_s``: after a new leader takes
    office, a running app's AppMaster must register with it within it."""
    register_s: float
    heartbeat_s: float
    reconfirm_s: float


class AppLifecycles:
    """Every app's phase, as the leading master sees it; see the module docstring."""

    def __init__(self, timeouts: Timeouts) -> None:
        self.timeouts = timeouts
        self._apps: dict[int, _App] = {}

    # -- queries ---------------------------------------------------------------------------

    def phase(self, app_id: int) -> Phase | None:
        app = self._apps.get(app_id)
        return app.phase if app else None

    def attempt(self, app_id: int) -> int:
        app = self._apps.get(app_id)
        return app.attempt if app else 0

    def starting(self, app_id: int) -> bool:
        """A submitter still waits for this app's first AppMaster."""
        app = self._apps.get(app_id)
        return bool(app and app.answering)

    # -- events ----------------------------------------------------------------------------

    def accepted(self, app_id: int, restarts_allowed: int) -> None:
        """A submission is recorded and its submitter waits; the master makes the app's
        stores before it asks for a slot. Known from now on, so a kill meanwhile ends it."""
        self._apps[app_id] = _App(Phase.ACCEPTED, 0, restarts_allowed, answering=True)

    def submitted(self, app_id: int, restarts_allowed: int) -> list[Instruction]:
        """The app is ready to start: launch its first AppMaster, unless it ended since it
        was accepted (a kill, which answered the submitter). Decided now, not when the
        submission arrived, so a kill during the master's work in between is never lost."""
        app = self._apps.get(app_id)
        if app is None:
            app = self._apps[app_id] = _App(Phase.ACCEPTED, 0, restarts_allowed, answering=True)
        if app.phase is not Phase.ACCEPTED:
            return []
        self._enter(app, Phase.LAUNCHING)
        return [LaunchAppMaster(app_id, 0)]

    def took_office(self, apps: Iterable[tuple[int, str, str, int, int]], now: float) -> list[Instruction]:
        """This master now leads. ``apps``: (app id, recorded state, AppMaster's worker,
        attempt, relaunches allowed) of every app in KV; those not ended must have their
        AppMaster register with this master within the grace period."""
        self._apps = {}
        for app_id, state, worker, attempt, allowed in apps:
            if state in AppState.TERMINAL:
                continue
            deadline = now + (self.timeouts.register_s if state == AppState.PENDING else self.timeouts.reconfirm_s)
            self._apps[app_id] = _App(Phase.UNCONFIRMED, attempt, allowed, worker, deadline,
                                      pending_in_kv=state == AppState.PENDING)
        return []

    def launched(self, app_id: int, attempt: int, worker_id: str, now: float) -> list[Instruction]:
        app = self._current(app_id, attempt)
        if app is None or app.phase is not Phase.LAUNCHING:
            return []  # it registered before the launch was answered, or the app ended meanwhile
        self._enter(app, Phase.REGISTERING)
        app.worker, app.deadline = worker_id, now + self.timeouts.register_s
        return []

    def launch_failed(self, app_id: int, attempt: int, reason: str) -> list[Instruction]:
        """The AppMaster could not be launched; for an ACCEPTED app, its stores could not be made."""
        app = self._current(app_id, attempt)
        if app is None or app.phase not in (Phase.ACCEPTED, Phase.LAUNCHING):
            return []
        if app.answering:
            return self._fail_start(app_id, app, reason)
        return self._end(app_id, app, AppState.FAILED,
                         AppError("AppMasterLost", f"relaunching the AppMaster failed: {reason}", "master"))

    def registered(self, app_id: int, attempt: int, worker_id: str, now: float) -> list[Instruction]:
        """An AppMaster registers. Raises Fenced for an older attempt (it must stop);
        KeyError for an app this machine does not track (ended or unknown)."""
        app = self._apps.get(app_id)
        if app is None or app.phase is Phase.ENDED:
            raise KeyError(app_id)
        if attempt != app.attempt:
            raise Fenced(f"AppMaster attempt {attempt} of app {app_id} is not its current attempt {app.attempt}"
                         + (": it was replaced" if attempt < app.attempt else ""))
        answer = [AnswerSubmission(app_id)] if app.answering else []
        app.answering = app.pending_in_kv = False
        self._enter(app, Phase.RUNNING)
        app.worker, app.deadline = worker_id, now + self.timeouts.heartbeat_s
        return answer

    def heartbeat(self, app_id: int, attempt: int, now: float) -> bool:
        """An AppMaster's heartbeat; False if this master wants it to register (again):
        it is not known as running here, or it is an older attempt (to be fenced)."""
        app = self._apps.get(app_id)
        if app is None or app.phase is Phase.ENDED:
            return True  # an app that ended (or never was): nothing to ask of it
        if attempt < app.attempt or app.phase is not Phase.RUNNING:
            return False
        app.deadline = now + self.timeouts.heartbeat_s
        return True

    def appmaster_exited(self, app_id: int, attempt: int, worker_id: str, reason: str) -> list[Instruction]:
        app = self._current(app_id, attempt)
        if app is None or app.phase in (Phase.ENDED, Phase.ACCEPTED, Phase.LAUNCHING) or worker_id != app.worker:
            return []
        return self._lost(app_id, app, reason, fence=False)

    def worker_lost(self, worker_id: str, reason: str) -> list[Instruction]:
        """A worker is gone, with the AppMasters it ran."""
        return [i for app_id, app in list(self._apps.items())
                if app.worker == worker_id and app.phase in (Phase.REGISTERING, Phase.RUNNING, Phase.UNCONFIRMED)
                for i in self._lost(app_id, app, f"worker {worker_id}, which ran the AppMaster, {reason}",
                                    fence=False)]

    def worker_registered(self, worker_id: str, appmasters: Iterable[int]) -> list[Instruction]:
        """A worker (re-)registered running the AppMasters of ``appmasters``: an app whose
        AppMaster was there and is not any more has lost it (the worker restarted)."""
        running = set(appmasters)
        return [i for app_id, app in list(self._apps.items())
                if app.worker == worker_id and app_id not in running
                and app.phase in (Phase.RUNNING, Phase.UNCONFIRMED)
                for i in self._lost(app_id, app, f"worker {worker_id} came back without the AppMaster",
                                    fence=False)]

    def state_reported(self, app_id: int, state: str) -> list[Instruction]:
        """The AppMaster reported ``state`` (the shell has recorded it)."""
        app = self._apps.get(app_id)
        if app is None or state not in AppState.TERMINAL or app.phase is Phase.ENDED:
            return []
        answer = [AnswerSubmission(app_id)] if app.answering else []  # it started, and ended: see its status
        self._enter(app, Phase.ENDED)
        app.deadline, app.answering = None, False
        return answer

    def kill(self, app_id: int) -> list[Instruction]:
        return self.end(app_id, AppState.TERMINATED, None, "killed by request", "was killed")

    def end(self, app_id: int, state: str, error: AppError | None, reason: str, what: str = "") -> list[Instruction]:
        """The master ends the app (a kill; a multi-stage app when its stages end) for
        ``reason``: its processes are stopped; a submitter still waiting hears that the app
        ``what`` (default: ended, why) while starting."""
        app = self._apps.get(app_id)
        if app is None or app.phase is Phase.ENDED:
            return []
        what = what or f"ended ({reason})"
        answer = [AnswerSubmission(app_id, f"app {app_id} {what} while starting", "conflict")] if app.answering else []
        return answer + self._end(app_id, app, state, error, reason)

    def tick(self, now: float) -> list[Instruction]:
        """Deadlines: a launched AppMaster that never registered, a running one that went
        silent, and an app's AppMaster that did not register with this new leader."""
        actions: list[Instruction] = []
        for app_id, app in list(self._apps.items()):
            if app.deadline is None or now < app.deadline:
                continue
            if app.phase is Phase.REGISTERING:
                reason = f"the AppMaster did not register within {self.timeouts.register_s:g} s"
            elif app.phase is Phase.RUNNING:
                reason = f"the AppMaster sent no heartbeat for {self.timeouts.heartbeat_s:g} s"
            elif app.pending_in_kv:
                actions += self._end(app_id, app, AppState.FAILED, AppError(
                    "SubmissionLost", "its AppMaster never registered (the master failed over during submission)",
                    "master"))
                continue
            else:
                reason = f"the AppMaster did not register with the new leader within {self.timeouts.reconfirm_s:g} s"
            actions += self._lost(app_id, app, reason, fence=True)
        return actions

    # -- invariants ------------------------------------------------------------------------

    def validate(self) -> None:
        """Raise AssertionError if the machine's state is inconsistent (run by tests)."""
        for app_id, app in self._apps.items():
            waits = app.phase in (Phase.REGISTERING, Phase.RUNNING, Phase.UNCONFIRMED)
            assert waits == (app.deadline is not None), (app_id, app)
            assert not app.answering or (app.attempt == 0 and app.phase in (
                Phase.ACCEPTED, Phase.LAUNCHING, Phase.REGISTERING)), (app_id, app)
            assert app.phase is not Phase.ACCEPTED or app.answering, (app_id, app)
            assert not app.pending_in_kv or app.phase is Phase.UNCONFIRMED or app.phase is Phase.ENDED, (app_id, app)
            assert app.phase is Phase.ENDED or app.attempt <= app.restarts_allowed, (app_id, app)

    # -- transitions -----------------------------------------------------------------------

    def _current(self, app_id: int, attempt: int) -> _App | None:
        """The app, if ``attempt`` is its current AppMaster's."""
        app = self._apps.get(app_id)
        return app if app is not None and attempt == app.attempt else None

    @staticmethod
    def _enter(app: _App, phase: Phase) -> None:
        if phase not in _ALLOWED[app.phase]:
            raise AssertionError(f"app phase {app.phase} -> {phase} is not a transition")
        app.phase = phase

    def _lost(self, app_id: int, app: _App, reason: str, *, fence: bool) -> list[Instruction]:
        """The current AppMaster is gone: fail a submission, else relaunch within budget."""
        if app.answering:
            return self._fail_start(app_id, app, reason) + \
                ([FenceAppMaster(app_id, app.worker, reason)] if fence and app.worker else [])
        if app.pending_in_kv:
            return self._end(app_id, app, AppState.FAILED, AppError("SubmissionLost", reason, "master"))
        fencing = [FenceAppMaster(app_id, app.worker, reason)] if fence and app.worker else []
        if app.attempt + 1 > app.restarts_allowed:
            return fencing + self._end(app_id, app, AppState.FAILED, AppError(
                "AppMasterLost", f"{reason}; gave up after {app.restarts_allowed} relaunches", "master"),
                "AppMaster lost")
        avoid, app.attempt = app.worker, app.attempt + 1
        self._enter(app, Phase.LAUNCHING)
        app.worker, app.deadline = "", None
        return fencing + [LaunchAppMaster(app_id, app.attempt, avoid)]

    def _fail_start(self, app_id: int, app: _App, reason: str) -> list[Instruction]:
        return [AnswerSubmission(app_id, f"app {app_id} could not start: {reason}", "unavailable")] + \
            self._end(app_id, app, AppState.FAILED, AppError("AppMasterLaunchFailed", reason, "master"),
                      "the AppMaster failed to start")

    def _end(self, app_id: int, app: _App, state: str, error: AppError | None,
             stop_reason: str = "") -> list[Instruction]:
        self._enter(app, Phase.ENDED)
        app.deadline, app.answering = None, False
        return [SetState(app_id, state, error)] + ([StopAppProcesses(app_id, stop_reason)] if stop_reason else [])
