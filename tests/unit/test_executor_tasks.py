"""The executor's task lifecycle machine, without a network: events in, instructions out."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gearbus.runtime.core import Snapshot
from gearbus.runtime.executor_tasks import (
    ACKS_KEPT,
    EXIT_APPMASTER_GONE,
    EXIT_FENCED,
    AckCheckpoint,
    Commit,
    DeclineCheckpoint,
    ExecutorTasks,
    Exit,
    InjectBarrier,
    OpenTasks,
    Phase,
    ReportEnded,
    ReportFailed,
    ReportFinished,
    ResumeTasks,
    RetireTasks,
    RewireTasks,
    LaunchRefused,
    StartTasks,
    StopTask,
    StoreSnapshot,
)
from shared.messages import AppError, LaunchTasks, TaskId

SOURCE, SINK = TaskId(0, 0), TaskId(1, 0)
ERROR = AppError("ValueError", "boom", "sink")


def launch(epoch: int, tasks=(SOURCE, SINK)) -> LaunchTasks:
    return LaunchTasks(list(tasks), "d", epoch=epoch)


def snapshot(checkpoint_id: int, ended: bool = False) -> Snapshot:
    return Snapshot(checkpoint_id, None, ended, [], 0)


def running(epoch: int = 0) -> ExecutorTasks:
    m = ExecutorTasks()
    assert m.launch(launch(epoch), [SOURCE]) == [OpenTasks(launch(epoch))]
    assert m.hosted() == []  # not open yet: a repeated launch answers with nothing hosted
    m.opened(epoch)
    assert m.start_all() == [StartTasks((SOURCE, SINK))]
    m.validate()
    return m


def acked(m: ExecutorTasks, task: TaskId, epoch: int, checkpoint_id: int, ended: bool = False) -> None:
    taken = snapshot(checkpoint_id, ended)
    assert m.snapshot_taken(task, epoch, taken) == [StoreSnapshot(task, epoch, taken)]
    assert m.snapshot_stored(task, epoch, checkpoint_id, 10, ended) == [
        AckCheckpoint(task, epoch, checkpoint_id, 10, ended)]


# -- launching ---------------------------------------------------------------------------------

def test_a_launch_opens_then_starts_its_tasks_once():
    m = running()
    assert m.hosted() == [SOURCE, SINK] and m.phase(SINK) is Phase.RUNNING
    assert m.launch(launch(0), [SOURCE]) == []  # the same launch again changes nothing
    assert m.start_all() == []


def test_a_newer_epoch_retires_the_older_tasks_and_an_older_launch_is_refused():
    m = running(0)
    assert m.launch(launch(2, [SINK]), []) == [RetireTasks((SOURCE, SINK)), OpenTasks(launch(2, [SINK]))]
    with pytest.raises(LaunchRefused, match="already runs attempt 2; launch of attempt 1 refused"):
        m.launch(launch(1), [SOURCE])
    m.validate()


def test_a_failed_launch_retires_what_was_opened_and_hosts_nothing():
    m = ExecutorTasks()
    m.launch(launch(0), [SOURCE])
    assert m.launch_failed(0) == [RetireTasks((SOURCE, SINK))]
    assert m.hosted() == [] and m.start_all() == []
    m.opened(0)
    assert m.start_all() == []


# -- checkpoints -------------------------------------------------------------------------------

def test_a_trigger_injects_at_the_sources_and_repeats_the_acks_it_kept():
    m = running()
    assert m.trigger(0, 1) == [InjectBarrier((SOURCE,), 1)]
    acked(m, SINK, 0, 1)
    assert m.trigger(0, 1) == [InjectBarrier((SOURCE,), 1), AckCheckpoint(SINK, 0, 1, 10, False)]
    assert m.trigger(1, 1) == []  # another epoch's trigger


def test_only_the_last_checkpoints_acks_are_kept():
    m = running()
    for checkpoint_id in range(1, ACKS_KEPT + 2):
        acked(m, SINK, 0, checkpoint_id)
    assert m.trigger(0, 1) == [InjectBarrier((SOURCE,), 1)]
    assert m.trigger(0, 2)[1] == AckCheckpoint(SINK, 0, 2, 10, False)
    m.validate()


def test_a_declined_snapshot_is_declined_and_never_committed():
    m = running()
    m.snapshot_taken(SINK, 0, snapshot(1))
    assert m.snapshot_declined(SINK, 0, 1, "too big") == [DeclineCheckpoint(SINK, 0, 1, "too big")]
    assert m.checkpoint_complete(0, 1, False) == []


def test_a_completed_checkpoint_is_committed_once_by_each_task_that_acked_it_in_order():
    m = running()
    acked(m, SOURCE, 0, 1)
    acked(m, SINK, 0, 1)
    acked(m, SINK, 0, 2)
    assert m.checkpoint_complete(0, 2, False) == [Commit(SINK, 2, False)]  # the source never acked 2
    assert m.checkpoint_complete(0, 1, False) == [Commit(SOURCE, 1, False)]  # the sink is past 1
    assert m.checkpoint_complete(0, 2, False) == []  # repeated
    assert m.checkpoint_complete(1, 3, False) == []  # another epoch
    m.committed(SINK, 0, 2, False)
    m.validate()


def test_the_final_checkpoint_finishes_an_ended_task_after_its_commit_and_loop():
    m = running()
    assert m.task_ended(SINK, 0) == [ReportEnded(SINK, 0)]
    assert m.task_ended(SINK, 0) == []
    acked(m, SINK, 0, 3, ended=True)
    assert m.checkpoint_complete(0, 3, True) == [Commit(SINK, 3, True)]
    assert not m.finished(SINK)
    assert m.committed(SINK, 0, 3, True) == [StopTask(SINK)]
    assert m.finished(SINK) and m.phase(SINK) is Phase.FINISHING
    assert m.task_done(SINK, 0, None, False) == [ReportFinished(SINK, 0)]
    assert m.task_done(SINK, 0, ERROR, False) == []
    m.validate()


def test_a_final_commit_of_a_task_not_ended_does_not_finish_it():
    m = running()
    acked(m, SINK, 0, 3)
    m.checkpoint_complete(0, 3, True)
    assert m.committed(SINK, 0, 3, True) == [] and not m.finished(SINK)


def test_a_loop_returning_without_an_error_before_it_finished_is_a_broken_shell():
    m = running()
    with pytest.raises(AssertionError, match="is not a transition"):
        m.task_done(SINK, 0, None, False)


# -- failures and stops ------------------------------------------------------------------------

def test_a_failed_commit_stops_the_task_and_reports_one_recoverable_failure():
    m = running()
    acked(m, SINK, 0, 1)
    m.checkpoint_complete(0, 1, False)
    assert m.commit_failed(SINK, 0, ERROR) == [StopTask(SINK), ReportFailed(SINK, 0, ERROR, True)]
    assert m.task_done(SINK, 0, None, False) == []  # its loop returns: nothing more
    assert m.commit_failed(SINK, 0, ERROR) == []


def test_a_task_failure_is_reported_once_with_its_recoverability():
    m = running()
    assert m.task_done(SOURCE, 0, ERROR, False) == [ReportFailed(SOURCE, 0, ERROR, False)]
    assert m.task_done(SOURCE, 0, ERROR, False) == []
    assert m.phase(SOURCE) is Phase.FAILED and m.trigger(0, 1) == []


def test_retired_tasks_report_nothing():
    m = running(0)
    m.launch(launch(1), [SOURCE])
    assert m.task_done(SINK, 0, ERROR, True) == []
    assert m.task_ended(SINK, 0) == []
    assert m.snapshot_taken(SINK, 0, snapshot(1)) == []
    assert m.snapshot_stored(SINK, 0, 1, 10, False) == []
    assert m.snapshot_declined(SINK, 0, 1, "x") == []


def test_fenced_or_orphaned_executors_retire_their_tasks_and_exit_once():
    m = running()
    assert m.fenced("replaced") == [RetireTasks((SOURCE, SINK)), Exit(EXIT_FENCED, "replaced")]
    assert m.appmaster_gone("silent") == []
    assert m.task_done(SINK, 0, ERROR, True) == [] and m.stop() == []
    with pytest.raises(LaunchRefused, match="is exiting; launch of attempt 1 refused"):
        m.launch(launch(1), [SOURCE])
    m = running()
    assert m.appmaster_gone("silent") == [RetireTasks((SOURCE, SINK)), Exit(EXIT_APPMASTER_GONE, "silent")]
    m.validate()


# -- any ordering ------------------------------------------------------------------------------

TASKS = (SOURCE, SINK, TaskId(1, 1))
#: Events by weight: those that end tasks or the executor come rarely, or little else would happen.
WEIGHTS = {"snapshot": 60, "stored": 60, "complete": 60, "committed": 60, "ended": 30, "done": 15, "trigger": 20,
           "start_all": 20, "opened": 20, "declined": 5, "launch": 8, "commit_failed": 3, "launch_failed": 2,
           "stop": 1, "fenced": 1, "appmaster_gone": 1}
STARTING = ("launch", "opened", "start_all")


class Shell:
    """What the executor's shell would send: a store's or a commit's outcome for one it was
    told to make, a task's events once its loop runs, a loop's return without an error only
    after it was told to stop; epochs mostly the current one, sometimes an older one."""

    def __init__(self, rnd: random.Random):
        self.rnd, self.m = rnd, ExecutorTasks()
        self.stores: list[StoreSnapshot] = []
        self.commits: list[tuple[Commit, int]] = []  # with the epoch they were told in
        self.stopping: set[tuple[TaskId, int]] = set()
        self.loops: list[tuple[TaskId, int]] = []  # started, not returned

    def epoch(self) -> int:
        return self.m.epoch - self.rnd.choice((0, 0, 0, 1))

    def checkpoint(self) -> int:
        return self.rnd.randint(1, 4)

    def step(self, kind: str) -> list | None:
        """The event's instructions, or None if the shell could not send it now."""
        m, rnd = self.m, self.rnd
        if kind == "launch":
            tasks = rnd.sample(TASKS, rnd.randint(1, len(TASKS)))
            return m.launch(launch(m.epoch + rnd.choice((1, 1, 0, -1)), tasks), [SOURCE])
        if kind == "opened":
            m.opened(self.epoch())
            return []
        if kind == "launch_failed":
            return m.launch_failed(self.epoch())
        if kind == "start_all":
            return m.start_all()
        if kind == "trigger":
            return m.trigger(self.epoch(), self.checkpoint())
        if kind == "complete":
            return m.checkpoint_complete(self.epoch(), self.checkpoint(), rnd.random() < 0.5)
        if kind in ("stored", "declined", "committed", "commit_failed"):
            pending = self.stores if kind in ("stored", "declined") else self.commits
            if not pending:
                return None
            told = pending.pop(rnd.randrange(len(pending)))
            if kind == "stored":
                return m.snapshot_stored(told.task, told.epoch, told.snapshot.checkpoint_id, 10, told.snapshot.ended)
            if kind == "declined":
                return m.snapshot_declined(told.task, told.epoch, told.snapshot.checkpoint_id, "declined")
            commit, epoch = told
            if kind == "committed":
                return m.committed(commit.task, epoch, commit.checkpoint_id, commit.final)
            return m.commit_failed(commit.task, epoch, ERROR)
        if kind in ("snapshot", "ended", "done"):
            if not self.loops:
                return None
            task, epoch = loop = rnd.choice(self.loops)
            if kind == "snapshot":
                return m.snapshot_taken(task, epoch, snapshot(self.checkpoint(), rnd.random() < 0.5))
            if kind == "ended":
                return m.task_ended(task, epoch)
            ok = loop in self.stopping and rnd.random() < 0.8
            self.loops.remove(loop)
            return m.task_done(task, epoch, None if ok else ERROR, rnd.random() < 0.5)
        if kind == "stop":
            return m.stop()
        if kind == "fenced":
            return m.fenced("replaced")
        return m.appmaster_gone("silent")


@settings(max_examples=500, deadline=None)
@given(st.randoms(use_true_random=True), st.integers(10, 200))
def test_any_ordering_keeps_the_invariants(rnd, steps):
    """Whatever arrives in whatever order: the invariants hold after every step; a task of
    an older epoch never reports; a task reports finished only after a final checkpoint it
    acknowledged was committed; at most one failure report per task and epoch; no commit
    beyond the last checkpoint the task acknowledged, and none twice; at most one exit."""
    shell = Shell(rnd)
    m = shell.m
    acks: set[tuple[TaskId, int, int]] = set()  # (task, epoch, checkpoint) acknowledged
    finals: set[tuple[TaskId, int, int]] = set()  # final commits told
    last_commit: dict[tuple[TaskId, int], int] = {}
    reported: set[tuple[str, TaskId, int]] = set()
    exits = 0
    for kind in STARTING + tuple(rnd.choices(tuple(WEIGHTS), tuple(WEIGHTS.values()), k=steps)):
        try:
            out = shell.step(kind)
        except LaunchRefused:
            assert m.exit_code or kind == "launch"
            continue
        if out is None:
            continue
        m.validate()
        for instruction in out:
            if isinstance(instruction, (ReportEnded, ReportFinished, ReportFailed, AckCheckpoint, DeclineCheckpoint,
                                        StoreSnapshot)):
                assert instruction.epoch == m.epoch, f"a task of an older epoch reports: {instruction}"
            if isinstance(instruction, StartTasks):
                shell.loops += [(task, m.epoch) for task in instruction.tasks]
            elif isinstance(instruction, StoreSnapshot):
                shell.stores.append(instruction)
            elif isinstance(instruction, AckCheckpoint):
                acks.add((instruction.task, instruction.epoch, instruction.checkpoint_id))
            elif isinstance(instruction, Commit):
                key = (instruction.task, m.epoch)
                assert any(t == instruction.task and e == m.epoch and c >= instruction.checkpoint_id
                           for t, e, c in acks), "a commit beyond the last checkpoint the task acknowledged"
                assert instruction.checkpoint_id > last_commit.get(key, 0), "a commit again or out of order"
                last_commit[key] = instruction.checkpoint_id
                shell.commits.append((instruction, m.epoch))
                if instruction.final:
                    finals.add((instruction.task, m.epoch, instruction.checkpoint_id))
            elif isinstance(instruction, StopTask):
                shell.stopping.add((instruction.task, m.epoch))
            elif isinstance(instruction, ReportFinished):
                assert any((t, e) == (instruction.task, instruction.epoch) for t, e, _ in finals), \
                    "finished without a final checkpoint it acknowledged committed"
                assert ("finished", instruction.task, instruction.epoch) not in reported
                reported.add(("finished", instruction.task, instruction.epoch))
            elif isinstance(instruction, ReportFailed):
                assert ("failed", instruction.task, instruction.epoch) not in reported, "a second failure report"
                reported.add(("failed", instruction.task, instruction.epoch))
            elif isinstance(instruction, Exit):
                exits += 1
                assert exits == 1


# -- keeping parked tasks running (a rescale of other processors) -------------------------------

SINK1 = TaskId(1, 1)


def parked(m: ExecutorTasks, task: TaskId, epoch: int, checkpoint_id: int, park: bool = True) -> None:
    """``task`` snapshots ``checkpoint_id`` (parking after it, unless ``park`` is False) and acks it."""
    taken = Snapshot(checkpoint_id, None, False, [], 0, park=park)
    assert m.snapshot_taken(task, epoch, taken) == [StoreSnapshot(task, epoch, taken)]
    m.snapshot_stored(task, epoch, checkpoint_id, 10, False)
    m.validate()


def rescaling(epoch: int, keep=(SOURCE,), checkpoint_id: int = 3) -> LaunchTasks:
    """The sink rescaled to two tasks from ``checkpoint_id``, the tasks in ``keep`` kept running."""
    return LaunchTasks([SOURCE, SINK, SINK1], "d", epoch=epoch, restore_checkpoint=checkpoint_id,
                       keep_running=list(keep))


def test_a_parking_trigger_asks_the_sources_to_park():
    m = running()
    assert m.trigger(0, 3, park=True) == [InjectBarrier((SOURCE,), 3, True)]
    m.validate()


def test_a_launch_keeping_a_parked_task_rewires_it_retires_the_others_opens_and_commits_its_checkpoint():
    """Rewired first: in the new epoch before the shell awaits the retirement."""
    m = running(0)
    parked(m, SOURCE, 0, 3)
    parked(m, SINK, 0, 3)
    assert m.launch(rescaling(1), [SOURCE]) == [RewireTasks((SOURCE,), 1), RetireTasks((SINK,)),
                                                OpenTasks(rescaling(1)), Commit(SOURCE, 3, False)]
    m.validate()
    assert m.phase(SOURCE) is Phase.RUNNING and m.phase(SINK) is Phase.OPENING and m.epoch == 1
    assert m.checkpoint_complete(0, 3, False) == [] and m.checkpoint_complete(1, 3, False) == []  # asked once
    m.opened(1)
    m.validate()
    assert m.start_all() == [StartTasks((SINK, SINK1)), ResumeTasks((SOURCE,))]
    m.validate()
    assert m.start_all() == []
    assert m.trigger(1, 4) == [InjectBarrier((SOURCE,), 4)]  # still the source, in the new epoch
    m.validate()


def test_a_kept_task_already_told_to_commit_its_checkpoint_is_not_told_again():
    m = running(0)
    parked(m, SOURCE, 0, 3)
    assert m.checkpoint_complete(0, 3, False) == [Commit(SOURCE, 3, False)]
    m.validate()
    assert m.launch(rescaling(1), [SOURCE]) == [RewireTasks((SOURCE,), 1), RetireTasks((SINK,)),
                                                OpenTasks(rescaling(1))]
    m.validate()


def test_a_kept_task_that_had_ended_resumes_and_reports_its_end_in_the_new_epoch():
    m = running(0)
    assert m.task_ended(SOURCE, 0) == [ReportEnded(SOURCE, 0)]
    parked(m, SOURCE, 0, 3)
    m.launch(rescaling(1), [SOURCE])
    m.validate()
    m.opened(1)
    m.validate()
    assert m.start_all() == [StartTasks((SINK, SINK1)), ResumeTasks((SOURCE,)), ReportEnded(SOURCE, 1)]
    assert m.phase(SOURCE) is Phase.ENDED
    m.validate()


def _not_parked(m):
    parked(m, SOURCE, 0, 3, park=False)


def _parked_elsewhere(m):
    parked(m, SOURCE, 0, 2)
    parked(m, SOURCE, 0, 3, park=False)


def _failed(m):
    parked(m, SOURCE, 0, 3)
    m.task_done(SOURCE, 0, ERROR, True)
    m.validate()


@pytest.mark.parametrize("before, launching", [
    (_not_parked, rescaling(1)),
    (_parked_elsewhere, rescaling(1)),  # parked at 2, not at the checkpoint the launch goes on from
    (_failed, rescaling(1)),
    (lambda m: parked(m, SOURCE, 0, 3), rescaling(1, keep=(SOURCE, SINK1))),  # not hosted here
    (lambda m: parked(m, SOURCE, 0, 3), LaunchTasks([SINK, SINK1], "d", epoch=1, restore_checkpoint=3,
                                                    keep_running=[SOURCE])),  # not among the launch's tasks
], ids=["not_parked", "parked_at_another", "failed", "not_hosted", "not_launched"])
def test_a_launch_keeping_a_task_not_running_here_parked_at_its_checkpoint_is_refused_and_changes_nothing(
        before, launching):
    m = running(0)
    before(m)
    phase = m.phase(SOURCE)
    with pytest.raises(LaunchRefused, match="parked at checkpoint 3: it cannot keep them running"):
        m.launch(launching, [SOURCE])
    assert m.epoch == 0 and m.phase(SOURCE) is phase and m.phase(SINK) is Phase.RUNNING
    m.validate()


def test_a_task_kept_once_is_not_parked_any_more():
    m = running(0)
    parked(m, SOURCE, 0, 3)
    m.launch(rescaling(1), [SOURCE])
    m.opened(1)
    m.start_all()
    m.validate()
    with pytest.raises(LaunchRefused, match="does not run tasks 0.0 parked at checkpoint 3"):
        m.launch(rescaling(2), [SOURCE])
    m.validate()
