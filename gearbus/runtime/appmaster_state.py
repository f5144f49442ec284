"""An application's life in its AppMaster: a state machine without I/O.

A shell feeds it events (slots allocated, an executor registered, heartbeating, stopped
or lost with its worker, tasks deployed, a task finished, ended or failed, checkpoint
acknowledgements, a savepoint asked for and written, a tick with the time) and carries out
the instructions it returns: the AppMaster's async shell over NATS, and the TestRunner's
in-process engine in memory. It never reads a clock, sleeps or touches NATS; it drives the
checkpoint coordinator and passes the coordinator's actions on to the shell, so
checkpoints, recovery and the app's end are decided in one place, for the cluster and the
test runner alike, and tested without a network (dask's ``WorkerState``).

The app moves through these phases (``_ALLOWED`` enforces the table)::

    phase         event                                      -> phase         instructions
    (new)         start (a fresh app)                        STARTING      RequestSlots
    (new)         start (a relaunched AppMaster)             ADOPTING      AskExecutorsToRegister
    STARTING      slots allocated                            STARTING      LaunchExecutor per slot
    STARTING      every executor registered                  DEPLOYING     Deploy(epoch)
    ADOPTING      every task hosted, or the window passed    DEPLOYING     Deploy | ROLLING_BACK (orphans)
    DEPLOYING     deployed (tasks launched and started)      RUNNING       [ReportState(ACTIVE) the first time]
    RUNNING       executor lost, task failure                ROLLING_BACK  Fence, StoreEpoch, RequestSlot
    DEPLOYING       (or a deployment failed)                   (a new epoch; lost tasks get new executors)
    ROLLING_BACK  more losses                                ROLLING_BACK  (placed too)
    ROLLING_BACK  every lost task has a registered executor  DEPLOYING     Deploy(epoch)
    RUNNING       a rescale's (or replacement's) checkpoint  DEPLOYING     StoreEpoch, Deploy(epoch + 1) (the new
                    completed                                                tasks divide the old ones' state)
    RUNNING       a change's parking checkpoint failed       ROLLING_BACK  AnswerRescale or AnswerReplace (not done),
                                                               or DEPLOYING  then as any failure (a new epoch)
    DEPLOYING     an executor refused a rescale's tasks      ROLLING_BACK  AnswerRescale (undone: the old
                                                               or DEPLOYING  parallelism), as a failure
    RUNNING       every task finished                        ENDING        EndApp(SUCCEEDED), ReportState
    RUNNING       a savepoint with stop is written           ENDING        EndApp(TERMINATED), ReportState
    any           user error repeated, budget spent, no slot ENDING        EndApp(FAILED, error), ReportState
    ENDING        the end reported (or given up on)          ENDING        Shutdown

Every loss or task failure counts against the restart budget (``max_restarts``); a fault
(a lost executor, a task's failure of kind "fault") counts against its worker too
(``blacklist_after`` of them there and the worker is avoided), a user error never does. A
user error that repeats the previous one after a restore (same step, type, message and
record) ends the app at once: it is the app's, and would again. Losses while a rollback is
under way join it; a loss while a deployment is under way starts a new epoch at once
(the tasks of the older epoch are replaced, and its ``deployed`` report is ignored).
Reports of an older epoch change nothing.

A rescale's checkpoint parks the tasks after their snapshots (``TriggerCheckpoint.park``):
nothing runs past it, so the tasks of the processors not rescaled go on in place in the
next epoch (``Deploy.kept``: their channels rewired, their state neither stored again nor
restored), beside the rescaled processors' new tasks restored from it. Any failure before
they run falls back to the global rollback.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from gearbus.api.partitioners import MAX_PARALLELISM, owned_groups
from gearbus.control.config import AppConfig
from gearbus.runtime import checkpoints as cp
from gearbus.runtime.stimuli import StimulusLog, stimulus
from gearbus.runtime.task_key import TaskKey
from shared.messages import AppError, AppState, ErrorCode, FailureKind, TaskId

EXECUTOR_TIMEOUT_HEARTBEATS = 5  # an executor silent this many heartbeat intervals is lost (hung or host lost)
MISSED_HEARTBEATS_LOGGED = 3  # after this many intervals of silence the shell warns once
ADOPTION_WINDOW_HEARTBEATS = 2  # a relaunched AppMaster waits this long for the running executors
STARTUP_TIMEOUT_S = 60.0  # a launched executor must register within this
REPORT_RETRY_S = 30.0  # a state report the master did not answer is sent again for this long (a fail-over)


class Phase(enum.Enum):
    STARTING = "starting"
    ADOPTING = "adopting"
    DEPLOYING = "deploying"
    RUNNING = "running"
    ROLLING_BACK = "rolling_back"
    ENDING = "ending"


_ALLOWED: dict[Phase, frozenset[Phase]] = {
    Phase.STARTING: frozenset({Phase.DEPLOYING, Phase.ENDING}),
    Phase.ADOPTING: frozenset({Phase.DEPLOYING, Phase.ROLLING_BACK, Phase.ENDING}),
    Phase.DEPLOYING: frozenset({Phase.RUNNING, Phase.ROLLING_BACK, Phase.ENDING}),
    Phase.RUNNING: frozenset({Phase.ROLLING_BACK, Phase.DEPLOYING, Phase.ENDING}),  # DEPLOYING: a rescale
    Phase.ROLLING_BACK: frozenset({Phase.DEPLOYING, Phase.ROLLING_BACK, Phase.ENDING}),
    Phase.ENDING: frozenset(),
}


# -- instructions: what the shell carries out -------------------------------------------------

@dataclass(frozen=True)
class RequestSlots:
    """Ask the master for ``count`` slots (at least one); then ``slots_allocated`` or ``fail``."""
    count: int


@dataclass(frozen=True)
class RequestSlot:
    """Ask for one slot for executor ``executor_id`` on a worker not in ``exclude``; then
    ``slot_allocated`` or ``slot_failed``."""
    executor_id: int
    exclude: tuple[str, ...]


@dataclass(frozen=True)
class LaunchExecutor:
    """Start executor ``executor_id`` on ``worker_id``; ``executor_launch_failed`` if that fails."""
    executor_id: int
    worker_id: str


@dataclass(frozen=True)
class AskExecutorsToRegister:
    """A relaunched AppMaster: the running executors are asked to register with it."""


@dataclass(frozen=True)
class Deploy:
    """Launch each executor's tasks in ``epoch`` (replacing older ones), restored from
    ``restore`` (None: fresh), and start them all; then ``deployed`` or ``deploy_failed``.
    ``parallelism``: each rescaled processor's, where it differs from the plan's;
    ``restore_parallelism``: the processors whose snapshots of ``restore`` were taken at
    another parallelism than they run at now (a rescale), and that one: each new task
    restores its share, the key groups it owns, from the old tasks' snapshots."""
    epoch: int
    restore: cp.CheckpointMeta | None
    assignments: tuple[tuple[int, tuple[TaskKey, ...]], ...]  # (executor id, its tasks)
    parallelism: tuple[tuple[int, int], ...] = ()  # (processor id, parallelism)
    restore_parallelism: tuple[tuple[int, int], ...] = ()  # (processor id, parallelism of its snapshots)
    #: (processor id, the version whose code it runs), where not the app as submitted (version 1)
    versions: tuple[tuple[int, int], ...] = ()
    #: (processor id, its steps whose state in ``restore`` its new code does not take over)
    drop_state: tuple[tuple[int, tuple[str, ...]], ...] = ()
    #: (processor id, the event time from which its tasks hold input back for a replacement's code)
    hold_from: tuple[tuple[int, int], ...] = ()
    #: tasks parked at ``restore`` on their executor that go on there in ``epoch``, rewired, not restored
    kept: tuple[TaskKey, ...] = ()


@dataclass(frozen=True)
class AnswerRescale:
    """Answer rescale request ``request_id``: done (its tasks run at the new parallelism),
    or not, with why (``error``; the app runs on as it was)."""
    request_id: int
    error: str = ""


@dataclass(frozen=True)
class AnswerReplace:
    """Answer replace request ``request_id``: the new code runs and completed a checkpoint,
    or not (``error``: refused before it took over, or rolled back to the previous version;
    the app runs on)."""
    request_id: int
    error: str = ""
    rolled_back: bool = False  # the new code had taken over, and failed on trial


@dataclass(frozen=True)
class RepeatFinalComplete:
    """Announce the final checkpoint's completion again: a task has not finished, and the
    announcement (core NATS) may have been lost; commits are idempotent."""
    checkpoint_id: int
    epoch: int


@dataclass(frozen=True)
class StoreEpoch:
    """Record the current epoch and restart count durably, and where a rescale left the
    plan (a relaunched AppMaster goes on from them)."""
    epoch: int
    restarts: int
    parallelism: tuple[tuple[int, int], ...] = ()  # as Deploy's
    drop_state_checkpoint: int = 0  # the checkpoint ``drop_state`` applies to (not a later one)
    versions: tuple[tuple[int, int], ...] = ()  # as Deploy's
    drop_state: tuple[tuple[int, tuple[str, ...]], ...] = ()  # as Deploy's, for the checkpoint restored
    #: new code on trial: (processor, its version, the version before, whether both keep the
    #: same state, the checkpoint it took over from); empty: none
    trial: tuple = ()


@dataclass(frozen=True)
class Fence:
    """Have ``worker_id`` kill executor ``executor_id``: it was declared lost (it may be hung)."""
    executor_id: int
    worker_id: str
    reason: str


@dataclass(frozen=True)
class ReportState:
    """Tell the master the app's state (and why it failed); then ``state_reported``."""
    state: str
    error: AppError | None = None


@dataclass(frozen=True)
class AnswerSavepoint:
    """Answer savepoint request ``request_id``: its checkpoint completed (``meta``, to be
    written as the savepoint: then ``savepoint_written``), or it failed (``error``)."""
    request_id: int
    meta: cp.CheckpointMeta | None = None
    error: str = ""


@dataclass(frozen=True)
class EndApp:
    """The app's outcome is decided: log it and send the final counters (a ReportState of
    the outcome follows: the counters go before the final state)."""
    state: str
    error: AppError | None = None


@dataclass(frozen=True)
class Shutdown:
    """The app's end is reported (or could not be): stop its executors, then this AppMaster."""
    reason: str


@dataclass(frozen=True)
class Logged:
    """Something the shell logs: ``event`` with ``data``."""
    event: str
    level: str
    data: tuple[tuple[str, object], ...]


Instruction = (RequestSlots | RequestSlot | LaunchExecutor | AskExecutorsToRegister | Deploy | StoreEpoch
               | Fence | ReportState | AnswerSavepoint | AnswerRescale | AnswerReplace | RepeatFinalComplete | EndApp
               | Shutdown | Logged | cp.Action)
"""What the shell carries out (never cp.FailApplication: the machine ends the app on it)."""


@dataclass
class _Rescale:
    request_id: int
    parallelism: dict[int, int]  # processor id -> its new parallelism
    first_checkpoint: int  # the rescale goes on from the first checkpoint completed from this id on
    previous: dict[int, int] | None = None  # once applied (its tasks being deployed): the parallelism before

    @property
    def applied(self) -> bool:
        """Its tasks run, or are being deployed, at the new parallelism."""
        return self.previous is not None


@dataclass
class _Replace:
    request_id: int
    processor: int
    version: int  # the code it takes over with
    previous: int  # the version it replaces (rolled back to should the new code fail before its first checkpoint)
    dropped: tuple[str, ...]  # steps whose state the new code does not take over
    same_state: bool  # the new code's stateful steps are the old's (names and kinds): either restores the other's
    first_checkpoint: int  # the new code takes over from the first checkpoint completed from this id on
    at_ms: int = 0  # records before this event time go to the old code (0: the new code takes over at once)
    holding: bool = False  # with at_ms: the processor's tasks hold records from at_ms on until its watermark passes
    switched_at: int = 0  # the checkpoint it took over from, once it did (then it is on trial)
    proven_at: int = 0  # the first checkpoint covering records the new code processed: it passes the trial


class Refused(Exception):
    """A registration or heartbeat this AppMaster does not accept; ``code`` is an ErrorCode."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class ExecutorRecord:
    """What the AppMaster knows of one executor."""
    executor_id: int
    worker_id: str
    tasks: list[TaskKey] = field(default_factory=list)
    registered: bool = False
    lost: bool = False
    suspect: bool = False  # lost with its worker perhaps: place its tasks elsewhere
    launched_at: float | None = None  # launched by this AppMaster, not registered yet
    #: the workers its slot may not be on if none is free away from the suspects too (None: no other try)
    fallback_exclude: tuple[str, ...] | None = None
    last_heartbeat: float = 0.0
    missed_logged: bool = False

    @property
    def live(self) -> bool:
        return not self.lost


@dataclass(frozen=True)
class Settings:
    """What the app's config says about its life."""
    executors: int = AppConfig.executors
    placement: str = AppConfig.task_placement  # by_index: task i of every processor together; round_robin spreads them
    max_restarts: int = AppConfig.max_restarts
    blacklist_after: int = AppConfig.blacklist_after
    heartbeat_interval_s: float = 1.0
    #: the app's state backend, or the cluster default where the AppMaster runs: every
    #: executor is told it, whatever its own worker's default
    state_backend: str = "memory"

    @classmethod
    def of(cls, config: AppConfig, heartbeat_interval_s: float = 1.0) -> Settings:
        """From the app's config as it applies where the AppMaster runs (its state backend
        resolved: every executor is told that one)."""
        return cls(executors=config.executors, placement=config.task_placement, max_restarts=config.max_restarts,
                   blacklist_after=config.blacklist_after, heartbeat_interval_s=heartbeat_interval_s,
                   state_backend=config.resolved().state_backend)


def _most_groups_of(index: int, parallelism: int, old_parallelism: int) -> int:
    """The task of ``old_parallelism`` that owned most of the key groups task ``index`` of
    ``parallelism`` owns (the first of those that owned as many)."""
    groups = set(owned_groups(index, parallelism))
    return max(range(old_parallelism), key=lambda old: len(groups.intersection(owned_groups(old, old_parallelism))))


class AppMasterState:
    """One app's life as its AppMaster sees it; see the module docstring."""

    def __init__(self, tasks: Iterable[TaskKey], coordinator: cp.CheckpointCoordinator, settings: Settings,
                 epoch: int = 0, restarts: int = 0, planned: dict[int, int] | None = None,
                 names: dict[int, str] | None = None,
                 versions: dict[int, int] | None = None, drop_state: dict[int, tuple[str, ...]] | None = None,
                 trial: tuple = ()) -> None:
        """``names``: each processor's name, for what a refusal or a log says (by id without);
        ``planned``: each processor's parallelism in the app's plan, where ``tasks`` run
        at another after a rescale (a relaunched AppMaster's);
        ``versions``: the processors running a later version's code, and its number;
        ``drop_state``: their steps whose state of the last checkpoint they do not take over;
        ``trial``: new code its predecessor had on trial (StoreEpoch's), on trial still: its
        answer goes to request 0."""
        self.tasks: tuple[TaskKey, ...] = tuple(tasks)
        self.names = dict(names or {})
        #: each processor's parallelism now, and the plan's (a rescale changes the first)
        self.parallelism: dict[int, int] = dict(collections.Counter(p for p, _ in self.tasks))
        self._planned = {**self.parallelism, **(planned or {})}
        self.coordinator = coordinator
        self.settings = settings
        self.epoch = epoch
        self.restarts = restarts
        self.phase: Phase | None = None
        self.executors: dict[int, ExecutorRecord] = {}
        self.unfinished: set[TaskKey] = set(self.tasks)
        self.blacklist: set[str] = set()
        self.failures: collections.Counter[str] = collections.Counter()  # faults by worker (user errors: none)
        #: (step, error type, message, record) of the last user error: the same again after a restore ends the app
        self._last_user_error: tuple[str, str, str, str] | None = None
        self.outcome: EndApp | None = None
        self._restore: cp.CheckpointMeta | None = None  # what the next deployment restores
        self._active_reported = False
        self._adopt_until: float | None = None
        self._savepoints: dict[int, tuple[int, bool]] = {}  # request id -> (first usable checkpoint id, stop)
        self._written: dict[int, bool] = {}  # request id -> stop, for savepoints being written
        self._final_announced: tuple[int, float] | None = None  # the final checkpoint, when last announced
        self._report_failing_since: dict[str, float] = {}  # state -> when its report first went unanswered
        self._rescale: _Rescale | None = None  # the change in flight
        self._kept: tuple[TaskKey, ...] = ()  # the tasks the deployment under way keeps running (as Deploy's)
        #: processor id -> the version whose code it runs, where not the app as submitted (version 1)
        self.versions: dict[int, int] = dict(versions or {})
        self._drop_state: dict[int, tuple[str, ...]] = dict(drop_state or {})  # as Deploy's
        self._replace: _Replace | None = None  # the replacement in flight, or on trial
        if trial:
            processor, version, previous, same_state, switched_at = trial
            self._replace = _Replace(0, processor, version, previous, (), same_state, switched_at,
                                     switched_at=switched_at)
        #: each task's input watermark as last reported (what a replacement at an event time waits for),
        #: and the highest event time of a record it processed (where the old code's records already end)
        self.watermarks: dict[TaskKey, int] = {}
        self.latest_events: dict[TaskKey, int] = {}
        #: every event taken, and what it decided (executor heartbeats, and ticks and acks that decided nothing, aside)
        self.stimuli = StimulusLog(quiet=frozenset({"tick", "checkpoint_acked", "task_ended"}))

    # -- queries ---------------------------------------------------------------------------

    def live_executors(self) -> list[ExecutorRecord]:
        return [e for e in self.executors.values() if e.live]

    @property
    def running(self) -> bool:
        return self.phase is Phase.RUNNING

    @property
    def ending(self) -> bool:
        return self.phase is Phase.ENDING

    # -- start -----------------------------------------------------------------------------

    @stimulus
    def start(self, now: float, restore: cp.CheckpointMeta | None = None, adopt: bool = False) -> list[Instruction]:
        """A fresh app (restored from ``restore``, a savepoint, if given), or a relaunched
        AppMaster adopting the running executors and resuming from ``restore``."""
        self._restore = restore
        if adopt:
            self.phase = Phase.ADOPTING
            self._adopt_until = now + ADOPTION_WINDOW_HEARTBEATS * self.settings.heartbeat_interval_s
            return [AskExecutorsToRegister()]
        self.phase = Phase.STARTING
        return [self._epoch_record(), RequestSlots(max(1, min(self.settings.executors,
                                                                               len(self.tasks))))]

    @stimulus
    def slots_allocated(self, workers: list[str], now: float) -> list[Instruction]:
        """One executor per slot; tasks spread over them by the placement rule."""
        if self.phase is not Phase.STARTING or self.executors or not workers:
            return []
        for worker in workers:
            executor_id = len(self.executors)
            self.executors[executor_id] = ExecutorRecord(executor_id, worker, launched_at=now)
        executors = list(self.executors.values())
        for n, task in enumerate(sorted(self.tasks)):
            index = task[1] if self.settings.placement == "by_index" else n
            executors[index % len(executors)].tasks.append(task)
        return [LaunchExecutor(e.executor_id, e.worker_id) for e in executors]

    # -- executors -------------------------------------------------------------------------

    @stimulus
    def executor_registered(self, executor_id: int, worker_id: str, tasks: list[TaskKey], pid: int,
                            now: float) -> list[Instruction]:
        """An executor registers: one this AppMaster launched, or (while adopting) one of
        the previous AppMaster's with the tasks it hosts. Raises Refused otherwise."""
        executor = self.executors.get(executor_id)
        if executor is None and self.phase is Phase.ADOPTING:  # of the plan, once: a rescale may have been cut short
            hosted = {t for e in self.executors.values() for t in e.tasks}
            tasks = [t for t in dict.fromkeys(tasks) if t in set(self.tasks) and t not in hosted]
            executor = self.executors[executor_id] = ExecutorRecord(executor_id, worker_id, tasks)
        if executor is None:
            raise Refused(ErrorCode.NOT_FOUND, f"this app launched no executor {executor_id}")
        if executor.lost:
            raise Refused(ErrorCode.FENCED, f"executor {executor_id} was declared lost and replaced")
        if executor.registered:
            raise Refused(ErrorCode.CONFLICT, f"executor id {executor_id} is already registered (from worker "
                                      f"{executor.worker_id}); duplicate from pid {pid} on worker {worker_id} refused")
        executor.registered, executor.launched_at, executor.last_heartbeat = True, None, now
        if self.phase is Phase.ADOPTING:
            return self._adopted(now) if not self._unhosted() else []
        return self._deploy_if_placed()

    def executor_heartbeat(self, executor_id: int, now: float) -> bool:
        """False for an executor this AppMaster does not know; Refused("fenced") for a lost one."""
        executor = self.executors.get(executor_id)
        if executor is None:
            return False
        if executor.lost:
            raise Refused(ErrorCode.FENCED, f"executor {executor_id} was declared lost and replaced: stop")
        executor.last_heartbeat, executor.missed_logged = now, False
        return True

    @stimulus
    def executor_stopped(self, executor_id: int, worker_id: str, exit_detail: str, worker_gone: bool,
                         now: float) -> list[Instruction]:
        """Executor ``executor_id`` exited (``exit_detail``: how, e.g. "exited with code 1"), or
        reported that its worker died (``worker_gone``)."""
        executor = self.executors.get(executor_id)
        if executor is None or self.phase is Phase.ENDING:
            return []
        if worker_gone:
            return self._lost(executor, f"executor {executor_id} lost its worker {worker_id}", now, suspect=True)
        return self._lost(executor, f"executor {executor_id} on worker {worker_id} {exit_detail}", now)

    @stimulus
    def worker_lost(self, worker_id: str, now: float) -> list[Instruction]:
        return [i for e in list(self.executors.values()) if e.worker_id == worker_id and e.live
                for i in self._lost(e, f"worker {worker_id} was lost", now, suspect=True)]

    @stimulus
    def slot_allocated(self, executor_id: int, worker_id: str, now: float) -> list[Instruction]:
        executor = self.executors.get(executor_id)
        if executor is None or executor.lost or self.phase is not Phase.ROLLING_BACK:
            return []
        executor.worker_id, executor.launched_at = worker_id, now
        return [LaunchExecutor(executor_id, worker_id)]

    @stimulus
    def slot_failed(self, executor_id: int, reason: str) -> list[Instruction]:
        """No slot away from the suspects: then one anywhere not blacklisted; none there
        either: the app fails."""
        executor = self.executors.get(executor_id)
        if executor is None or executor.lost or self.phase is Phase.ENDING:
            return []
        if executor.fallback_exclude is not None:
            exclude, executor.fallback_exclude = executor.fallback_exclude, None
            return [Logged("slot_retried", "info", (("executor_id", executor_id), ("reason", reason))),
                    RequestSlot(executor_id, exclude)]
        return self._end(AppState.FAILED, AppError("RecoveryFailed", f"no slot for the lost tasks: {reason}",
                                                   "recovery"))

    @stimulus
    def executor_launch_failed(self, executor_id: int, reason: str, now: float) -> list[Instruction]:
        executor = self.executors.get(executor_id)
        if executor is None or executor.lost or self.phase is Phase.ENDING:
            return []
        return self._lost(executor, f"starting executor {executor_id} on worker {executor.worker_id} failed: "
                                    f"{reason}", now, suspect=True)

    # -- deployment and tasks --------------------------------------------------------------

    @stimulus
    def deployed(self, epoch: int, now: float) -> list[Instruction]:
        if epoch != self.epoch or self.phase is not Phase.DEPLOYING:
            return []
        self._enter(Phase.RUNNING)
        self._kept = ()
        actions: list[Instruction] = [Logged("app_running", "info", (("epoch", epoch),))]
        if not self._active_reported:
            self._active_reported = True
            actions.append(ReportState(AppState.ACTIVE))
        if self._rescale is not None and self._rescale.applied:
            actions += [Logged("rescaled", "info", (("parallelism", self._parallelisms(self._rescale.parallelism)),)),
                        AnswerRescale(self._rescale.request_id)]
            self._rescale = None
        return actions + self._checkpointing(self.coordinator.start(now), now)

    @stimulus
    def deploy_failed(self, epoch: int, reason: str, now: float, refused: bool = False) -> list[Instruction]:
        """An executor failed while tasks were being launched, or refused them (``refused``:
        a rescale's tasks could not divide their state, new code does not load): roll back
        again, the rescale being deployed undone if it was refused."""
        if epoch != self.epoch or self.phase is not Phase.DEPLOYING:
            return []
        reason = f"deploying epoch {epoch} failed: {reason}"
        undone = self._rescale_undone(reason) if refused else []
        on_trial = self._replace is not None and self._replace.switched_at > 0  # its code may not load
        return undone + self._rollback(reason, "", "recovery", now, on_trial)

    def _deployed_epoch(self, epoch: int) -> bool:
        """Whether a task's report of ``epoch`` is of the tasks this AppMaster deployed now."""
        return epoch == self.epoch and self.phase in (Phase.DEPLOYING, Phase.RUNNING, Phase.ROLLING_BACK)

    @stimulus
    def task_finished(self, task: TaskKey, epoch: int) -> list[Instruction]:
        if not self._deployed_epoch(epoch):
            return []
        self.unfinished.discard(task)
        if self.unfinished:
            return []
        return [Logged("all_tasks_finished", "info", ())] + self._end(AppState.SUCCEEDED)

    @stimulus
    def task_failed(self, task: TaskKey, epoch: int, error: AppError, recoverable: bool, executor_id: int,
                    now: float) -> list[Instruction]:
        """A task raised: the app rolls back to its last checkpoint. Only a fault counts
        against the executor's worker; a user error (``error.kind``; from an executor that
        predates it, ``recoverable`` false) that repeats the previous user error after a
        restore (the same step, type, record and place in the user's code; not the message,
        which may name the worker or the time) ends the app: it would again."""
        if not self._deployed_epoch(epoch):
            return []
        # new code on trial failing: rolled back to the old, and not the worker's fault
        new_code = self._replace is not None and self._replace.switched_at > 0 and task[0] == self._replace.processor
        if self.phase is Phase.ROLLING_BACK:  # the rollback under way covers it (one lost server fails many tasks)
            return []
        kind = error.kind or (FailureKind.FAULT if recoverable else FailureKind.USER)
        error = dataclasses.replace(error, kind=kind, step=error.step or self._named(task[0]))
        named = TaskId(*task).named(self.names)
        if kind == FailureKind.USER and not new_code:
            repeated = (error.step, error.error_type, error.record, error.location)
            if repeated == self._last_user_error:
                return [Logged("user_error_repeated", "error", (("task", named), ("step", error.step),
                                                               ("error", f"{error.error_type}: {error.message}"),
                                                               ("location", error.location)))] \
                    + self._end(AppState.FAILED, error)
            self._last_user_error = repeated
        executor = self.executors.get(executor_id)
        worker = executor.worker_id if executor and not new_code and kind == FailureKind.FAULT else ""
        return self._rollback(f"{named} failed: {error.error_type}: {error.message}", worker, named, now, new_code,
                              error)

    @stimulus
    def task_ended(self, task: TaskKey, epoch: int, now: float) -> list[Instruction]:
        if not self._deployed_epoch(epoch):
            return []
        return self._checkpointing(self.coordinator.task_ended(task, now), now)

    # -- checkpoints and savepoints --------------------------------------------------------

    @stimulus
    def checkpoint_acked(self, checkpoint_id: int, epoch: int, task: TaskKey, size_bytes: int, ended: bool,
                         now: float, alignment_s: float = 0.0, root: int = 0, depth: int = 0,
                         records_in: int = 0) -> list[Instruction]:
        """``records_in``: what the task processed in its epoch before the barrier (new code
        on trial passes once a checkpoint covering some of its records completes)."""
        trial = self._replace
        if trial is not None and trial.switched_at and not trial.proven_at and epoch == self.epoch \
                and task[0] == trial.processor and records_in > 0:
            trial.proven_at = checkpoint_id
        return self._checkpointing(self.coordinator.ack(checkpoint_id, epoch, task, size_bytes, ended, now,
                                                        alignment_s, root, depth), now)

    @stimulus
    def checkpoint_compacted(self, checkpoint_id: int, ok: bool, now: float, sizes: dict[TaskKey, int] | None = None
                             ) -> list[Instruction]:
        return self._checkpointing(self.coordinator.compacted(checkpoint_id, ok, sizes), now)

    @stimulus
    def checkpoint_declined(self, checkpoint_id: int, epoch: int, task: TaskKey, reason: str,
                            now: float) -> list[Instruction]:
        return self._checkpointing(self.coordinator.decline(checkpoint_id, epoch, task, reason, now,
                                                            TaskId(*task).named(self.names)), now)

    @stimulus
    def checkpoint_stored(self, checkpoint_id: int, now: float) -> list[Instruction]:
        return self._checkpointing(self.coordinator.stored(checkpoint_id, now), now) + self._rescale_if_due(now) + \
            self._switch_if_due(now)

    @stimulus
    def checkpoint_store_failed(self, checkpoint_id: int, reason: str, now: float) -> list[Instruction]:
        return self._checkpointing(self.coordinator.store_failed(checkpoint_id, reason, now), now)

    @stimulus
    def savepoint_requested(self, request_id: int, stop: bool, now: float) -> list[Instruction]:
        """Checkpoint now; its completion answers the request. Raises Refused unless running,
        or while tasks hold records for a replacement (a savepoint keeps state, not them)."""
        if self.phase is not Phase.RUNNING:
            raise Refused(ErrorCode.UNAVAILABLE, "the app is not running: no savepoint now")
        if self._holding():
            raise Refused(ErrorCode.CONFLICT, "tasks hold records for a replacement's new code (replace --at): "
                                              "take the savepoint once it took over")
        self._savepoints[request_id] = (self.coordinator.next_id, stop)
        return self._checkpointing(self.coordinator.request(now), now)

    @stimulus
    def rescale_requested(self, request_id: int, parallelism: dict[int, int], now: float) -> list[Instruction]:
        """Run processors at another parallelism: a checkpoint that parks the tasks (the next
        one), then they go on from it in a new epoch: the rescaled processors' new tasks
        restore their key groups of it, the others go on in place (``rescaled`` answers).
        Raises Refused, the app untouched, when it cannot be done."""
        if self.phase is not Phase.RUNNING:
            raise Refused(ErrorCode.CONFLICT, f"the app is {self.phase.value if self.phase else 'starting'}: "
                                              "rescale it once it runs")
        self._one_change_at_a_time()
        problems = [f"processor {p}: no such processor" for p in parallelism if p not in self.parallelism]
        problems += [f"{self._named(p)}: parallelism {n} is not between 1 and {MAX_PARALLELISM} (the key groups)"
                     for p, n in parallelism.items() if p in self.parallelism and not 1 <= n <= MAX_PARALLELISM]
        ended = sorted({p for p, _ in self.coordinator.ended} & set(parallelism))
        problems += [f"{self._named(p)}: its tasks have ended" for p in ended]
        if problems:
            raise Refused(ErrorCode.BAD_REQUEST, "; ".join(problems))
        changes = {p: n for p, n in parallelism.items() if self.parallelism[p] != n}
        if not changes:
            raise Refused(ErrorCode.BAD_REQUEST, f"already at {self._parallelisms(parallelism)}: nothing to change")
        first, checkpointing = self._parking_checkpoint(now)
        self._rescale = _Rescale(request_id, changes, first)
        return [Logged("rescale_requested", "info", (("parallelism", self._parallelisms(changes)),))] + checkpointing

    @stimulus
    def replace_requested(self, request_id: int, processor: int, version: int, dropped: tuple[str, ...],
                          now: float, at_ms: int = 0, same_state: bool = True) -> list[Instruction]:
        """Run ``processor`` with the code of ``version`` (checked by the shell against the
        plan: gearbus/runtime/replace.py): a checkpoint that parks the tasks (the next one),
        then the app goes on from it in a new epoch, the processor's tasks with the new code
        and the state of its steps but ``dropped``, the others in place. Until a checkpoint covering records it processed completes the new
        code is on trial: a failure of its tasks rolls the processor back to the previous
        version (``AnswerReplace`` says which). Only code whose stateful steps are the old
        one's (``same_state``) may be rolled back from a checkpoint it wrote: other code's
        trial ends at the first checkpoint after it took over. With ``at_ms``, the new
        epoch first runs the old code holding back records of event time ``at_ms`` and
        later; once the processor's watermark passes it, a checkpoint, and the new code
        takes over from it, held records first. Raises Refused, the app untouched, when it
        cannot be done now."""
        if self.phase is not Phase.RUNNING:
            raise Refused(ErrorCode.CONFLICT, f"the app is {self.phase.value if self.phase else 'starting'}: "
                                              "replace its code once it runs")
        self._one_change_at_a_time()
        if processor not in self.parallelism:
            raise Refused(ErrorCode.BAD_REQUEST, f"processor {processor}: no such processor")
        if sum(p == processor for p, _ in self.coordinator.ended) == self.parallelism[processor]:
            raise Refused(ErrorCode.BAD_REQUEST, f"{self._named(processor)}: its tasks have ended (nothing would "
                                                 "run the new code)")
        if at_ms:
            if any(p == processor for p, _ in self.coordinator.sources):
                raise Refused(ErrorCode.BAD_REQUEST, f"{self._named(processor)} is a source: its code is replaced "
                                                     "at a checkpoint (an event time applies to records it reads in)")
            passed = max((wm for (p, _), wm in self.watermarks.items() if p == processor), default=None)
            if passed is not None and passed >= at_ms:
                raise Refused(ErrorCode.BAD_REQUEST, f"event time {at_ms} is behind the watermark of "
                                                     f"{self._named(processor)} ({passed}): records after it were "
                                                     "processed already; ask a later time")
            latest = max((t for (p, _), t in self.latest_events.items() if p == processor), default=None)
            if latest is not None and latest >= at_ms:
                raise Refused(ErrorCode.BAD_REQUEST, f"{self._named(processor)} processed a record of event time "
                                                     f"{latest} already, ahead of its watermark: the old code "
                                                     f"would not count every record before {at_ms} alone; ask a "
                                                     "later time")
        first, checkpointing = self._parking_checkpoint(now)
        self._replace = _Replace(request_id, processor, version, self.versions.get(processor, 1), tuple(dropped),
                                 same_state, first, at_ms)
        return [Logged("replace_requested", "info", (("processor", self._named(processor)), ("version", version)))] + \
            checkpointing

    def _parking_checkpoint(self, now: float) -> tuple[int, list[Instruction]]:
        """The checkpoint a change goes on from: the next one (the barriers of one in flight
        may have passed without it), triggered now or right after the one in flight; the
        tasks park after their snapshots, so the processors the change leaves alone go on
        in place from it (``Deploy.kept``)."""
        return self.coordinator.next_id, self._checkpointing(self.coordinator.request(now, park=True), now)

    def _one_change_at_a_time(self) -> None:
        if self._rescale is not None:
            raise Refused(ErrorCode.CONFLICT, f"another change is in flight (rescale to "
                                              f"{self._parallelisms(self._rescale.parallelism)}): one at a time")
        if self._replace is not None:
            change = self._replace
            waiting = ", on trial until a checkpoint covers records it processed" if change.switched_at else \
                f", waiting for its watermark to pass {change.at_ms}" if change.holding else ""
            raise Refused(ErrorCode.CONFLICT, f"another change is in flight (version {change.version} of "
                                              f"{self._named(change.processor)}{waiting}): one at a time")

    @stimulus
    def savepoint_written(self, request_id: int, ok: bool = True) -> list[Instruction]:
        """The shell wrote (or failed to write) the savepoint of ``request_id``."""
        stop = self._written.pop(request_id, False)
        return self._end(AppState.TERMINATED) if ok and stop else []

    @stimulus
    def state_reported(self, state: str, now: float, failure: str = "", retryable: bool = False
                       ) -> list[Instruction]:
        """The master answered a state report (``failure``: it did not). One it did not
        answer in time (a fail-over) goes again, for REPORT_RETRY_S; the outcome's report,
        once answered or given up, lets the app's processes stop (a repeated report is
        harmless: the master ignores one that changes nothing)."""
        actions: list[Instruction] = []
        if failure:
            since = self._report_failing_since.setdefault(state, now)
            if retryable and now - since < REPORT_RETRY_S:
                error = self.outcome.error if self.outcome is not None and self.outcome.state == state else None
                return [ReportState(state, error)]
            actions.append(Logged("state_report_failed", "error", (("state", state), ("error", failure))))
        self._report_failing_since.pop(state, None)
        if self.outcome is not None and self.outcome.state == state:
            actions.append(Shutdown("app ended" if state == AppState.SUCCEEDED else f"app {state.lower()}"))
        return actions

    @stimulus
    def fail(self, error: AppError) -> list[Instruction]:
        """Something the shell could not do (load the app, store the epoch, ...) ends the app."""
        return self._end(AppState.FAILED, error) if self.phase is not Phase.ENDING else []

    # -- time -----------------------------------------------------------------------------

    @stimulus
    def tick(self, now: float) -> list[Instruction]:
        """Deadlines (executor heartbeats and registrations, the adoption window) and the
        checkpoint coordinator's clock."""
        if self.phase is Phase.ENDING:
            return []
        actions: list[Instruction] = []
        interval = self.settings.heartbeat_interval_s
        for executor in list(self.executors.values()):
            if executor.lost:
                continue
            if executor.launched_at is not None and now - executor.launched_at > STARTUP_TIMEOUT_S:
                actions += self._lost(executor, f"executor {executor.executor_id} did not register within "
                                                f"{STARTUP_TIMEOUT_S:g} s", now, suspect=True)
            elif executor.registered:
                silent = now - executor.last_heartbeat
                if silent > EXECUTOR_TIMEOUT_HEARTBEATS * interval:
                    actions += self._lost(executor, f"executor {executor.executor_id} on worker "
                                                    f"{executor.worker_id} sent no heartbeat for {silent:.0f} s",
                                          now, suspect=True)
                elif silent > MISSED_HEARTBEATS_LOGGED * interval and not executor.missed_logged:
                    executor.missed_logged = True
                    actions.append(Logged("executor_heartbeat_missed", "warning",
                                          (("executor_id", executor.executor_id), ("silent_s", round(silent, 1)))))
            if self.phase is Phase.ENDING:
                return actions
        if self.phase is Phase.ADOPTING and now >= self._adopt_until:
            actions += self._adopted(now)
        if self.phase is Phase.RUNNING:
            actions += self._checkpointing(self.coordinator.tick(now), now) + self._final_again(now)
        return actions

    def _final_again(self, now: float) -> list[Instruction]:
        """Every REPEAT_AFTER_S after the final checkpoint completed, until every task
        finished, its completion is announced again."""
        latest = self.coordinator.latest()
        if latest is None or not latest.final or not self.unfinished:
            return []
        announced = self._final_announced
        if announced is not None and announced[0] == latest.checkpoint_id and now - announced[1] < cp.REPEAT_AFTER_S:
            return []
        self._final_announced = (latest.checkpoint_id, now)
        if announced is None or announced[0] != latest.checkpoint_id:  # its first announcement went now
            return []
        return [RepeatFinalComplete(latest.checkpoint_id, latest.epoch)]

    # -- invariants ------------------------------------------------------------------------

    def validate(self) -> None:
        """Raise AssertionError if the state is inconsistent (run by the tests)."""
        if self.phase in (Phase.DEPLOYING, Phase.RUNNING):
            hosted = [t for e in self.live_executors() for t in e.tasks]
            assert sorted(hosted) == sorted(self.tasks), f"tasks hosted {sorted(hosted)} != planned"
            assert all(e.registered for e in self.live_executors()), "a deployed executor is not registered"
        assert self.phase is Phase.ENDING or all(not e.tasks for e in self.executors.values() if e.lost), \
            "a lost executor still hosts tasks"
        assert self.unfinished <= set(self.tasks)
        assert all(self.failures[w] >= self.settings.blacklist_after for w in self.blacklist), "blacklisted, no faults"
        assert sum(self.failures.values()) <= self.restarts, (self.failures, self.restarts)  # faults are restarts
        assert self.coordinator.epoch == self.epoch, (self.coordinator.epoch, self.epoch)
        assert sorted(self.tasks) == sorted((p, i) for p, n in self.parallelism.items() for i in range(n))
        assert self.coordinator.tasks == set(self.tasks), (self.coordinator.tasks, self.tasks)
        assert self._rescale is None or self._rescale.applied or self.phase is Phase.RUNNING, self._rescale
        assert self._rescale is None or self._replace is None, (self._rescale, self._replace)
        assert self._replace is None or self._replace.switched_at or self._replace.holding \
            or self.phase is Phase.RUNNING, self._replace
        assert set(self._drop_state) <= set(self.versions), (self._drop_state, self.versions)
        assert all(v > 1 for v in self.versions.values()), self.versions
        assert self._replace is None or not (self._replace.holding and self._replace.switched_at), self._replace
        assert (self.outcome is not None) == (self.phase is Phase.ENDING)
        assert not self.coordinator.parked_at or self.phase in (Phase.RUNNING, Phase.ENDING) and (
            self._rescale is not None or self.phase is Phase.ENDING or self.coordinator.latest() is not None
            and self.coordinator.latest().final), "tasks parked with no change to take them on"
        assert set(self._kept) <= set(self.tasks) and not (self._kept and self.coordinator.parked_at), self._kept

    # -- transitions ----------------------------------------------------------------------

    def _enter(self, phase: Phase) -> None:
        if self.phase is None or phase not in _ALLOWED[self.phase]:
            raise AssertionError(f"app phase {self.phase} -> {phase} is not a transition")
        self.phase = phase

    def _unhosted(self) -> list[TaskKey]:
        hosted = {t for e in self.live_executors() for t in e.tasks}
        return [t for t in self.tasks if t not in hosted]

    def _adopted(self, now: float) -> list[Instruction]:
        """The adoption is over: the app goes on in this AppMaster's epoch (one above its
        predecessor's); tasks nobody hosts get a new executor."""
        self._adopt_until = None
        orphans = self._unhosted()
        actions: list[Instruction] = [Logged("app_adopted", "info", (
            ("executors", len(self.live_executors())), ("orphaned_tasks", len(orphans)),
            ("restore_checkpoint", self._restore.checkpoint_id if self._restore else 0), ("epoch", self.epoch))),
            self._epoch_record()]
        if not orphans:
            self._enter(Phase.DEPLOYING)
            return actions + [self._deployment()]
        self._enter(Phase.ROLLING_BACK)
        return actions + self._new_executor(orphans, set())

    def _lost(self, executor: ExecutorRecord, reason: str, now: float, suspect: bool = False) -> list[Instruction]:
        """An executor is gone (or declared gone): fence it, then roll the app back."""
        if executor.lost or self.phase is Phase.ENDING:
            return []
        executor.lost, executor.suspect, executor.launched_at = True, suspect, None
        actions: list[Instruction] = [Logged("executor_lost", "error", (
            ("executor_id", executor.executor_id), ("worker_id", executor.worker_id), ("reason", reason))),
            Fence(executor.executor_id, executor.worker_id, reason)]
        if self.phase in (Phase.STARTING, Phase.ADOPTING):
            if self.phase is Phase.STARTING:  # still starting: the start-up fails instead
                return actions + self._end(AppState.FAILED, AppError("ExecutorLost", reason,
                                                                     f"executor {executor.executor_id}"))
            executor.tasks = []  # its tasks are orphans: the adoption places them
            return actions
        return actions + self._rollback(reason, executor.worker_id, f"executor {executor.executor_id}", now)

    def _count_failure(self, worker_id: str, reason: str, where: str, cause: AppError | None) -> list[Instruction]:
        """Count a failure on ``worker_id`` (a fault's; "" for none); past the restart budget
        the app ends, with what the last failure (``cause``: a task's, else a lost process's) was."""
        self.restarts += 1
        actions: list[Instruction] = []
        if worker_id:
            self.failures[worker_id] += 1
            if self.failures[worker_id] >= self.settings.blacklist_after and worker_id not in self.blacklist:
                self.blacklist.add(worker_id)
                actions.append(Logged("worker_blacklisted", "warning",
                                      (("worker_id", worker_id), ("failures", self.failures[worker_id]))))
        if self.restarts > self.settings.max_restarts:
            last = cause or AppError("", "", kind=FailureKind.FAULT)
            return actions + self._end(AppState.FAILED, AppError(
                "RestartBudgetExhausted", f"{reason}; gave up after {self.settings.max_restarts} restarts", where,
                last.traceback, last.kind, last.step, last.record, last.location))
        return actions

    def _rollback(self, reason: str, worker_id: str, where: str, now: float,
                  new_code_failed: bool = False, cause: AppError | None = None) -> list[Instruction]:
        """Global recovery: a new epoch; lost executors' tasks get new executors; every task
        restarts from the last completed checkpoint. A replacement not taken over yet is
        dropped; one on trial is rolled back if its code failed (``new_code_failed``), else
        it stays on trial. ``cause``: the task's failure, if a task's."""
        actions = self._count_failure(worker_id, reason, where, cause)
        if self.phase is Phase.ENDING:
            return actions
        if self.phase is not Phase.ROLLING_BACK:
            actions += self._rescale_dropped(f"the app rolled back ({reason})")
            if new_code_failed or self._replace is not None and not self._replace.switched_at:
                actions += self._replace_dropped(f"the app rolled back ({reason})")
            elif self._replace is not None:
                self._replace.proven_at = 0  # what it processed is undone: its trial starts again
            actions += self._new_epoch(self.epoch + 1, self.coordinator.latest(), now)
            actions.append(Logged("rolling_back", "warning", (
                ("reason", reason), ("epoch", self.epoch), ("restarts", self.restarts),
                ("restore_checkpoint", self._restore.checkpoint_id if self._restore else 0))))
            self._enter(Phase.ROLLING_BACK)
            actions.append(self._epoch_record())
        avoid = {e.worker_id for e in self.executors.values() if e.lost and e.suspect and e.tasks}
        for executor in self.executors.values():
            if executor.lost:
                executor.tasks = []
        orphaned = self._unhosted()
        return actions + (self._new_executor(orphaned, avoid) if orphaned else self._deploy_if_placed())

    def _new_epoch(self, epoch: int, restore: cp.CheckpointMeta | None, now: float,
                   changed: Iterable[int] | None = None) -> list[Instruction]:
        """Every task goes on from ``restore`` in ``epoch`` (a rollback, a rescale, a
        replacement): what was in flight is dropped, and no task has finished yet. A
        change's (``changed``: its processors) from the checkpoint the tasks parked at keeps
        every other processor's tasks running (``Deploy.kept``); any other restarts them all."""
        self.epoch = epoch
        parked = changed is not None and restore is not None and restore.checkpoint_id == self.coordinator.parked_at
        self._kept = tuple(task for task in self.tasks if task[0] not in set(changed)) if parked else ()
        actions = self._checkpointing(self.coordinator.restart(epoch, now), now)
        self._restore, self.unfinished, self.watermarks = restore, set(self.tasks), {}
        return actions

    def _new_executor(self, tasks: list[TaskKey], avoid: set[str]) -> list[Instruction]:
        """A new executor (id never used before) for ``tasks``, away from ``avoid``."""
        executor_id = max(self.executors, default=-1) + 1
        self.executors[executor_id] = ExecutorRecord(executor_id, "", list(tasks))
        preferred, allowed = tuple(sorted(self.blacklist | avoid)), tuple(sorted(self.blacklist))
        self.executors[executor_id].fallback_exclude = allowed if allowed != preferred else None
        return [RequestSlot(executor_id, preferred)]

    def _deploy_if_placed(self) -> list[Instruction]:
        """Deploy once every task has a registered, live executor."""
        if self.phase not in (Phase.STARTING, Phase.ROLLING_BACK):
            return []
        if self._unhosted() or not all(e.registered for e in self.live_executors()):
            return []
        self._enter(Phase.DEPLOYING)
        return [self._deployment()]

    def _epoch_record(self) -> StoreEpoch:
        dropping = self._restore.checkpoint_id if self._drop_state and self._restore else 0
        change = self._replace
        trial = (change.processor, change.version, change.previous, change.same_state, change.switched_at) \
            if change is not None and change.switched_at else ()
        return StoreEpoch(self.epoch, self.restarts, self._rescaled(), dropping, *self._code(), trial)

    def _rescaled(self) -> tuple[tuple[int, int], ...]:
        """Each processor's parallelism where it differs from the plan's."""
        return tuple(sorted((p, n) for p, n in self.parallelism.items() if n != self._planned[p]))

    def _restore_parallelism(self) -> tuple[tuple[int, int], ...]:
        """The processors whose snapshots in the checkpoint restored were taken at another
        parallelism than they run at now, and that one (as Deploy's)."""
        taken = collections.Counter(p for p, _ in self._restore.tasks) if self._restore else {}
        return tuple(sorted((p, n) for p, n in taken.items() if n != self.parallelism.get(p, n)))

    def _code(self) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, tuple[str, ...]], ...]]:
        """(the processors running a later version's code, and the state their new code drops of the restore)."""
        return tuple(sorted(self.versions.items())), tuple(sorted(self._drop_state.items()))

    def _deployment(self) -> Deploy:
        return Deploy(self.epoch, self._restore, tuple((e.executor_id, tuple(e.tasks)) for e in self.live_executors()),
                      self._rescaled(), self._restore_parallelism(), *self._code(), self._holding(), self._kept)

    def _holding(self) -> tuple[tuple[int, int], ...]:
        """(processor id, the event time its tasks hold records from), for a replacement
        at an event time that has not taken over yet (as Deploy's ``hold_from``)."""
        change = self._replace
        return ((change.processor, change.at_ms),) if change is not None and change.holding else ()

    def _rescale_if_due(self, now: float) -> list[Instruction]:
        """The rescale's checkpoint completed: every task goes on from it in a new epoch,
        the rescaled processors' new tasks placed anew, each restoring the key groups it
        owns from the old tasks' snapshots (Deploy's ``restore_parallelism``)."""
        change = self._rescale
        if change is None or change.applied or (latest := self._change_from(change)) is None:
            return []
        if latest.final:
            return self._rescale_dropped("the app's tasks have ended")
        change.previous = {p: self.parallelism[p] for p in change.parallelism}
        self._retask(change.parallelism)
        actions = self._new_epoch(self.epoch + 1, latest, now, change.parallelism)
        logged = (("parallelism", self._parallelisms(change.parallelism)), ("epoch", self.epoch),
                  ("from_checkpoint", latest.checkpoint_id), ("tasks_kept_running", len(self._kept)))
        self._enter(Phase.DEPLOYING)
        return [Logged("rescaling", "info", logged)] + actions + [self._epoch_record(), self._deployment()]

    def _change_from(self, change: _Rescale | _Replace) -> cp.CheckpointMeta | None:
        """The completed checkpoint ``change`` goes on from, once due (None: not yet): its
        parking checkpoint, after which nothing else is triggered."""
        latest = self.coordinator.latest()
        if latest is None or not change.first_checkpoint or latest.checkpoint_id < change.first_checkpoint \
                or self.phase is not Phase.RUNNING:
            return None
        return latest

    def _retask(self, parallelism: dict[int, int]) -> None:
        """These processors run at this parallelism from now on (a new epoch follows, before
        their deployment), their tasks placed anew; the others stay where they are."""
        before = {processor: self.parallelism[processor] for processor in parallelism}
        self.parallelism.update(parallelism)
        self.tasks = tuple((p, i) for p in sorted(self.parallelism) for i in range(self.parallelism[p]))
        sources = {p for p, _ in self.coordinator.sources}
        self.coordinator.retask(self.tasks, [t for t in self.tasks if t[0] in sources])
        self._place(parallelism, before)

    def input_watermarks(self, watermarks: dict[TaskKey, int], now: float,
                         latest_events: dict[TaskKey, int] | None = None) -> list[Instruction]:
        """Tasks' input watermarks as reported (of the current epoch), and the highest event
        time of a record each processed: a replacement holding records from an event time
        takes over once its processor's watermark passed it."""
        self.watermarks.update(watermarks)
        self.latest_events.update(latest_events or {})
        change = self._replace
        if change is None or not change.holding or change.first_checkpoint or self.phase is not Phase.RUNNING:
            return []
        tasks = [t for t in self.tasks if t[0] == change.processor]
        if not all(self.watermarks.get(t, change.at_ms - 1) >= change.at_ms for t in tasks):
            return []
        change.first_checkpoint, checkpointing = self._parking_checkpoint(now)
        return [Logged("replace_watermark_passed", "info", (("processor", self._named(change.processor)),
                                                           ("at_ms", change.at_ms)))] + checkpointing

    def _switch_if_due(self, now: float) -> list[Instruction]:
        """The replacement's (parking) checkpoint completed: the app goes on from it in a new
        epoch, the replaced processor's tasks restored with the new code (nothing is placed
        anew), the others in place; with an event time, first with the old code holding
        records from it (:meth:`input_watermarks`)."""
        change = self._replace
        if change is None or change.switched_at or (latest := self._change_from(change)) is None:
            return []
        if latest.final:
            return self._replace_dropped("the app's tasks have ended")
        if change.at_ms and not change.holding:
            change.holding, change.first_checkpoint = True, 0
            event = "replace_holding"
        else:
            change.switched_at, change.holding = latest.checkpoint_id, False
            self.versions[change.processor] = change.version
            if change.dropped:
                self._drop_state = {change.processor: change.dropped}
            event = "replacing"
        actions = self._new_epoch(self.epoch + 1, latest, now, (change.processor,))
        self._enter(Phase.DEPLOYING)
        logged = (("processor", self._named(change.processor)), ("version", change.version), ("epoch", self.epoch),
                  ("from_checkpoint", latest.checkpoint_id), ("dropped_state", ", ".join(change.dropped)),
                  ("at_ms", change.at_ms))
        return actions + [Logged(event, "info", logged), self._epoch_record(), self._deployment()]

    def _replace_dropped(self, why: str) -> list[Instruction]:
        """The replacement cannot go on: not taken over yet, it is answered with why; on
        trial, the processor goes back to the code it ran (the rollback that follows
        restores the checkpoint the new code took over from). The app runs on."""
        change = self._replace
        if change is None:
            return []
        self._replace = None  # records held go to the old code: the tasks restoring them process them
        if not change.switched_at:
            return [AnswerReplace(change.request_id, f"version {change.version} not taken over: {why}")]
        if change.previous > 1:
            self.versions[change.processor] = change.previous
        else:
            self.versions.pop(change.processor, None)
        self._drop_state = {}
        return [Logged("replace_rolled_back", "warning", (("processor", self._named(change.processor)),
                                                           ("version", change.version), ("reason", why))),
                AnswerReplace(change.request_id, f"version {change.version} rolled back to version "
                                                 f"{change.previous}: {why}", rolled_back=True)]

    def _place(self, changed: dict[int, int], before: dict[int, int]) -> None:
        """The rescaled processors' tasks (at ``before`` until now), placed anew on the live
        executors (the others stay): each where the old task that owned most of its key
        groups ran, whose local copies of the state on disk it can then take (see
        gearbus/runtime/local_copies.py), while that executor holds less than its share of
        the processor's tasks; else by the placement rule."""
        live = sorted(self.live_executors(), key=lambda e: e.executor_id)
        hosts = {task: executor for executor in live for task in executor.tasks if task[0] in changed}
        for executor in live:
            executor.tasks = [t for t in executor.tasks if t[0] not in changed]
        for processor in sorted(changed):
            count, placed = changed[processor], collections.Counter()
            for index in range(count):
                target = hosts.get((processor, _most_groups_of(index, count, before[processor])))
                if target is None or placed[target.executor_id] >= -(-count // len(live)):
                    target = live[index % len(live)] if self.settings.placement == "by_index" else \
                        min(live, key=lambda e: (len(e.tasks), e.executor_id))
                target.tasks.append((processor, index))
                placed[target.executor_id] += 1

    def _named(self, processor: int) -> str:
        return self.names.get(processor) or f"processor {processor}"


    def _parallelisms(self, parallelism: dict[int, int]) -> str:
        return ", ".join(f"{self._named(p)}: {n}" for p, n in sorted(parallelism.items()))

    def _rescale_dropped(self, why: str) -> list[Instruction]:
        """The rescale asked for cannot go on (its checkpoint failed, the app rolled back or
        ends before it was applied): answered with why; the app runs on as it was. Once
        applied, the new parallelism stands: a rollback restores it again."""
        change = self._rescale
        if change is None or change.applied:
            return []
        self._rescale = None
        return [AnswerRescale(change.request_id,
                              f"rescale to {self._parallelisms(change.parallelism)} not done: {why}")]

    def _rescale_undone(self, why: str) -> list[Instruction]:
        """The rescale being deployed was refused (its state could not be divided as its
        tasks restored it): the processors go back to their parallelism before, answered
        with why (the rollback that follows deploys them)."""
        change = self._rescale
        if change is None or not change.applied:
            return []
        self._rescale = None
        self._retask(change.previous)
        return [AnswerRescale(change.request_id, f"rescale to {self._parallelisms(change.parallelism)} undone, "
                                                 f"back to {self._parallelisms(change.previous)}: {why}")]

    def _checkpointing(self, actions: list[cp.Action], now: float) -> list[Instruction]:
        """Pass the coordinator's actions on; answer savepoints whose checkpoint ended, and
        end the app when checkpoints keep failing. A parking checkpoint that failed leaves
        the tasks parked: the app rolls back."""
        out: list[Instruction] = []
        for action in actions:
            if isinstance(action, cp.FailApplication):  # taken here: the app ends
                out += self._end(AppState.FAILED, AppError("CheckpointsFailing", action.reason,
                                                           "checkpoint coordinator"))
                continue
            out.append(action)
            if isinstance(action, cp.NotifyComplete):
                out += self._savepoints_ended(action.checkpoint_id, self.coordinator.latest(), "")
                self._drop_state = {}  # taken by the tasks running now
                trial = self._replace
                if trial is not None and trial.switched_at and (
                        action.final or trial.proven_at and action.checkpoint_id >= trial.proven_at
                        or not trial.same_state and action.checkpoint_id > trial.switched_at):
                    self._replace = None  # the new code passed its trial
                    out += [Logged("replaced", "info", (("processor", self._named(trial.processor)),
                                                        ("version", trial.version))),
                            AnswerReplace(trial.request_id)]
            elif isinstance(action, cp.AbandonCheckpoint):
                out += self._savepoints_ended(action.checkpoint_id, None, action.reason)
                if self._rescale is not None and action.checkpoint_id >= self._rescale.first_checkpoint:
                    out += self._rescale_dropped(f"its checkpoint {action.checkpoint_id} failed: {action.reason}")
                change = self._replace
                if change is not None and not change.switched_at and change.first_checkpoint \
                        and action.checkpoint_id >= change.first_checkpoint:  # records held go to the old code
                    out += self._replace_dropped(f"its checkpoint {action.checkpoint_id} failed: {action.reason}")
                failing = any(isinstance(later, cp.FailApplication) for later in actions)  # then it ends, parked
                if action.checkpoint_id == self.coordinator.parked_at and self.phase is Phase.RUNNING and not failing:
                    out += self._rollback(f"the tasks parked at checkpoint {action.checkpoint_id}, which failed: "
                                          f"{action.reason}", "", "recovery", now)
        return out

    def _savepoints_ended(self, checkpoint_id: int, meta: cp.CheckpointMeta | None,
                          reason: str) -> list[Instruction]:
        answers: list[Instruction] = []
        for request_id, (first_id, stop) in list(self._savepoints.items()):
            if checkpoint_id < first_id:
                continue
            del self._savepoints[request_id]
            if meta is not None:
                self._written[request_id] = stop
                answers.append(AnswerSavepoint(request_id, meta))
            else:
                answers.append(AnswerSavepoint(request_id, error=f"the savepoint's checkpoint {checkpoint_id} "
                                                                 f"failed: {reason}"))
        return answers

    def _end(self, state: str, error: AppError | None = None) -> list[Instruction]:
        if self.phase is Phase.ENDING:
            return []
        self.phase = Phase.ENDING  # from any phase
        self.outcome = EndApp(state, error)
        failed = [AnswerSavepoint(r, error=f"the app ended ({state})") for r in self._savepoints]
        self._savepoints.clear()
        failed += self._rescale_dropped(f"the app ended ({state})")
        if self._rescale is not None:  # applied, not yet deployed: it will not be
            failed.append(AnswerRescale(self._rescale.request_id, f"the app ended ({state})"))
            self._rescale = None
        if self._replace is not None:
            failed.append(AnswerReplace(self._replace.request_id, f"the app ended ({state})"))
            self._replace = None
        return failed + [self.outcome, ReportState(state, error)]
