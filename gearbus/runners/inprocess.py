"""The TestRunner's engine: the cluster's runtime driven in this process.

Every rule is the cluster's own: each task's :class:`~gearbus.runtime.core.TaskCore`
(sequences, watermarks, end-of-stream, barrier alignment, snapshots), its
:class:`~gearbus.runtime.sender.Sender` (partitioning, batching, credit), the
:class:`~gearbus.runtime.source.SourceLoop` of source tasks, the tasks' lives in each
executor decided by the executor's own
:class:`~gearbus.runtime.executor_tasks.ExecutorTasks` (launch, start, snapshots stored
or declined, acknowledgements, commits, failures and their reports), and the app's life
decided by the AppMaster's own :class:`~gearbus.runtime.appmaster_state.AppMasterState`
(slots, executors, deployments, rollbacks to the last checkpoint in a new epoch, the
restart budget, the outcome), whose :class:`~gearbus.runtime.checkpoints.CheckpointCoordinator`
triggers, completes and compacts checkpoints. This engine supplies only what a cluster
gets from NATS and the OS:

- in-memory workers and executors: a slot is a made-up worker id, an executor registers
  as soon as it is launched and heartbeats on every tick, a deployment launches its tasks
  on each executor's machine, a snapshot is "stored" in memory, a commit runs at once;
- an in-memory transport: every frame is encoded and decoded by the wire codec; a
  frame within its channel's credit is in flight, the rest wait in order at their
  sender, which meanwhile reads no input (back-pressure, as in an executor);
- a clock: one tick per round of source reads, so ``checkpoint_every`` rounds is the
  coordinator's interval; a tick is also a second of the tasks' processing time
  (``TaskContext.now_ms``), after which their due wakeups fire, so processing-time timers
  fire at the same points every run, without waiting;
- an event loop: the engine runs on one, so async calls (``map_async``) run on it, as on
  an executor's; they progress only while nothing else can move (the engine then waits
  for the first to finish), so which results are in at each point depends on timing no
  more than the calls' own durations make it;
- an order: a seeded random choice of which channel delivers next and which source
  reads first (each channel stays FIFO), so one seed always gives one interleaving.

A run can lose executors at chosen points and recover by itself, as the cluster does;
be rescaled at chosen points, as the cluster is; or stop at a chosen point as if every
process had crashed, and another engine can resume from the last completed checkpoint:
a user's test of exactly-once recovery.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import itertools
import logging
import math
import random
import tempfile
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, replace

from gearbus.api.graph import Application
from gearbus.api.io_tasks import DataSourceTask
from gearbus.api.task import Task, TaskContext, now_ms
from gearbus.api.watermarks import WATERMARK_MAX
from gearbus.control.config import AppConfig
from gearbus.runtime import appmaster_state as st
from gearbus.runtime import checkpoints as cp
from gearbus.runtime import executor_tasks as lifecycle
from gearbus.runtime.failures import failure_report
from gearbus.runtime.core import End, Grant, Snapshot, TaskCore
from gearbus.runtime.frames import FrameReader
from gearbus.runtime.sender import Outgoing, Sender, edges_of, senders_of
from gearbus.runtime.replace import carried_over, check_replacement, compose
from gearbus.runtime.rescale import processors_of
from gearbus.runtime.savepoints import SavepointMismatch, compacted, rescaled_snapshot, restored_from, whole_snapshot
from gearbus.runtime.snapshots import COMPACT_DEPTH, MAX_DEPTH, TaskSnapshot
from gearbus.runtime.source import SourceLoop
from gearbus.runtime.task_key import TaskKey
from shared.messages import AppError, FailureKind, LaunchTasks, TaskId

log = logging.getLogger(__name__)  # as the connectors log: quiet unless the user sets logging up

KEEP_CHECKPOINTS = 2

Checkpoint = tuple[int, dict[TaskKey, bytes]]
"""A completed checkpoint: its id and each task's encoded :class:`TaskSnapshot`."""


class PipelineFailed(Exception):
    """A pipeline run in-process failed; ``error`` is what ``gearbus status`` would show."""

    def __init__(self, error: AppError):
        super().__init__(f"{error.error_type}: {error.message} ({error.where})")
        self.error = error


class SimulatedCrash(Exception):
    """The run stopped where the caller asked, as if every process had died there."""


@dataclass(eq=False)
class _Node:
    key: TaskKey
    task: Task
    core: TaskCore
    sender: Sender
    source: SourceLoop | None
    waiting: collections.deque  # Outgoing frames beyond their channel's credit, in sending order
    started: bool = False  # on_start ran: on_stop is due

    @property
    def name(self) -> str:
        return self.task.context.task_name


class InProcessEngine:
    def __init__(self, app: Application, batch_records: int | None = None, checkpoint_every: int = 0,
                 epoch: int = 0, seed: int = 0):
        """``batch_records``: records per source read and per frame (default: the app's
        ``batch_records``, as the executors read it, so watermarks advance at the same
        points as on the bus). ``checkpoint_every``: trigger a checkpoint every that many
        rounds of source reads (0: only the final checkpoint after the end). ``epoch``:
        the first deployment's. ``seed``: picks the interleaving. The app's config sets
        the executors, the task placement and the restart budget, as on the cluster."""
        self.app = app
        self.plan = app  # at the parallelism it runs now (a rescale changes it)
        self.first_epoch = epoch
        self.checkpoint_every = checkpoint_every
        self.random = random.Random(seed)
        config = AppConfig.parse(app.config).resolved()
        self.config = config if batch_records is None else replace(config, batch_records=batch_records)
        self.settings = st.Settings.of(self.config)
        processors = app.graph.processors
        self.tasks = [(p.id, i) for p in processors for i in range(p.parallelism)]
        self.sources = [(p.id, i) for p in processors if p.is_source for i in range(p.parallelism)]
        self.state: st.AppMasterState | None = None  # the app's life, from run() on
        self.nodes: dict[TaskKey, _Node] = {}  # the deployed tasks
        self.hosts: dict[TaskKey, int] = {}  # task -> the in-memory executor it runs on
        self.executors: dict[int, lifecycle.ExecutorTasks] = {}  # each in-memory executor's tasks
        self._deployment: st.Deploy | None = None  # the last: what its tasks restore, run and hold
        self._restoring: dict[TaskKey, TaskSnapshot] = {}  # what each task of the deployment restores
        self.rescales: list[st.AnswerRescale] = []  # how each rescale asked for ended
        self._change_requests = itertools.count(1)
        self.versions: dict[int, Application] = {1: app}  # the app's code, by version (gearbus replace)
        self.replaces: list[st.AnswerReplace] = []  # how each replacement asked for ended
        #: how each executor's instruction is carried out: one handler per kind, as the executor's
        self._instructions = {
            lifecycle.RetireTasks: self._retire, lifecycle.OpenTasks: self._open, lifecycle.StartTasks: self._start,
            lifecycle.RewireTasks: self._rewire, lifecycle.ResumeTasks: self._resume,
            lifecycle.InjectBarrier: self._inject, lifecycle.StoreSnapshot: self._store_snapshot,
            lifecycle.AckCheckpoint: self._ack, lifecycle.DeclineCheckpoint: self._decline,
            lifecycle.Commit: self._commit, lifecycle.StopTask: self._stop_task,
            lifecycle.ReportEnded: self._report_ended, lifecycle.ReportFinished: self._report_finished,
            lifecycle.ReportFailed: self._report_failed, lifecycle.Exit: self._exit,
        }
        self._appmaster_instructions = {
            st.Logged: self._log, st.StoreEpoch: self._store_epoch, st.RequestSlots: self._request_slots,
            st.RequestSlot: self._request_slot, st.LaunchExecutor: self._launch_executor, st.Deploy: self._deploy,
            st.Fence: self._fence, st.ReportState: self._report_state, st.EndApp: self._end, st.Shutdown: self._shutdown,
            st.RepeatFinalComplete: self._repeat_final_complete,
            st.AnswerRescale: self.rescales.append, st.AnswerReplace: self.replaces.append,
            cp.TriggerCheckpoint: self._trigger, cp.RetriggerCheckpoint: self._trigger,
            cp.StoreCheckpoint: self._store_checkpoint, cp.NotifyComplete: self._notify_complete,
            cp.CompactCheckpoint: self._compact, cp.PruneCheckpoints: self._prune,
            cp.AbandonCheckpoint: self._abandon,
        }
        #: (sender, receiver) -> frames in flight, for every channel, in a fixed order
        self.wire: dict[tuple[TaskKey, TaskKey], collections.deque[Outgoing]] = {}
        self.inboxes: collections.Counter[TaskKey] = collections.Counter()  # frames in flight per receiver
        self.reader = FrameReader()
        self.clock = 0.0
        self.origin_ms = now_ms()  # processing time at clock 0
        self.polls: set[TaskKey] = set()  # tasks whose async calls brought results since the last poll
        self.results: asyncio.Event | None = None  # set when one did
        #: checkpoint id -> task key -> encoded snapshot, for completed checkpoints
        self.completed: dict[int, dict[TaskKey, bytes]] = {}
        self.stored_epoch: tuple[int, int] | None = None  # (epoch, restarts) as the AppMaster stores them
        self._taken: dict[int, dict[TaskKey, bytes]] = {}  # the checkpoint in flight's snapshots so far
        self._workers = itertools.count(1)
        self._delivered = 0

    @property
    def epoch(self) -> int:
        return self.state.epoch if self.state else self.first_epoch

    def latest_checkpoint(self) -> Checkpoint | None:
        """The last completed checkpoint (id, each task's whole snapshot), or None."""
        if not self.completed:
            return None
        checkpoint_id = max(self.completed)
        return checkpoint_id, {key: self._compacted(checkpoint_id, key) for key in self.completed[checkpoint_id]}

    def _chain(self, checkpoint_id: int, key: TaskKey) -> list[TaskSnapshot]:
        """A task's snapshots at a completed checkpoint: its own and those it builds on,
        oldest first."""
        chain, at = [], checkpoint_id
        while at is not None:
            envelope = TaskSnapshot.decode(self.completed[at][key])
            chain.append(envelope)
            at = envelope.base[0] if envelope.base is not None else None
        return chain[::-1]

    def _whole(self, checkpoint_id: int, key: TaskKey) -> TaskSnapshot:
        """A task's whole state at a completed checkpoint, added up as the task restores it."""
        return whole_snapshot(self.app.graph.processors[key[0]], self._chain(checkpoint_id, key))

    def _restore_snapshot(self, checkpoint_id: int, key: TaskKey, old: dict[TaskKey, TaskSnapshot]) -> TaskSnapshot:
        """What a task of the deployment restores: its whole state at the checkpoint, its
        share of the old tasks' after a rescale (each read once, into ``old``), or what its
        new code takes of it. Raises SavepointMismatch when its share cannot be divided."""
        processor = self.plan.graph.processors[key[0]]
        taken_at, drop_state = dict(self._deployment.restore_parallelism).get(key[0]), dict(self._deployment.drop_state)
        if taken_at is not None:
            wanted = [(key[0], index) for index in restored_from(processor, taken_at, key[1])]
            for task in wanted:
                if task not in old:
                    old[task] = self._whole(checkpoint_id, task)
            return rescaled_snapshot(processor, taken_at, {index: old[(p, index)] for p, index in wanted}, key[1])
        if key[0] in drop_state:
            return carried_over(processor, self._whole(checkpoint_id, key), drop_state[key[0]])
        return self._whole(checkpoint_id, key)

    def _compacted(self, checkpoint_id: int, key: TaskKey) -> bytes:
        """A task's whole state at a completed checkpoint, encoded as a snapshot that needs
        no other: as the AppMaster compacts it."""
        return compacted(self.app.graph.processors[key[0]], self._chain(checkpoint_id, key))

    def now_ms(self) -> int:
        """The tasks' processing time: the engine's clock, a second per tick."""
        return self.origin_ms + int(self.clock * 1000)

    def run(self, restore: Checkpoint | None = None, crash_after_frames: int | None = None,
            kill_executor_after_frames: Iterable[int] = (),
            rescale_after_frames: Mapping[int, Mapping[str, int]] | None = None,
            replace_after_frames: Mapping[int, tuple] | None = None) -> None:
        """Run until the app succeeded (its final checkpoint completed and every task
        finished); a failure raises PipelineFailed.

        ``restore``: a checkpoint from :meth:`latest_checkpoint` of an earlier engine.
        ``crash_after_frames``: stop with SimulatedCrash after delivering that many frames.
        ``kill_executor_after_frames``: after delivering each of these many frames, one
        executor (picked by the seed) dies; the app rolls back to its last checkpoint in
        a new epoch, as on the cluster, within its restart budget (``max_restarts``).
        ``rescale_after_frames``: after delivering that many frames, ask for a rescale of
        these steps (``{step: parallelism}``), as ``gearbus rescale`` does (:meth:`rescale`);
        how each ended is in :attr:`rescales`.
        ``replace_after_frames``: after delivering that many frames, replace the code of the
        processor holding a step with the processor holding it in a new version of the app
        (``(step, app)``, or ``(step, app, drop_state, at_ms)``), as ``gearbus replace`` does
        (:meth:`replace`); how each ended is in :attr:`replaces`.
        """
        schedule = [(frames, self._kill_executor) for frames in kill_executor_after_frames]
        schedule += [(frames, functools.partial(self.rescale, dict(steps)))
                     for frames, steps in (rescale_after_frames or {}).items()]
        schedule += [(frames, functools.partial(self.replace, *change))
                     for frames, change in (replace_after_frames or {}).items()]
        _on_a_loop(self._run(restore, crash_after_frames, sorted(schedule, key=lambda event: event[0])))

    def rescale(self, steps: Mapping[str, int]) -> None:
        """Ask the running app to run ``steps`` at these parallelisms, as ``gearbus rescale``
        does: steps that name no processor raise RescaleError; what the AppMaster refuses
        (not running now, another change in flight, out of range) is answered in
        :attr:`rescales`, the app untouched."""
        request_id, asked = next(self._change_requests), processors_of(self.plan, steps)
        try:
            self._carry_out(self.state.rescale_requested(request_id, asked, self.clock))
        except st.Refused as refused:
            self.rescales.append(st.AnswerRescale(request_id, refused.message))

    def replace(self, step: str, new: Application, drop_state: bool = False, at_ms: int = 0) -> None:
        """Replace the code of the processor holding ``step`` with the processor holding it
        in ``new`` (a planned version of the app), records of event time ``at_ms`` and later
        going to the new code (0: from the next checkpoint), as ``gearbus replace`` does: a new version
        whose graph differs elsewhere, or that would drop state without ``drop_state``,
        raises ReplaceError; what the AppMaster refuses, or rolls back, is answered in
        :attr:`replaces`, the app going on."""
        replacement = check_replacement(self.plan, new, step, drop_state)
        version = len(self.versions) + 1
        self.versions[version] = new
        request_id = next(self._change_requests)
        try:
            self._carry_out(self.state.replace_requested(request_id, replacement.processor, version,
                                                         replacement.dropped_state, self.clock, at_ms,
                                                         replacement.same_state))
        except st.Refused as refused:
            self.replaces.append(st.AnswerReplace(request_id, refused.message))

    async def _run(self, restore: Checkpoint | None, crash_after_frames: int | None,
                   schedule: list[tuple[int, Callable[[], None]]]) -> None:
        meta = self._restored(*restore) if restore is not None else None
        scratch = tempfile.TemporaryDirectory(prefix="gearbus-state-")
        self._state_dir = scratch.name  # the tasks' state on disk and its local copies, removed at the end
        self.state = st.AppMasterState(self.tasks, self._coordinator(meta), self.settings, self.first_epoch,
                                       names={p.id: p.name for p in self.app.graph.processors})
        self.results = asyncio.Event()
        try:
            try:
                self._carry_out(self.state.start(self.clock, meta))
            except _Interrupted:
                pass  # a task failed as it started: the app rolled back
            await self._loop(crash_after_frames, schedule)
            if self.state.outcome is None:
                unfinished = [n.name for n in self.nodes.values() if not n.core.ended]
                if unfinished:
                    raise RuntimeError(f"tasks never ended (a source that never ends?): {', '.join(unfinished)}")
                raise RuntimeError(f"the final checkpoint did not complete (stuck at "
                                   f"{self.state.coordinator.stats()})")
        finally:
            for node in self.nodes.values():
                self._stop(node)
            scratch.cleanup()

    # --- the AppMaster's instructions, carried out in memory ----------------------------

    def _carry_out(self, instructions: list) -> None:
        """Do what the AppMaster's state machine asked, in order, as its shell does over
        NATS; nothing here waits, so each answer goes back to the machine at once. An
        instruction this engine has no handler for is a bug, and fails loudly."""
        for instruction in instructions:
            handler = self._appmaster_instructions.get(type(instruction))
            if handler is None:
                raise RuntimeError(f"not carried out in-process: {instruction}")
            handler(instruction)

    def _log(self, logged: st.Logged) -> None:
        log.log(logging.getLevelName(logged.level.upper()), " ".join(
            [logged.event] + [f"{key}={value}" for key, value in logged.data]))

    def _store_epoch(self, store: st.StoreEpoch) -> None:
        self.stored_epoch = (store.epoch, store.restarts)

    def _request_slots(self, request: st.RequestSlots) -> None:
        workers = [self._worker() for _ in range(request.count)]
        self._carry_out(self.state.slots_allocated(workers, self.clock))

    def _request_slot(self, request: st.RequestSlot) -> None:  # a new worker: away from every one to avoid
        self._carry_out(self.state.slot_allocated(request.executor_id, self._worker(), self.clock))

    def _launch_executor(self, launch: st.LaunchExecutor) -> None:
        self._carry_out(self.state.executor_registered(launch.executor_id, launch.worker_id, [], 0, self.clock))

    def _fence(self, fence: st.Fence) -> None:
        machine = self.executors.get(fence.executor_id)
        if machine is not None:
            self._do(fence.executor_id, machine.fenced(fence.reason))

    def _report_state(self, report: st.ReportState) -> None:
        """No master to tell: as if it answered."""
        self._carry_out(self.state.state_reported(report.state, self.clock))

    def _shutdown(self, _: st.Shutdown) -> None:
        """The engine's loop ends with the app: nothing else runs."""

    @staticmethod
    def _end(end: st.EndApp) -> None:
        if end.error is not None:
            raise PipelineFailed(end.error)

    def _worker(self) -> str:
        return f"memory-worker-{next(self._workers)}"

    def _deploy(self, deploy: st.Deploy) -> None:
        """Launch the deployment's tasks on each executor (their machines retire the older
        epoch's), as the AppMaster does: then the tasks start, restored from its checkpoint
        (or fresh); tasks that had ended tell their receivers again."""
        self.hosts = {task: executor_id for executor_id, tasks in deploy.assignments for task in tasks}
        self._deployment, restore = deploy, deploy.restore
        self.plan = compose(self.app, {p: self.versions[v] for p, v in deploy.versions}).with_parallelism(
            dict(deploy.parallelism))
        old: dict[TaskKey, TaskSnapshot] = {}
        try:  # as an executor opens its tasks: one whose share cannot be divided refuses the launch
            self._restoring = {key: self._restore_snapshot(restore.checkpoint_id, key, old)
                               for _, tasks in deploy.assignments for key in tasks
                               if key not in deploy.kept} if restore else {}
        except SavepointMismatch as exc:
            self._carry_out(self.state.deploy_failed(deploy.epoch, str(exc), self.clock, refused=True))
            return
        for executor_id, tasks in deploy.assignments:
            launch = LaunchTasks([TaskId(*task) for task in tasks], self.app.graph.digest(), 0, deploy.epoch,
                                 restore.checkpoint_id if restore else 0, restore.epoch if restore else 0,
                                 dict(deploy.parallelism), dict(deploy.restore_parallelism),
                                 keep_running=[TaskId(*task) for task in tasks if task in deploy.kept])
            machine = self.executors.setdefault(executor_id, lifecycle.ExecutorTasks())
            self._do(executor_id, machine.launch(launch, [TaskId(*task) for task in tasks
                                                          if self.plan.graph.processors[task[0]].is_source]))
        self.wire = {(node.key, receiver): collections.deque() for node in self.nodes.values()
                     for receiver in node.sender.channels}
        self.inboxes.clear()
        self.reader = FrameReader()
        self._carry_out(self.state.deployed(deploy.epoch, self.clock))
        for executor_id, machine in list(self.executors.items()):
            self._do(executor_id, machine.start_all())

    def _build(self, epoch: int, keys: list[TaskKey]) -> dict[TaskKey, _Node]:
        graph, nodes = self.plan.graph, {}
        for processor_id, index in keys:
            p = graph.processors[processor_id]
            task = p.task_class(TaskContext(0, self.plan.name, p, index, 0, epoch=epoch, clock=self.now_ms,
                                            request_poll=functools.partial(self._request_poll, (p.id, index)),
                                            state_backend=self.config.state_backend, state_dir=self._state_dir,
                                            local_copies=self.config.local_copies))
            core = TaskCore(task, senders_of(graph, p), self.config.credit_frames, epoch,
                            max_depth=MAX_DEPTH if self.config.incremental_checkpoints else 0,
                            hold_from=dict(self._deployment.hold_from).get(p.id))
            source = SourceLoop(core, self.config.batch_records) if isinstance(task, DataSourceTask) else None
            nodes[(p.id, index)] = _Node((p.id, index), task, core, Sender(p.id, index, epoch, edges_of(graph, p),
                                                                           self.config),
                                         source, collections.deque())
        return nodes

    # --- each executor's instructions, carried out in memory -----------------------------

    def _do(self, executor_id: int, instructions: list) -> None:
        """Carry out what an executor's machine asked, in order; an instruction of a kind
        this engine does not know is a bug, and fails loudly. One of them may roll the app
        back at once (a failed commit): the rest belong to the replaced attempt, and stop."""
        attempt = self._attempt(executor_id)
        for instruction in instructions:
            handler = self._instructions.get(type(instruction))
            if handler is None:
                raise RuntimeError(f"not carried out in-process: {instruction}")
            if self._attempt(executor_id) != attempt:
                return
            handler(executor_id, instruction)

    def _attempt(self, executor_id: int) -> tuple:
        """The executor's machine and the attempt it runs: what a rollback replaces."""
        machine = self.executors.get(executor_id)
        return (machine, machine.epoch if machine is not None else None)

    def _machine(self, node: _Node) -> tuple[int, lifecycle.ExecutorTasks]:
        executor_id = self.hosts[node.key]
        return executor_id, self.executors[executor_id]

    def _retire(self, executor_id: int, retire: lifecycle.RetireTasks) -> None:
        for task in retire.tasks:
            self._stop_before((task.processor, task.index), self.epoch)

    def _open(self, executor_id: int, open_tasks: lifecycle.OpenTasks) -> None:
        launch = open_tasks.launch
        keys = [(task.processor, task.index) for task in open_tasks.tasks]
        for key in keys:
            self._stop_before(key, launch.epoch)
        self.nodes.update(self._build(launch.epoch, keys))
        self.executors[executor_id].opened(launch.epoch)

    def _rewire(self, executor_id: int, rewire: lifecycle.RewireTasks) -> None:
        """Parked tasks go on in the new epoch, on the channels of the plan deployed."""
        graph = self.plan.graph
        for task in rewire.tasks:
            node = self.nodes[(task.processor, task.index)]
            processor = graph.processors[task.processor]
            self._guard(node, node.core.rewire, senders_of(graph, processor), rewire.epoch)
            node.sender.rewire(rewire.epoch, edges_of(graph, processor))

    def _resume(self, executor_id: int, resume: lifecycle.ResumeTasks) -> None:
        """As a task loop resumes: what came meanwhile, then results that came."""
        for task in resume.tasks:
            node = self.nodes[(task.processor, task.index)]
            self._act(node, self._guard(node, node.core.resume))
            self.polls.add(node.key)

    def _stop_before(self, key: TaskKey, epoch: int) -> None:
        """Stop the task of ``key`` if it runs an epoch before ``epoch``: one executor may
        open a task moved to it (a rescale places tasks anew) before another retires the
        task's older epoch, and that retirement must not stop the new one."""
        if key in self.nodes and self.nodes[key].core.epoch < epoch:
            self._stop(self.nodes.pop(key))

    def _start(self, executor_id: int, start: lifecycle.StartTasks) -> None:
        """Each task starts, as an executor's task loop does: on_start, then its restore."""
        restore, attempt = self._deployment.restore, self._attempt(executor_id)
        for task in start.tasks:
            if self._attempt(executor_id) != attempt:
                return  # a task's start rolled the app back: the rest belong to the replaced attempt
            node = self.nodes[(task.processor, task.index)]
            self._guard(node, node.task.on_start)
            node.started = True
            if restore is not None:
                self._guard(node, node.core.restore, self._restoring.pop(node.key))
                if node.core.ended:  # it ended before the checkpoint: its receivers hear the end again
                    self._send(node, node.sender.finish(WATERMARK_MAX))
                    self._do(executor_id, self.executors[executor_id].task_ended(task, node.core.epoch))

    def _inject(self, executor_id: int, inject: lifecycle.InjectBarrier) -> None:
        for task in inject.tasks:
            node = self.nodes[(task.processor, task.index)]
            node.source.inject(inject.checkpoint_id, inject.park)
            self._act(node, self._guard(node, node.source.pending_barriers))

    def _store_snapshot(self, executor_id: int, store: lifecycle.StoreSnapshot) -> None:
        """Serialise now, as the executor does; a state that cannot be serialised declines
        the checkpoint (the app goes on, and fails once too many fail in a row)."""
        node, snapshot, machine = self.nodes[(store.task.processor, store.task.index)], store.snapshot, \
            self.executors[executor_id]
        try:
            data = snapshot.state.encode()
        except Exception as exc:
            self._do(executor_id, machine.snapshot_declined(store.task, store.epoch, snapshot.checkpoint_id,
                                                            lifecycle.unserialisable(node.name, exc,
                                                                                     snapshot.state.state)))
            return
        if snapshot.checkpoint_id == self.state.coordinator.in_flight:
            self._taken.setdefault(snapshot.checkpoint_id, {})[node.key] = data
        self._do(executor_id, machine.snapshot_stored(store.task, store.epoch, snapshot.checkpoint_id, len(data),
                                                      snapshot.ended, store.alignment_s, snapshot.state.root,
                                                      snapshot.state.depth, snapshot.records_in))

    def _ack(self, executor_id: int, ack: lifecycle.AckCheckpoint) -> None:
        self._carry_out(self.state.checkpoint_acked(ack.checkpoint_id, ack.epoch, (ack.task.processor, ack.task.index),
                                                    ack.size_bytes, ack.ended, self.clock, ack.alignment_s, ack.root,
                                                    ack.depth, ack.records_in))

    def _decline(self, executor_id: int, decline: lifecycle.DeclineCheckpoint) -> None:
        log.warning("checkpoint %s declined: %s", decline.checkpoint_id, decline.reason)
        self._carry_out(self.state.checkpoint_declined(decline.checkpoint_id, decline.epoch,
                                                       (decline.task.processor, decline.task.index), decline.reason,
                                                       self.clock))

    def _commit(self, executor_id: int, commit: lifecycle.Commit) -> None:
        """Commit at once (an executor does it off the task's loop); a failed commit fails
        the task recoverably: the app rolls back and commits again."""
        node, machine = self.nodes[(commit.task.processor, commit.task.index)], self.executors[executor_id]
        node.core.completed(commit.checkpoint_id)
        try:
            node.task.checkpoint_complete(commit.checkpoint_id)
        except Exception as exc:
            self._do(executor_id, machine.commit_failed(commit.task, node.core.epoch,
                                                        failure_report(exc, node.task.context, FailureKind.FAULT)))
            return
        self._do(executor_id, machine.committed(commit.task, node.core.epoch, commit.checkpoint_id, commit.final))

    def _stop_task(self, executor_id: int, stop: lifecycle.StopTask) -> None:
        """The task's loop returns at once, without an error."""
        node = self.nodes.get((stop.task.processor, stop.task.index))
        if node is not None:
            self._do(executor_id, self.executors[executor_id].task_done(stop.task, node.core.epoch, None, False))

    def _report_ended(self, executor_id: int, report: lifecycle.ReportEnded) -> None:
        self._carry_out(self.state.task_ended((report.task.processor, report.task.index), report.epoch, self.clock))

    def _report_finished(self, executor_id: int, report: lifecycle.ReportFinished) -> None:
        self._carry_out(self.state.task_finished((report.task.processor, report.task.index), report.epoch))

    def _report_failed(self, executor_id: int, report: lifecycle.ReportFailed) -> None:
        self._carry_out(self.state.task_failed((report.task.processor, report.task.index), report.epoch,
                                               report.error, report.recoverable, executor_id, self.clock))

    def _exit(self, executor_id: int, exit_: lifecycle.Exit) -> None:
        self.executors.pop(executor_id, None)

    @staticmethod
    def _stop(node: _Node) -> None:
        """The task's process is gone: on_stop, whatever it raises (as an executor does)."""
        if node.started:
            node.started = False
            try:
                node.task.on_stop()
            except Exception:
                pass

    def _kill_executor(self) -> None:
        """One live executor, picked by the seed, exits (its tasks die with it): the
        AppMaster hears it stopped."""
        executors = sorted(e.executor_id for e in self.state.live_executors())
        executor = self.state.executors[executors[self.random.randrange(len(executors))]]
        machine = self.executors.pop(executor.executor_id, None)
        if machine is not None:
            self._do(executor.executor_id, machine.stop())
        self._carry_out(self.state.executor_stopped(executor.executor_id, executor.worker_id, "was killed", False,
                                                    self.clock))

    # --- driving -----------------------------------------------------------------------

    async def _loop(self, crash_after_frames: int | None, schedule: list[tuple[int, Callable[[], None]]]) -> None:
        """Step until the app's outcome is decided or nothing can move; a step a rollback
        interrupted is over, and the next one drives the new attempt."""
        while self.state.outcome is None:
            try:
                if not await self._step(crash_after_frames, schedule):
                    return
            except _Interrupted:
                continue

    async def _step(self, crash_after_frames: int | None, schedule: list[tuple[int, Callable[[], None]]]) -> bool:
        """Deliver a frame if any can go (or first what ``schedule`` asks once that many
        went: a kill, a rescale); else a round of source reads; else wait for the first
        async call to finish. False when nothing can move. A full task takes no frames and
        reads nothing."""
        ready = [channel for channel, frames in self.wire.items()
                 if frames and not self.nodes[channel[1]].waiting and self.nodes[channel[1]].core.accepting]
        if ready:
            if crash_after_frames is not None and self._delivered >= crash_after_frames:
                raise SimulatedCrash(f"stopped after {self._delivered} frames")
            if schedule and self._delivered >= schedule[0][0]:
                schedule.pop(0)[1]()
                return True
            self._deliver(*ready[self.random.randrange(len(ready))])
            return True
        readable = [node for node in self.nodes.values() if node.source is not None and not node.core.parked
                    and not node.core.input_ended and not node.waiting and node.core.accepting]
        if not readable:
            if not any(node.core.pending for node in self.nodes.values()):
                return False
            self.results.clear()
            await self.results.wait()
            self._poll()
            return True
        self._tick()
        self.random.shuffle(readable)
        idle = True
        for node in readable:
            actions, count = self._guard(node, node.source.step)
            self._act(node, actions)
            idle = idle and count == 0
            if any(self.inboxes.values()):
                break
        if idle:  # every source is waiting for data: sleep (calls go on meanwhile), do not spin
            await asyncio.sleep(min(n.task.source.idle_wait_s() for n in readable))
            self._poll()
        return True

    def _tick(self) -> None:
        """The clock moves on: every live executor heartbeats, the AppMaster ticks, then
        the tasks' due wakeups fire."""
        self.clock += 1
        for executor in self.state.live_executors():
            self.state.executor_heartbeat(executor.executor_id, self.clock)
        self._carry_out(self.state.tick(self.clock))
        self._carry_out(self.state.input_watermarks({key: node.core.watermark for key, node in self.nodes.items()},
                                                    self.clock, {key: node.core.latest_event_ms
                                                                 for key, node in self.nodes.items()}))
        now = self.now_ms()
        for node in list(self.nodes.values()):
            due = node.core.next_wakeup_ms()
            if due is not None and due <= now:
                self._act(node, self._guard(node, node.core.wakeup, now))

    def _request_poll(self, key: TaskKey) -> None:
        """A task's async call finished (called on the loop, while the engine waits)."""
        self.polls.add(key)
        self.results.set()

    def _poll(self) -> None:
        """Take in the results of the tasks whose calls finished, in task order."""
        polls, self.polls = sorted(self.polls), set()
        for key in polls:
            node = self.nodes.get(key)
            if node is not None:
                self._act(node, self._guard(node, node.core.poll))

    def _deliver(self, sender: TaskKey, receiver: TaskKey) -> None:
        node, outgoing = self.nodes[receiver], self.wire[(sender, receiver)].popleft()
        self.inboxes[receiver] -= 1
        self._delivered += 1
        _, frame = self._guard(node, self.reader.feed, outgoing.data)
        self._act(node, self._guard(node, node.core.receive, sender, frame))
        output = node.task.output
        if output and (len(output) >= self.config.batch_records or not self.inboxes[receiver]):
            self._act(node, [node.core.flush()])  # as an executor does when its inbox ran dry

    def _act(self, node: _Node, actions: list) -> None:
        for action in actions:
            if self.nodes.get(node.key) is not node:
                return  # retired meanwhile (a rollback): what it was doing dies with it
            kind = type(action)
            if kind is Grant:
                upstream = self.nodes[action.sender]
                upstream.sender.grant(*node.key, self.epoch, action.consumed, action.window)
                self._release(upstream)
                continue
            self._send(node, self._guard(node, node.sender.act, action))
            if kind is End:
                executor_id, machine = self._machine(node)
                self._do(executor_id, machine.task_ended(TaskId(*node.key), node.core.epoch))
            elif kind is Snapshot:
                executor_id, machine = self._machine(node)
                self._do(executor_id, machine.snapshot_taken(TaskId(*node.key), node.core.epoch, action))

    def _send(self, node: _Node, outgoing: list[Outgoing]) -> None:
        node.waiting.extend(outgoing)
        self._release(node)

    def _release(self, node: _Node) -> None:
        """Put on the wire, in order, the waiting frames that have credit."""
        waiting = node.waiting
        while waiting and waiting[0].channel.has_credit(waiting[0].frame.seq):
            outgoing = waiting.popleft()
            self.wire[(node.key, outgoing.channel.receiver)].append(outgoing)
            self.inboxes[outgoing.channel.receiver] += 1

    # --- checkpoints ---------------------------------------------------------------------

    def _restored(self, checkpoint_id: int, snapshots: dict[TaskKey, bytes]) -> cp.CheckpointMeta:
        """An earlier engine's checkpoint, as this engine's completed one to start from."""
        missing, extra = sorted(set(self.tasks) - set(snapshots)), sorted(set(snapshots) - set(self.tasks))
        if missing or extra:  # (taken after a rescale: resume it with the app at that parallelism)
            raise RuntimeError(f"checkpoint {checkpoint_id} does not fit this app's tasks: "
                               f"{f'none of {missing}' if missing else ''}{'; ' if missing and extra else ''}"
                               f"{f'snapshots of tasks {extra} it does not run' if extra else ''}")
        self.completed[checkpoint_id] = snapshots
        return cp.CheckpointMeta(checkpoint_id, self.first_epoch, self.clock, 0.0, sum(map(len, snapshots.values())),
                                 tuple(sorted(snapshots)), False)

    def _coordinator(self, restored_from: cp.CheckpointMeta | None) -> cp.CheckpointCoordinator:
        """The AppMaster's coordinator, on this engine's clock; nothing times out in memory."""
        return cp.CheckpointCoordinator(
            self.tasks, self.sources, interval_s=self.checkpoint_every, timeout_s=math.inf, keep=KEEP_CHECKPOINTS,
            max_consecutive_failures=0, epoch=self.first_epoch, restored_from=restored_from,
            compact_depth=COMPACT_DEPTH)

    def _trigger(self, trigger: cp.TriggerCheckpoint | cp.RetriggerCheckpoint) -> None:
        """Sources inject the barrier; a repeated trigger gets the acks again."""
        for executor_id, machine in list(self.executors.items()):
            self._do(executor_id, machine.trigger(trigger.epoch, trigger.checkpoint_id, trigger.park))

    def _store_checkpoint(self, store: cp.StoreCheckpoint) -> None:
        self.completed[store.meta.checkpoint_id] = self._taken.pop(store.meta.checkpoint_id)
        self._carry_out(self.state.checkpoint_stored(store.meta.checkpoint_id, self.clock))

    def _notify_complete(self, complete: cp.NotifyComplete) -> None:
        self._complete(complete.checkpoint_id, complete.epoch, complete.final)
        if complete.compacted:
            for node in self.nodes.values():
                node.core.compacted(complete.compacted)

    def _repeat_final_complete(self, repeat: st.RepeatFinalComplete) -> None:
        self._complete(repeat.checkpoint_id, repeat.epoch, True)

    def _complete(self, checkpoint_id: int, epoch: int, final: bool) -> None:
        for executor_id, machine in list(self.executors.items()):
            self._do(executor_id, machine.checkpoint_complete(epoch, checkpoint_id, final))

    def _compact(self, compact: cp.CompactCheckpoint) -> None:
        """At once: the AppMaster does it beside the tasks."""
        snapshots = self.completed[compact.checkpoint_id]
        for key in compact.tasks:
            snapshots[key] = self._compacted(compact.checkpoint_id, key)
        self._carry_out(self.state.checkpoint_compacted(compact.checkpoint_id, True, self.clock,
                                                        {key: len(snapshots[key]) for key in compact.tasks}))

    def _prune(self, prune: cp.PruneCheckpoints) -> None:
        for checkpoint_id in prune.checkpoint_ids:
            self.completed.pop(checkpoint_id, None)

    def _abandon(self, abandon: cp.AbandonCheckpoint) -> None:
        """A rollback dropped the checkpoint in flight."""
        self._taken.pop(abandon.checkpoint_id, None)

    def _guard(self, node: _Node, fn, *args):
        """Run a task's step; an exception fails the task, as its loop on an executor, and
        the AppMaster's machine decides: the app rolls back, or ends (a user error repeated
        after a restore, the budget spent: its EndApp raises PipelineFailed), and what was
        under way stops (_Interrupted, caught where the engine drives the next step)."""
        try:
            return fn(*args)
        except (PipelineFailed, _Interrupted):
            raise
        except Exception as exc:
            error = failure_report(exc, node.task.context)
            recoverable = error.kind == FailureKind.FAULT
            executor_id, machine = self._machine(node)
            self._do(executor_id, machine.task_done(TaskId(*node.key), node.core.epoch, error, recoverable))
            raise _Interrupted(error.message) from exc


class _Interrupted(Exception):
    """A task failed in a way a rollback repairs, and the app rolled back: what the engine
    was doing belongs to the replaced attempt."""


def _on_a_loop(coro: Coroutine) -> None:
    """Run ``coro`` on an event loop of its own; a caller already on one (an async test,
    ``gearbus run --runner test``) gets it on a thread, as a loop cannot run in another."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(coro)
        return
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gearbus-test-runner") as pool:
        pool.submit(asyncio.run, coro).result()
