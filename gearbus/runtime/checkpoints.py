"""The checkpoint coordinator: a state machine without I/O.

Aligned checkpoints as Flink takes them, with global rollback on failure. The
coordinator decides; a shell acts: the AppMaster's (over NATS, on the monotonic clock)
and the TestRunner's in-process engine (in memory, on a clock it advances). Every event
method takes ``now`` (seconds, read by the shell) and returns a list of actions (frozen
dataclasses below) for the shell to carry out; the coordinator never sleeps, never
reads a clock and never touches NATS, so every transition is tested without a network
(dask's WorkerState: events in, actions out).

At most one checkpoint is in flight. Its phase moves along this table (``_ALLOWED``
enforces it)::

    phase      event                                -> phase      actions
    IDLE       tick: interval due, or final due     IN_FLIGHT   TriggerCheckpoint
    IDLE       task_ended: the last task ended      IN_FLIGHT   TriggerCheckpoint
    IN_FLIGHT  tick, REPEAT_AFTER_S since the last  IN_FLIGHT   RetriggerCheckpoint
                 trigger (it may have been lost)
    IN_FLIGHT  ack from the last task               STORING     StoreCheckpoint
    IN_FLIGHT  decline, or tick past timeout_s      IDLE        AbandonCheckpoint [+ FailApplication]
    STORING    stored                               IDLE        NotifyComplete [+ PruneCheckpoints]
    STORING    store_failed                         IDLE        AbandonCheckpoint [+ FailApplication]
    any        restart (global recovery)            IDLE        AbandonCheckpoint("recovery") if one was in flight

A checkpoint asked for with ``park`` (a change's: :meth:`CheckpointCoordinator.request`)
triggers with it: the tasks park after their snapshot, so nothing more is triggered until
the next epoch (:meth:`CheckpointCoordinator.restart`), which the change, or the rollback
when that checkpoint fails, begins.

Beside that table, one compaction at a time, sized like a tiered LSM's. A chain's depth
counts here at most the checkpoints since the last compaction (the acks of those taken
before the tasks heard of it still count the chains it cut). A stored checkpoint whose
chains are ``compact_depth`` deep, or at least MIN_COMPACT_DEPTH deep and holding, since
the whole snapshots they start from, at least COMPACT_SHARE of those whole snapshots'
bytes (the last whole checkpoint's, or what the last compaction wrote), gets CompactCheckpoint for
every task whose
snapshot builds on another (the shell replaces those snapshots with whole ones, off the
tasks' path); ``compacted`` ends it: the checkpoint now needs nothing older, and every
later NotifyComplete names it so the tasks build shorter chains. What is older goes once
no kept checkpoint reads it and no task's last ack names an older root (a task's roots
never go down: one that has not heard of the compaction yet may still build on the older
chain). A checkpoint being compacted is never pruned.

Every triggered checkpoint therefore ends in exactly one NotifyComplete or one
AbandonCheckpoint, so the shell has a single place to commit or discard what was written
for it. Whenever the coordinator returns to IDLE while every task has ended and no final
checkpoint has completed, it triggers the final checkpoint at once (Flink's FLIP-147):
the tasks snapshot their ended state, and its NotifyComplete says ``final=True`` so the
shell lets the sinks commit and the application finish.

Events that do not fit (an ack of another epoch or of a stale id, a duplicate, an unknown
task) are not errors: messages race with timeouts and recoveries. They return ``[]`` and
are counted in :attr:`CheckpointCoordinator.ignored`.

The last :data:`HISTORY_KEPT` checkpoints, whatever became of them, are kept as
:class:`CheckpointRecord` (Flink's checkpoint history): what ``gearbus status``, the REST
API, ``/metrics`` and the dashboard show.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from gearbus.runtime.task_key import TaskKey

#: The shortest chain a compaction replaces: rewriting the whole state to drop one
#: snapshot's worth of reading costs more than it saves.
MIN_COMPACT_DEPTH = 2
#: The bytes of a chain's changes, as a share of the whole snapshots it starts from, at
#: which it is compacted. The store then holds at most about two and a half whole states
#: (the old whole snapshots, which kept checkpoints still read, their changes, the new
#: whole ones), and a restore reads at most one and a half. At 1 the store's median was
#: 3.3 times one whole snapshot and its peaks 3.9 (bench/state.py --store-seconds).
COMPACT_SHARE = 0.5

#: Checkpoints kept in the history (the newest; in progress, completed or failed).
HISTORY_KEPT = 20
#: A checkpoint in flight this long since its trigger was sent is triggered again: control
#: messages are core NATS, and a server restart can lose them (or the acks they answer).
REPEAT_AFTER_S = 1.0


class Outcome(enum.Enum):
    """What became of a checkpoint."""
    IN_PROGRESS = "in_progress"  # triggered; not every task acknowledged it, or it is being stored
    COMPLETED = "completed"
    FAILED = "failed"  # abandoned: declined, timed out, not stored, or dropped by a recovery


@dataclass(frozen=True)
class CheckpointRecord:
    """One checkpoint as a user sees it: when it started (the coordinator's ``now``), how
    long it took until it completed or failed (None while in progress), the longest barrier
    alignment among the tasks that acknowledged it, and each of those tasks' snapshot size."""

    checkpoint_id: int
    epoch: int
    outcome: Outcome
    started_at: float
    duration_s: float | None = None
    alignment_s: float = 0.0
    task_sizes: tuple[tuple[TaskKey, int], ...] = ()  # sorted by task
    failure: str = ""

    @property
    def size_bytes(self) -> int:
        return sum(size for _, size in self.task_sizes)


@dataclass(frozen=True)
class CheckpointMeta:
    """A completed (or completing) checkpoint, as written to KV and restored from.

    ``started_at`` is the coordinator's ``now`` when it was triggered and ``duration_s``
    the time until the last task acknowledged it; ``final`` means every task had ended.
    """

    checkpoint_id: int
    epoch: int
    started_at: float
    duration_s: float
    size_bytes: int
    tasks: tuple[TaskKey, ...]  # sorted
    final: bool
    root: int = 0  # the oldest checkpoint whose snapshots its tasks' build on (0: none before it)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for msgpack/JSON (the shell writes it to KV)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckpointMeta:
        """The inverse of :meth:`to_dict`; accepts the lists msgpack gives back for tuples."""
        return cls(
            checkpoint_id=int(data["checkpoint_id"]), epoch=int(data["epoch"]),
            started_at=float(data["started_at"]), duration_s=float(data["duration_s"]),
            size_bytes=int(data["size_bytes"]),
            tasks=tuple(sorted((int(p), int(i)) for p, i in data["tasks"])),
            final=bool(data["final"]), root=int(data.get("root", 0)),
        )

    @property
    def needs_from(self) -> int:
        """The oldest checkpoint whose objects a restore from this one reads."""
        return self.root or self.checkpoint_id


# -- actions: what the coordinator asks the shell to do ------------------------------------

@dataclass(frozen=True)
class TriggerCheckpoint:
    """Inject barriers for ``checkpoint_id`` at the source tasks."""
    checkpoint_id: int
    epoch: int
    sources: tuple[TaskKey, ...]  # sorted
    park: bool = False  # the tasks park after their snapshot (a change's checkpoint)


@dataclass(frozen=True)
class RetriggerCheckpoint:
    """The trigger of the checkpoint in flight, or acks answering it, may have been lost:
    trigger it again (sources ignore a barrier they passed, executors repeat their acks)."""
    checkpoint_id: int
    epoch: int
    park: bool = False


@dataclass(frozen=True)
class AbandonCheckpoint:
    """Give up ``checkpoint_id``: discard whatever was written for it (snapshots, meta),
    unless not ``discard``: its record may already be written, and name it the app's latest
    (abandoned while being stored); it is then pruned later, as a completed one is."""
    checkpoint_id: int
    reason: str
    discard: bool = True


@dataclass(frozen=True)
class StoreCheckpoint:
    """Every task acknowledged: write ``meta`` to KV, then call ``stored`` or ``store_failed``."""
    meta: CheckpointMeta


@dataclass(frozen=True)
class NotifyComplete:
    """The checkpoint is durable: tell the tasks (sinks commit); ``final`` lets the app
    finish; ``compacted``: the last checkpoint whose snapshots were compacted (0: none);
    ``compacting``: this checkpoint when its compaction follows (0: none)."""
    checkpoint_id: int
    epoch: int
    final: bool
    compacted: int = 0
    compacting: int = 0  # this checkpoint, when its compaction starts now (0: none)


@dataclass(frozen=True)
class CompactCheckpoint:
    """Replace the snapshots of ``tasks`` in a completed checkpoint with the whole state
    their chains add up to; then call ``compacted``."""
    checkpoint_id: int
    epoch: int
    tasks: tuple[TaskKey, ...]  # sorted


@dataclass(frozen=True)
class PruneCheckpoints:
    """Delete these completed checkpoints: older than the last ``keep``, and than every
    checkpoint whose snapshots a kept one builds on."""
    checkpoint_ids: tuple[int, ...]


@dataclass(frozen=True)
class FailApplication:
    """Too many consecutive checkpoint failures: fail the application (emitted once)."""
    reason: str


Action = (TriggerCheckpoint | RetriggerCheckpoint | AbandonCheckpoint | StoreCheckpoint | NotifyComplete
          | PruneCheckpoints | FailApplication | CompactCheckpoint)


class Phase(enum.Enum):
    """Where the (single) current checkpoint is."""
    IDLE = "idle"            # none in flight
    IN_FLIGHT = "in_flight"  # barriers injected, waiting for every task's ack
    STORING = "storing"      # all acked, the shell is writing the meta to KV


_ALLOWED: dict[Phase, frozenset[Phase]] = {
    Phase.IDLE: frozenset({Phase.IN_FLIGHT}),
    Phase.IN_FLIGHT: frozenset({Phase.STORING, Phase.IDLE}),
    Phase.STORING: frozenset({Phase.IDLE}),
}


@dataclass
class _Pending:
    checkpoint_id: int
    epoch: int
    started_at: float
    acks: dict[TaskKey, tuple[int, bool]]  # task -> (size_bytes, ended)
    triggered_at: float = 0.0  # when its trigger was last sent
    meta: CheckpointMeta | None = None  # set on entering STORING
    alignment_s: float = 0.0  # the longest alignment among the acks so far
    root: int = 0  # the oldest root among the acks so far (0: none yet)
    chained: list[TaskKey] = dataclasses.field(default_factory=list)  # tasks whose snapshot builds on another
    depth: int = 0  # the deepest of their chains


@dataclass(frozen=True)
class CheckpointStats:
    """For ``gearbus status``; the shell computes the age from ``latest_completed_at``
    (its own monotonic clock; None for a checkpoint restored by a relaunched AppMaster)."""
    latest: CheckpointMeta | None
    latest_completed_at: float | None
    completed: int
    failed: int
    consecutive_failures: int
    in_flight: int | None  # the id of the checkpoint in flight (or being stored)
    phase: Phase
    epoch: int
    ignored: dict[str, int]
    history: tuple[CheckpointRecord, ...]  # oldest first


class CheckpointCoordinator:
    """Triggers, tracks, completes and abandons checkpoints; see the module docstring."""

    def __init__(
        self,
        tasks: Iterable[TaskKey],
        sources: Iterable[TaskKey],
        *,
        interval_s: float,
        timeout_s: float,
        keep: int,
        max_consecutive_failures: int,
        epoch: int = 0,
        next_id: int = 1,
        restored_from: CheckpointMeta | None = None,
        compact_depth: int = 0,
    ) -> None:
        """``compact_depth``: compact a checkpoint once a task's chain is that deep, or its
        chains hold as many bytes as the whole snapshots they start from (0: never)."""
        self.tasks: frozenset[TaskKey] = frozenset(tasks)
        self.sources: tuple[TaskKey, ...] = tuple(sorted(set(sources)))
        if not self.tasks:
            raise ValueError("a checkpoint needs at least one task")
        if not self.sources or not set(self.sources) <= self.tasks:
            raise ValueError("sources must be a non-empty subset of tasks")
        if timeout_s <= 0 or keep < 1 or max_consecutive_failures < 0:
            raise ValueError("timeout_s must be > 0, keep >= 1, max_consecutive_failures >= 0")
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.keep = keep
        self.max_consecutive_failures = max_consecutive_failures
        self.compact_depth = compact_depth
        self.epoch = epoch
        self.ignored: collections.Counter[str] = collections.Counter()
        self._next_id = next_id
        self._phase = Phase.IDLE
        self._pending: _Pending | None = None
        self._completed: list[int] = []  # ids still kept, oldest first
        self._needs_from: dict[int, int] = {}  # kept id -> the oldest checkpoint it builds on
        self._dropped: list[int] = []  # ids no longer kept whose objects a kept one still needs
        self._compacting: int | None = None  # the checkpoint being compacted
        self._compacted = 0  # the last checkpoint compacted
        #: the bytes of the whole snapshots the chains start from (None: unknown, a restored
        #: or seeded root), and of each completed checkpoint's snapshots since, by id
        self._root_bytes: int | None = None
        self._root_id = 0  # the checkpoint whose whole snapshots _root_bytes measures
        self._chain_bytes: dict[int, int] = {}
        self._compacting_acks: dict[TaskKey, int] = {}  # the sizes the compaction's tasks acked
        #: each task's root in its last acknowledgement: a task's roots never go down, so
        #: nothing it may still build on is older than this
        self._task_roots: dict[TaskKey, int] = {}
        self._latest: CheckpointMeta | None = None
        self._latest_completed_at: float | None = None
        self._timer_from: float | None = None  # when the interval started counting
        self._ended: set[TaskKey] = set()
        self._finished = False  # a final checkpoint completed: nothing more to checkpoint
        self._requested = False  # a checkpoint was asked for (a savepoint): trigger when idle
        self._park_requested = False  # the next checkpoint parks the tasks (a change's)
        self._parked_at = 0  # the parking checkpoint triggered: nothing more until restart()
        self._failed = False  # FailApplication was emitted: terminal
        self._consecutive_failures = 0
        self._completed_count = 0
        self._failed_count = 0
        self._history: collections.deque[CheckpointRecord] = collections.deque(maxlen=HISTORY_KEPT)
        if restored_from is not None:
            self._latest = restored_from
            self._completed = [restored_from.checkpoint_id]
            self._needs_from = {restored_from.checkpoint_id: restored_from.needs_from}
            self._next_id = max(self._next_id, restored_from.checkpoint_id + 1)

    # -- queries -------------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def in_flight(self) -> int | None:
        """The id of the checkpoint in flight or being stored, if any."""
        return self._pending.checkpoint_id if self._pending else None

    @property
    def parked_at(self) -> int:
        """The parking checkpoint this epoch's tasks stop at (triggered; completed, failed or
        in flight), until the next epoch; 0: none."""
        return self._parked_at

    @property
    def ended(self) -> frozenset[TaskKey]:
        """The tasks that have ended (in this epoch)."""
        return frozenset(self._ended)

    @property
    def next_id(self) -> int:
        """The id the next triggered checkpoint gets."""
        return self._next_id

    def latest(self) -> CheckpointMeta | None:
        """The last completed checkpoint: what a recovery restores."""
        return self._latest

    def stats(self) -> CheckpointStats:
        return CheckpointStats(
            latest=self._latest, latest_completed_at=self._latest_completed_at,
            completed=self._completed_count, failed=self._failed_count,
            consecutive_failures=self._consecutive_failures, in_flight=self.in_flight,
            phase=self._phase, epoch=self.epoch, ignored=dict(self.ignored), history=tuple(self._history),
        )

    # -- events --------------------------------------------------------------------------

    def start(self, now: float) -> list[Action]:
        """The tasks are running: the interval starts counting. Idempotent."""
        if self._timer_from is None:
            self._timer_from = now
        return []

    def tick(self, now: float) -> list[Action]:
        """Called periodically: abandon a checkpoint past its timeout, or trigger one
        whose interval is due. An abandon and a periodic trigger never share a tick, so
        a timed-out checkpoint is followed by the next one at the next tick."""
        if self._failed:
            return []
        if self._timer_from is None:  # tick without start(): the first tick starts the timer
            self._timer_from = now
        p = self._pending
        if p is not None:
            if self._phase is Phase.IN_FLIGHT and now - p.started_at > self.timeout_s:
                return (self._abandon(f"timeout after {self.timeout_s}s", failure=True, now=now)
                        + self._final_if_due(now))
            if self._phase is Phase.IN_FLIGHT and now - p.triggered_at >= REPEAT_AFTER_S:
                p.triggered_at = now
                return [RetriggerCheckpoint(p.checkpoint_id, p.epoch, p.checkpoint_id == self._parked_at)]
            return []
        if self._final_due():
            return self._trigger(now)  # regardless of the interval
        if self.interval_s > 0 and not self._finished and not self._parked_at \
                and now - self._timer_from >= self.interval_s:
            return self._trigger(now)
        return []

    def ack(self, checkpoint_id: int, epoch: int, task: TaskKey, size_bytes: int,
            ended: bool, now: float, alignment_s: float = 0.0, root: int = 0, depth: int = 0) -> list[Action]:
        """A task stored its snapshot for ``checkpoint_id`` (after ``alignment_s`` of
        barrier alignment), building on the chain that starts at checkpoint ``root`` (0:
        a whole snapshot), ``depth`` snapshots long; the last ack moves to STORING."""
        p = self._accepts("ack", checkpoint_id, epoch, task)
        if p is None:
            return []
        if task in p.acks:
            self.ignored["ack_duplicate"] += 1
            return []
        p.acks[task] = (size_bytes, ended)
        self._task_roots[task] = root if 0 < root < checkpoint_id else checkpoint_id
        p.alignment_s = max(p.alignment_s, alignment_s)
        if 0 < root < checkpoint_id:
            p.root = min(p.root or root, root)
        if depth > 0:
            p.chained.append(task)
            p.depth = max(p.depth, depth)
        self._record(p, Outcome.IN_PROGRESS, None)
        pruned = self._prune()  # the task's root may have moved up
        if len(p.acks) < len(self.tasks):
            return pruned
        p.meta = CheckpointMeta(
            checkpoint_id=p.checkpoint_id, epoch=p.epoch, started_at=p.started_at,
            duration_s=now - p.started_at, size_bytes=sum(size for size, _ in p.acks.values()),
            tasks=tuple(sorted(p.acks)), final=all(end for _, end in p.acks.values()), root=p.root,
        )
        self._enter(Phase.STORING)
        return pruned + [StoreCheckpoint(p.meta)]

    def decline(self, checkpoint_id: int, epoch: int, task: TaskKey, reason: str,
                now: float, named: str = "") -> list[Action]:
        """A task could not snapshot: the checkpoint is abandoned, a failure (``named``: the
        task as the user reads it, e.g. ``count[1]``, for the reason)."""
        if self._accepts("decline", checkpoint_id, epoch, task) is None:
            return []
        return self._abandon(f"declined by {named or task}: {reason}", failure=True, now=now) + self._final_if_due(now)

    def stored(self, checkpoint_id: int, now: float) -> list[Action]:
        """The shell wrote the meta: the checkpoint is complete."""
        p = self._storing(checkpoint_id, "stored")
        if p is None:
            return []
        assert p.meta is not None
        meta = p.meta
        self._record(p, Outcome.COMPLETED, now)
        self._pending = None
        self._enter(Phase.IDLE)
        self._latest, self._latest_completed_at = meta, now
        self._completed.append(meta.checkpoint_id)
        self._needs_from[meta.checkpoint_id] = meta.needs_from
        self._completed_count += 1
        self._consecutive_failures = 0
        self._finished = self._finished or meta.final
        if self.compact_depth > 0:
            self._count_bytes(p, meta)
        compact = self._compacts(p, meta)
        actions: list[Action] = [NotifyComplete(meta.checkpoint_id, meta.epoch, meta.final, self._compacted,
                                                meta.checkpoint_id if compact else 0)]
        if len(self._completed) > self.keep:
            old, self._completed = self._completed[:-self.keep], self._completed[-self.keep:]
            self._dropped.extend(old)
            for checkpoint_id in old:
                del self._needs_from[checkpoint_id]
        if compact:
            self._compacting = meta.checkpoint_id
            self._compacting_acks = {task: size for task, (size, _) in p.acks.items()}
            actions.append(CompactCheckpoint(meta.checkpoint_id, meta.epoch, tuple(sorted(p.chained))))
        return actions + self._prune() + self._final_if_due(now)

    def _count_bytes(self, p: _Pending, meta: CheckpointMeta) -> None:
        """Keep the bytes the chains hold: those of the checkpoints after the oldest root
        any task builds on (older ones are in no chain), or none after a whole one."""
        if not p.chained:
            self._root_bytes, self._root_id, self._chain_bytes = meta.size_bytes, meta.checkpoint_id, {}
            return
        self._chain_bytes[meta.checkpoint_id] = meta.size_bytes
        for old in [c for c in self._chain_bytes if c <= meta.root]:
            del self._chain_bytes[old]

    def _compacts(self, p: _Pending, meta: CheckpointMeta) -> bool:
        """Whether to compact the checkpoint just stored: its chains are deep, or hold
        COMPACT_SHARE of the bytes of the whole snapshots they start from (so a restore
        reads at most about one and a half times the state, and the state is rewritten
        once per half its size in changes)."""
        if self.compact_depth <= 0 or self._compacting is not None or meta.final:
            return False
        # a depth acked before the tasks heard of the last compaction counts from the old root
        deep = min(p.depth, meta.checkpoint_id - self._compacted)
        return deep >= self.compact_depth or (deep >= MIN_COMPACT_DEPTH and self._root_bytes is not None
                                              and sum(self._chain_bytes.values()) >= COMPACT_SHARE * self._root_bytes)

    def compacted(self, checkpoint_id: int, ok: bool, sizes: dict[TaskKey, int] | None = None) -> list[Action]:
        """The shell compacted ``checkpoint_id`` into whole snapshots of ``sizes`` bytes by
        task (or failed to, ``ok`` False: its chains stay as they were): a restore from it
        reads nothing older. A task that has not heard of it may still build on an older
        chain: its last ack's root keeps that."""
        if checkpoint_id != self._compacting:
            self.ignored["compacted_unknown"] += 1
            return []
        self._compacting = None
        if ok:
            if checkpoint_id > self._root_id:  # unless a whole checkpoint completed since
                self._root_bytes, self._root_id = sum({**self._compacting_acks, **(sizes or {})}.values()), checkpoint_id
                self._chain_bytes = {c: size for c, size in self._chain_bytes.items() if c > checkpoint_id}
            self._compacted = checkpoint_id
            if checkpoint_id in self._needs_from:
                self._needs_from[checkpoint_id] = checkpoint_id
        return self._prune()

    def _prune(self) -> list[Action]:
        """Prune the checkpoints no kept one needs and no task may still build on (but the
        one being compacted)."""
        needed = self._needed()
        prunable = tuple(sorted(c for c in self._dropped if c < needed and c != self._compacting))
        if not prunable:
            return []
        self._dropped = [c for c in self._dropped if c not in prunable]
        return [PruneCheckpoints(prunable)]

    def store_failed(self, checkpoint_id: int, reason: str, now: float) -> list[Action]:
        """The shell could not write the meta: abandoned, a failure."""
        if self._storing(checkpoint_id, "store_failed") is None:
            return []
        return self._abandon(f"store failed: {reason}", failure=True, now=now) + self._final_if_due(now)

    def request(self, now: float, park: bool = False) -> list[Action]:
        """Checkpoint as soon as possible (a savepoint): at once when none is in flight,
        else right after the one in flight completes or is abandoned. ``park``: the tasks
        park after its snapshot (a change's; not the final checkpoint's, after which the
        app ends)."""
        if self._failed or self._finished:
            return []
        self._requested = True
        self._park_requested = self._park_requested or park
        return self._final_if_due(now)

    def task_ended(self, task: TaskKey, now: float) -> list[Action]:
        """A task of a bounded app ran out of input; once all have, the final checkpoint
        is triggered at once (or as soon as the one in flight ends)."""
        if task not in self.tasks:
            self.ignored["task_ended_unknown_task"] += 1
            return []
        self._ended.add(task)
        return self._final_if_due(now)

    def history(self) -> tuple[CheckpointRecord, ...]:
        """The last :data:`HISTORY_KEPT` checkpoints, oldest first."""
        return tuple(self._history)

    def restart(self, epoch: int, now: float) -> list[Action]:
        """Global recovery to :meth:`latest` under a new, higher ``epoch``: drop what is in
        flight (not a checkpoint failure), forget ended tasks, restart the interval. Ids go
        on increasing so nothing of the old epoch can be mistaken for a new checkpoint."""
        if epoch <= self.epoch:
            raise ValueError(f"restart epoch {epoch} must exceed the current epoch {self.epoch}")
        actions = self._abandon("recovery", failure=False, now=now) if self._pending else []
        self.epoch = epoch
        self._ended.clear()
        self._finished = False
        self._parked_at, self._park_requested = 0, False
        self._timer_from = now
        return actions

    def retask(self, tasks: Iterable[TaskKey], sources: Iterable[TaskKey]) -> None:
        """The app runs another set of tasks from now on (a rescale, between a
        :meth:`restart` and the tasks' deployment): later checkpoints wait for these.
        Tasks gone no longer hold back pruning."""
        if self._pending is not None:
            raise ValueError("retask with a checkpoint in flight: restart first")
        tasks, sources = frozenset(tasks), tuple(sorted(set(sources)))
        if not sources or not set(sources) <= tasks:
            raise ValueError("sources must be a non-empty subset of tasks")
        self.tasks, self.sources = tasks, sources
        self._task_roots = {task: root for task, root in self._task_roots.items() if task in tasks}
        self._ended &= tasks

    def check_invariants(self) -> None:
        """Raise AssertionError if the coordinator's state is inconsistent (tests call it
        after every event)."""
        p = self._pending
        assert (self._phase is Phase.IDLE) == (p is None), (self._phase, p)
        assert p is None or (p.meta is not None) == (self._phase is Phase.STORING), (self._phase, p)
        assert p is None or set(p.acks) <= self.tasks, p
        ids = [record.checkpoint_id for record in self._history]
        assert ids == sorted(set(ids)) and len(ids) <= HISTORY_KEPT, ids
        in_progress = [record.checkpoint_id for record in self._history if record.outcome is Outcome.IN_PROGRESS]
        assert in_progress == ([p.checkpoint_id] if p is not None else []), (in_progress, p)
        assert all((record.duration_s is None) == (record.outcome is Outcome.IN_PROGRESS) for record in self._history)
        assert not self._history or self._history[-1].checkpoint_id < self._next_id
        assert self._latest is None or self._latest.checkpoint_id in self._completed
        assert set(self._needs_from) == set(self._completed), (self._needs_from, self._completed)
        assert all(self._needs_from[c] <= c for c in self._completed), self._needs_from
        assert all(c >= self._needed() or c == self._compacting for c in self._dropped), \
            (self._dropped, self._needs_from, self._task_roots)  # one nothing needs is pruned at once
        assert not set(self._dropped) & set(self._completed)
        assert self._compacting is None or self._compacting in self._completed or self._compacting in self._dropped, \
            self._compacting  # never pruned while being compacted
        assert self._compacted <= (self._latest.checkpoint_id if self._latest else 0)
        assert all(c > max(self._compacted, self._root_id) for c in self._chain_bytes), \
            (self._compacted, self._root_id, self._chain_bytes)

    # -- transitions ---------------------------------------------------------------------

    def _needed(self) -> int:
        """The oldest checkpoint a kept one reads, or a task may still build on."""
        return min(min(self._needs_from.values(), default=self._next_id),
                   min(self._task_roots.values(), default=self._next_id))

    def _enter(self, phase: Phase) -> None:
        if phase not in _ALLOWED[self._phase]:
            raise AssertionError(f"checkpoint phase {self._phase} -> {phase} is not a transition")
        self._phase = phase

    def _final_due(self) -> bool:
        """The final checkpoint, or a requested one, is due (and nothing is in flight)."""
        return (not self._failed and not self._finished and self._pending is None and not self._parked_at
                and (self._ended == self.tasks or self._requested))

    def _final_if_due(self, now: float) -> list[Action]:
        """Back in IDLE (or a task ended): the final checkpoint goes at once when due."""
        return self._trigger(now) if self._final_due() else []

    def _trigger(self, now: float) -> list[Action]:
        self._enter(Phase.IN_FLIGHT)
        park = self._park_requested and self._ended != self.tasks
        self._pending = _Pending(self._next_id, self.epoch, now, {}, triggered_at=now)
        self._history.append(CheckpointRecord(self._next_id, self.epoch, Outcome.IN_PROGRESS, now))
        self._next_id += 1
        self._requested = self._park_requested = False
        self._parked_at = self._pending.checkpoint_id if park else 0
        self._timer_from = now
        return [TriggerCheckpoint(self._pending.checkpoint_id, self.epoch, self.sources, park)]

    def _record(self, p: _Pending, outcome: Outcome, ended_at: float | None, failure: str = "") -> None:
        """The history's entry for the pending checkpoint (always the newest) brought up to date."""
        newest = self._history[-1]
        assert newest.checkpoint_id == p.checkpoint_id and newest.outcome is Outcome.IN_PROGRESS, (newest, p)
        self._history[-1] = dataclasses.replace(
            newest, outcome=outcome, duration_s=None if ended_at is None else ended_at - p.started_at,
            alignment_s=p.alignment_s, task_sizes=tuple(sorted((task, size) for task, (size, _) in p.acks.items())),
            failure=failure)

    def _abandon(self, reason: str, *, failure: bool, now: float) -> list[Action]:
        assert self._pending is not None
        self._record(self._pending, Outcome.FAILED, now, reason)
        storing = self._phase is Phase.STORING
        actions: list[Action] = [AbandonCheckpoint(self._pending.checkpoint_id, reason, discard=not storing)]
        if storing:  # a relaunched AppMaster may restore it: its objects go once nothing needs them
            self._dropped.append(self._pending.checkpoint_id)
        self._pending = None
        self._enter(Phase.IDLE)
        if failure:
            self._failed_count += 1
            self._consecutive_failures += 1
            if self._consecutive_failures > self.max_consecutive_failures and not self._failed:
                self._failed = True
                actions.append(FailApplication(
                    f"{self._consecutive_failures} consecutive checkpoint failures, last: {reason}"))
        return actions

    def _accepts(self, what: str, checkpoint_id: int, epoch: int, task: TaskKey) -> _Pending | None:
        """The pending checkpoint if a task's ack/decline belongs to it, else count why not."""
        p = self._pending
        if self._failed:
            why = "failed"
        elif epoch != self.epoch:
            why = "wrong_epoch"
        elif task not in self.tasks:
            why = "unknown_task"
        elif p is None or checkpoint_id != p.checkpoint_id:
            why = "stale" if checkpoint_id < self._next_id else "unknown_id"  # ended, or never triggered
        elif self._phase is not Phase.IN_FLIGHT:
            why = "duplicate"  # STORING: every task has acked already
        else:
            return p
        self.ignored[f"{what}_{why}"] += 1
        return None

    def _storing(self, checkpoint_id: int, what: str) -> _Pending | None:
        p = self._pending
        if self._failed or p is None or self._phase is not Phase.STORING or p.checkpoint_id != checkpoint_id:
            self.ignored[f"{what}_stale"] += 1
            return None
        return p
