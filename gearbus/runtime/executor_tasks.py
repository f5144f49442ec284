"""The tasks an executor hosts, and their lives: a state machine without I/O, driven by
the executor process (services/executor/executor.py) and by the TestRunner's in-process
engine's in-memory executors alike, so a task fails, declines or commits the same way in both.

The executor's async shell feeds it events (the AppMaster launches the tasks of an epoch,
starts them, triggers and completes checkpoints; a task snapshots, its snapshot is stored
or declined, it ends, a commit succeeds or fails, its loop returns with or without an
error; the executor is stopped, fenced, or its AppMaster went silent) and carries out the
instructions it returns (open, start and retire task runners, inject barriers, store
snapshots, acknowledge or decline checkpoints, commit, report, exit). It never awaits,
reads a clock or touches NATS, so every ordering of events is tested without a network
(as the AppMaster's and the master's machines are).

An executor runs the tasks of one epoch (one attempt of the app) at a time: a launch of a
newer epoch retires every task of the older one, whose later events change nothing and
are never reported, but those it keeps running (a rescale of other processors): each must
have parked here at the checkpoint the launch goes on from (it snapshotted with ``park``);
it is rewired for the new epoch (RewireTasks), commits that checkpoint if not asked yet,
and resumes when the tasks start (ResumeTasks; one that had ended reports it again). Each task of the current epoch is in one phase; ``_ALLOWED`` enforces
the moves::

    phase      event                                    -> phase      instructions
    (new)      launch tasks of a newer epoch            OPENING    [RewireTasks], RetireTasks(older), OpenTasks
    RUNNING,   launch keeps it running (parked)         (same)     RewireTasks, ... [+ Commit after OpenTasks];
    ENDED                                                            at start all, ResumeTasks [+ ReportEnded]
    OPENING    opened                                   LAUNCHED
    LAUNCHED   start all                                RUNNING    StartTasks
    RUNNING    end of stream passed (or restored ended) ENDED      ReportEnded
    ENDED      the final checkpoint committed           FINISHING  StopTask (its loop returns)
    FINISHING  loop returned                            FINISHED   ReportFinished
    RUNNING,   loop returned with an error,             FAILED     ReportFailed [+ StopTask]
    ENDED,       or a commit failed
    FINISHING
    any        launch failed, stop, fenced, AppMaster   STOPPED    RetireTasks [+ Exit]
                 silent

Checkpoints, whatever the phase (but STOPPED): a snapshot taken is stored
(StoreSnapshot), then acknowledged (AckCheckpoint, kept for the last ``ACKS_KEPT``
checkpoints to repeat when a trigger is repeated) or declined (DeclineCheckpoint). A
completed checkpoint is committed (Commit) by every task that acknowledged it and has not
committed it or a later one: never beyond the last checkpoint the task acknowledged.

One end stays outside the machine: when the worker that launched the process dies, the
heartbeat thread reports the executor stopped and exits at once, whatever the task loop
is doing (see heartbeat.py); its exit code is kept here with the others.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from gearbus.runtime.core import Snapshot
from gearbus.runtime.keygroups import unserialisable_part
from shared.messages import AppError, LaunchTasks, TaskId

ACKS_KEPT = 4  # checkpoints whose acks an executor can repeat
EXIT_APPMASTER_GONE = 3  # the process's exit codes, one per cause (docs/protocol.md)
EXIT_FENCED = 4
EXIT_WORKER_GONE = 5
NO_EPOCH = -1  # no task launched yet


def unserialisable(task_name: str, exc: BaseException, state) -> str:
    """Why a task declines a checkpoint whose snapshot ``state`` it cannot serialise: the
    step, the entry (its key) and the type, where they can be found."""
    where = unserialisable_part(state)
    return f"the state of {task_name} cannot be serialised{f' ({where})' if where else ''}: " \
           f"{type(exc).__name__}: {exc}"


class Phase(enum.Enum):
    OPENING = "opening"      # its runner is being created (restored) and subscribed
    LAUNCHED = "launched"    # subscribed to its inbox; not started
    RUNNING = "running"
    ENDED = "ended"          # past its end of stream: passes barriers on and commits until the final checkpoint
    FINISHING = "finishing"  # the final checkpoint committed: its loop is asked to return
    FINISHED = "finished"    # reported finished
    FAILED = "failed"        # reported failed
    STOPPED = "stopped"      # retired without a report (a launch failed, or the executor stops)


_ALLOWED: dict[Phase, frozenset[Phase]] = {
    Phase.OPENING: frozenset({Phase.LAUNCHED, Phase.STOPPED}),
    Phase.LAUNCHED: frozenset({Phase.RUNNING, Phase.STOPPED}),
    Phase.RUNNING: frozenset({Phase.ENDED, Phase.FAILED, Phase.STOPPED}),
    Phase.ENDED: frozenset({Phase.FINISHING, Phase.FAILED, Phase.STOPPED}),
    Phase.FINISHING: frozenset({Phase.FINISHED, Phase.FAILED, Phase.STOPPED}),
    Phase.FINISHED: frozenset({Phase.STOPPED}),
    Phase.FAILED: frozenset({Phase.STOPPED}),
    Phase.STOPPED: frozenset(),
}

_LOOPING = (Phase.RUNNING, Phase.ENDED, Phase.FINISHING)  # a loop whose return is reported


# -- instructions: what the shell carries out -------------------------------------------------

@dataclass(frozen=True)
class RetireTasks:
    """Stop these tasks' loops and close their subscriptions, without reports."""
    tasks: tuple[TaskId, ...]


@dataclass(frozen=True)
class OpenTasks:
    """Create the runners ``launch`` asks for (restored from its checkpoint) and open their
    inboxes; if that fails, call ``launch_failed``."""
    launch: LaunchTasks

    @property
    def tasks(self) -> list[TaskId]:
        """The tasks to open: the launch's, but those it keeps running (rewired instead)."""
        return [task for task in self.launch.tasks if task not in self.launch.keep_running]


@dataclass(frozen=True)
class RewireTasks:
    """These parked tasks go on in ``epoch``: rewire their channels for the launch's
    plan (before its new tasks open), keeping their state."""
    tasks: tuple[TaskId, ...]
    epoch: int


@dataclass(frozen=True)
class StartTasks:
    tasks: tuple[TaskId, ...]


@dataclass(frozen=True)
class ResumeTasks:
    """These rewired tasks take input again (what came meanwhile first)."""
    tasks: tuple[TaskId, ...]


@dataclass(frozen=True)
class InjectBarrier:
    """Sources inject the barrier of ``checkpoint_id`` (again is harmless); ``park``: every
    task parks after its snapshot."""
    tasks: tuple[TaskId, ...]
    checkpoint_id: int
    park: bool = False


@dataclass(frozen=True)
class StoreSnapshot:
    """Serialise the snapshot now (the task goes on changing its state) and store it; then
    call ``snapshot_stored`` or ``snapshot_declined``."""
    task: TaskId
    epoch: int
    snapshot: Snapshot
    alignment_s: float = 0.0  # how long the task aligned the barrier before it snapshotted


@dataclass(frozen=True)
class AckCheckpoint:
    task: TaskId
    epoch: int
    checkpoint_id: int
    size_bytes: int
    ended: bool
    alignment_s: float = 0.0
    root: int = 0  # the checkpoint whose whole snapshot the stored one's chain starts from
    depth: int = 0  # snapshots between the stored one and its root
    records_in: int = 0  # what the task processed in its epoch before the barrier


@dataclass(frozen=True)
class DeclineCheckpoint:
    task: TaskId
    epoch: int
    checkpoint_id: int
    reason: str


@dataclass(frozen=True)
class Commit:
    """Commit what the task sealed up to ``checkpoint_id`` (one commit of a task at a time,
    in order); then call ``committed`` or ``commit_failed``."""
    task: TaskId
    checkpoint_id: int
    final: bool


@dataclass(frozen=True)
class StopTask:
    """Ask the task's loop to return (it then calls ``task_done``)."""
    task: TaskId


@dataclass(frozen=True)
class ReportEnded:
    task: TaskId
    epoch: int


@dataclass(frozen=True)
class ReportFinished:
    task: TaskId
    epoch: int


@dataclass(frozen=True)
class ReportFailed:
    task: TaskId
    epoch: int
    error: AppError
    recoverable: bool


@dataclass(frozen=True)
class Exit:
    code: int
    reason: str


Instruction = (RetireTasks | RewireTasks | OpenTasks | StartTasks | ResumeTasks | InjectBarrier | StoreSnapshot
               | AckCheckpoint
               | DeclineCheckpoint | Commit | StopTask | ReportEnded | ReportFinished | ReportFailed | Exit)


class LaunchRefused(Exception):
    """A launch of an older epoch than the one this executor runs, or while it exits."""


@dataclass
class _Task:
    phase: Phase = Phase.OPENING
    source: bool = False
    snapshotted: int = 0  # the last checkpoint it snapshotted
    acked: int = 0  # the last checkpoint it acknowledged
    commit_asked: int = 0  # the last checkpoint it was told to commit
    committed: int = 0  # the last checkpoint it committed
    final_committed: bool = False
    parked: int = 0  # the checkpoint it parked after (0: not parked)
    resuming: bool = False  # kept running by a launch: resumes when the tasks start


class ExecutorTasks:
    """The tasks of the current epoch in one executor; see the module docstring. The
    heartbeat thread calls ``finished``: events replace ``_tasks``, never resize it."""

    def __init__(self) -> None:
        self.epoch = NO_EPOCH
        self.exit_code = 0  # the exit decided (0: none)
        self._tasks: dict[TaskId, _Task] = {}
        self._acks: dict[int, list[AckCheckpoint]] = {}  # by checkpoint id: to repeat

    # -- queries ---------------------------------------------------------------------------

    def phase(self, task: TaskId) -> Phase | None:
        state = self._tasks.get(task)
        return state.phase if state else None

    def hosted(self) -> list[TaskId]:
        """The tasks opened here and not retired, in launch order."""
        return [task for task, state in self._tasks.items() if state.phase not in (Phase.OPENING, Phase.STOPPED)]

    def finished(self, task: TaskId) -> bool:
        """The task's final checkpoint committed."""
        state = self._tasks.get(task)
        return bool(state and state.final_committed)

    # -- events ----------------------------------------------------------------------------

    def launch(self, launch: LaunchTasks, sources: Iterable[TaskId]) -> list[Instruction]:
        """Run the launch's tasks (``sources`` among them read a source) in its epoch: the
        tasks of an older epoch retire; the same launch again changes nothing. Raises
        LaunchRefused for an older epoch, or once the executor exits."""
        if self.exit_code:
            raise LaunchRefused(f"is exiting; launch of attempt {launch.epoch} refused")
        if launch.epoch < self.epoch:
            raise LaunchRefused(f"already runs attempt {self.epoch}; launch of attempt {launch.epoch} refused")
        if launch.epoch == self.epoch:
            return []
        kept = tuple(launch.keep_running)
        unparked = [f"{t.processor}.{t.index}" for t in kept if t not in launch.tasks or t not in self._tasks
                    or self._tasks[t].phase not in (Phase.RUNNING, Phase.ENDED)
                    or not self._tasks[t].parked or self._tasks[t].parked != launch.restore_checkpoint]
        if unparked:
            raise LaunchRefused(f"does not run tasks {', '.join(unparked)} parked at checkpoint "
                                f"{launch.restore_checkpoint}: it cannot keep them running")
        retire = self._retire(keep=set(kept))
        sources = set(sources)
        self.epoch = launch.epoch
        self._tasks = {task: self._tasks[task] if task in kept else _Task(source=task in sources)
                       for task in launch.tasks}
        commits: list[Instruction] = []
        for task in kept:
            state = self._tasks[task]
            state.parked, state.resuming = 0, True
            if state.commit_asked < launch.restore_checkpoint <= state.acked:  # its CheckpointComplete may be late
                state.commit_asked = launch.restore_checkpoint
                commits.append(Commit(task, launch.restore_checkpoint, False))
        rewire: list[Instruction] = [RewireTasks(kept, launch.epoch)] if kept else []  # first: in the new
        # epoch before the shell awaits the retirement, so none of their reports meanwhile goes unheard
        return rewire + retire + [OpenTasks(launch)] + commits

    def opened(self, epoch: int) -> None:
        """The runners of ``epoch`` are open: they can start."""
        if epoch != self.epoch:
            return
        for state in self._tasks.values():
            if state.phase is Phase.OPENING:
                self._enter(state, Phase.LAUNCHED)

    def launch_failed(self, epoch: int) -> list[Instruction]:
        """Opening the tasks of ``epoch`` failed: retire what was opened; none runs here."""
        return self._retire() if epoch == self.epoch else []

    def start_all(self) -> list[Instruction]:
        starting = [task for task, state in self._tasks.items() if state.phase is Phase.LAUNCHED]
        for task in starting:
            self._enter(self._tasks[task], Phase.RUNNING)
        resuming = [task for task, state in self._tasks.items() if state.resuming and state.phase in _LOOPING]
        for task in resuming:
            self._tasks[task].resuming = False
        actions: list[Instruction] = [StartTasks(tuple(starting))] if starting else []
        actions += [ResumeTasks(tuple(resuming))] if resuming else []
        return actions + [ReportEnded(task, self.epoch) for task in resuming if self._tasks[task].phase is Phase.ENDED]

    def trigger(self, epoch: int, checkpoint_id: int, park: bool = False) -> list[Instruction]:
        """A checkpoint is triggered (again, if acks went missing: they are repeated)."""
        if epoch != self.epoch:
            return []
        sources = tuple(task for task, state in self._tasks.items()
                        if state.source and state.phase in (Phase.LAUNCHED, Phase.RUNNING, Phase.ENDED))
        inject: list[Instruction] = [InjectBarrier(sources, checkpoint_id, park)] if sources else []
        return inject + list(self._acks.get(checkpoint_id, ()))

    def snapshot_taken(self, task: TaskId, epoch: int, snapshot: Snapshot, alignment_s: float = 0.0
                       ) -> list[Instruction]:
        state = self._live(task, epoch)
        if state is None:
            return []
        state.snapshotted = max(state.snapshotted, snapshot.checkpoint_id)
        if snapshot.park:
            state.parked = snapshot.checkpoint_id
        return [StoreSnapshot(task, epoch, snapshot, alignment_s)]

    def snapshot_stored(self, task: TaskId, epoch: int, checkpoint_id: int, size_bytes: int,
                        ended: bool, alignment_s: float = 0.0, root: int = 0, depth: int = 0,
                        records_in: int = 0) -> list[Instruction]:
        state = self._live(task, epoch)
        if state is None:
            return []
        state.acked = max(state.acked, checkpoint_id)
        ack = AckCheckpoint(task, epoch, checkpoint_id, size_bytes, ended, alignment_s, root, depth, records_in)
        self._acks.setdefault(checkpoint_id, []).append(ack)
        for old in sorted(self._acks)[:-ACKS_KEPT]:
            del self._acks[old]
        return [ack]

    def snapshot_declined(self, task: TaskId, epoch: int, checkpoint_id: int, reason: str) -> list[Instruction]:
        if self._live(task, epoch) is None:
            return []
        return [DeclineCheckpoint(task, epoch, checkpoint_id, reason)]

    def task_ended(self, task: TaskId, epoch: int) -> list[Instruction]:
        state = self._live(task, epoch)
        if state is None or state.phase is not Phase.RUNNING:
            return []
        self._enter(state, Phase.ENDED)
        return [ReportEnded(task, epoch)]

    def checkpoint_complete(self, epoch: int, checkpoint_id: int, final: bool) -> list[Instruction]:
        """Every task that acknowledged the checkpoint commits it (once, in order)."""
        if epoch != self.epoch:
            return []
        commits: list[Instruction] = []
        for task, state in self._tasks.items():
            if state.phase is not Phase.STOPPED and state.commit_asked < checkpoint_id <= state.acked:
                state.commit_asked = checkpoint_id
                commits.append(Commit(task, checkpoint_id, final))
        return commits

    def committed(self, task: TaskId, epoch: int, checkpoint_id: int, final: bool) -> list[Instruction]:
        """A commit succeeded; after the final checkpoint an ended task is finished."""
        state = self._live(task, epoch)
        if state is None:
            return []
        state.committed = max(state.committed, checkpoint_id)
        if not (final and state.phase is Phase.ENDED):
            return []
        state.final_committed = True
        self._enter(state, Phase.FINISHING)
        return [StopTask(task)]

    def commit_failed(self, task: TaskId, epoch: int, error: AppError) -> list[Instruction]:
        """A commit failed: the task stops and fails, recoverably (a rollback commits again)."""
        state = self._live(task, epoch)
        if state is None or state.phase not in _LOOPING:
            return []
        self._enter(state, Phase.FAILED)
        return [StopTask(task), ReportFailed(task, epoch, error, True)]

    def task_done(self, task: TaskId, epoch: int, error: AppError | None, recoverable: bool) -> list[Instruction]:
        """The task's loop returned: finished if asked to after its final checkpoint, failed
        if with an error; a retired or already failed task reports nothing."""
        state = self._live(task, epoch)
        if state is None or state.phase not in _LOOPING:
            return []
        if error is not None:
            self._enter(state, Phase.FAILED)
            return [ReportFailed(task, epoch, error, recoverable)]
        self._enter(state, Phase.FINISHED)
        return [ReportFinished(task, epoch)]

    def stop(self) -> list[Instruction]:
        """The executor closes: every task retires."""
        return self._retire()

    def fenced(self, reason: str) -> list[Instruction]:
        """The AppMaster declared this executor lost and replaced it."""
        return self._retire() + self._exit(EXIT_FENCED, reason)

    def appmaster_gone(self, reason: str) -> list[Instruction]:
        """The AppMaster has not answered heartbeats past the deadline: the app is gone."""
        return self._retire() + self._exit(EXIT_APPMASTER_GONE, reason)

    # -- invariants ------------------------------------------------------------------------

    def validate(self) -> None:
        """Raise AssertionError if the machine's state is inconsistent (run by tests)."""
        assert self.epoch >= NO_EPOCH
        assert self.epoch > NO_EPOCH or not self._tasks, self._tasks
        for task, state in self._tasks.items():
            assert state.committed <= state.commit_asked <= state.acked <= state.snapshotted, (task, state)
            assert state.parked <= state.snapshotted and not (state.parked and state.resuming), (task, state)
            assert state.final_committed == (state.phase in (Phase.FINISHING, Phase.FINISHED)) \
                or state.phase in (Phase.FAILED, Phase.STOPPED), (task, state)
        assert len(self._acks) <= ACKS_KEPT
        for checkpoint_id, acks in self._acks.items():
            for ack in acks:
                assert ack.epoch == self.epoch and ack.checkpoint_id == checkpoint_id, ack
                assert ack.checkpoint_id <= self._tasks[ack.task].acked, ack
        assert self.exit_code == 0 or all(s.phase is Phase.STOPPED for s in self._tasks.values())

    # -- transitions -----------------------------------------------------------------------

    def _live(self, task: TaskId, epoch: int) -> _Task | None:
        """The task, if it is of the current epoch and not retired."""
        state = self._tasks.get(task) if epoch == self.epoch else None
        return state if state is not None and state.phase is not Phase.STOPPED else None

    @staticmethod
    def _enter(state: _Task, phase: Phase) -> None:
        if phase not in _ALLOWED[state.phase]:
            raise AssertionError(f"task phase {state.phase} -> {phase} is not a transition")
        state.phase = phase

    def _retire(self, keep: set[TaskId] = frozenset()) -> list[Instruction]:
        self._acks.clear()
        retiring = tuple(task for task, state in self._tasks.items()
                         if state.phase is not Phase.STOPPED and task not in keep)
        for task in retiring:
            self._enter(self._tasks[task], Phase.STOPPED)
        return [RetireTasks(retiring)] if retiring else []

    def _exit(self, code: int, reason: str) -> list[Instruction]:
        if self.exit_code:
            return []
        self.exit_code = code
        return [Exit(code, reason)]
