"""The AppMaster's state machine, without a network: events in, instructions out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gearbus.runtime import checkpoints as cp
from gearbus.runtime.appmaster_state import (
    AnswerReplace,
    AnswerRescale,
    AnswerSavepoint,
    AppMasterState,
    AskExecutorsToRegister,
    Deploy,
    EndApp,
    Fence,
    LaunchExecutor,
    Phase,
    Refused,
    ReportState,
    RequestSlot,
    RepeatFinalComplete,
    RequestSlots,
    Settings,
    Shutdown,
    StoreEpoch,
)
from shared.messages import AppError, AppState, FailureKind

SRC0, SRC1, SINK0, SINK1 = (0, 0), (0, 1), (1, 0), (1, 1)
TASKS = [SRC0, SRC1, SINK0, SINK1]


def machine(epoch: int = 0, max_restarts: int = 10, **kw) -> AppMasterState:
    coordinator = cp.CheckpointCoordinator(TASKS, [SRC0, SRC1], interval_s=1, timeout_s=5, keep=2,
                                           max_consecutive_failures=3, epoch=epoch)
    return AppMasterState(TASKS, coordinator, Settings(max_restarts=max_restarts, **kw), epoch=epoch)


def of(kind, instructions):
    return [i for i in instructions if isinstance(i, kind)]


def running(m: AppMasterState, now: float = 0) -> None:
    assert of(RequestSlots, m.start(now)) == [RequestSlots(2)]
    assert m.slots_allocated(["w1", "w2"], now) == [LaunchExecutor(0, "w1"), LaunchExecutor(1, "w2")]
    assert m.executor_registered(0, "w1", [], 100, now) == []
    [deploy] = m.executor_registered(1, "w2", [], 101, now)
    assert deploy == Deploy(0, None, ((0, (SRC0, SINK0)), (1, (SRC1, SINK1))))  # task i of each together
    assert ReportState(AppState.ACTIVE) in m.deployed(0, now)
    assert m.phase is Phase.RUNNING
    m.validate()


def complete_checkpoint(m: AppMasterState, now: float) -> list:
    [trigger] = of(cp.TriggerCheckpoint, m.tick(now))
    out = []
    for task in TASKS:
        out += m.checkpoint_acked(trigger.checkpoint_id, m.epoch, task, 10, False, now)
    [store] = of(cp.StoreCheckpoint, out)
    return out + m.checkpoint_stored(store.meta.checkpoint_id, now)


def rolled_back_to(m: AppMasterState, executor_id: int, worker: str, now: float) -> Deploy:
    assert m.slot_allocated(executor_id, worker, now) == [LaunchExecutor(executor_id, worker)]
    [deploy] = m.executor_registered(executor_id, worker, [], 200, now)
    return deploy


# -- starting -------------------------------------------------------------------------------

def test_a_fresh_app_stores_its_epoch_gets_slots_launches_and_deploys_once_all_registered():
    m = machine()
    running(m)


def test_round_robin_placement_spreads_the_tasks_of_a_processor():
    for placement, expected in (("by_index", ((0, (SRC0, SINK0)), (1, (SRC1, SINK1)), (2, ()))),
                                ("round_robin", ((0, (SRC0, SINK1)), (1, (SRC1,)), (2, (SINK0,))))):
        m = machine(placement=placement, executors=3)
        m.start(0)
        m.slots_allocated(["w1", "w2", "w3"], 0)
        m.executor_registered(0, "w1", [], 1, 0)
        m.executor_registered(1, "w2", [], 1, 0)
        [deploy] = m.executor_registered(2, "w3", [], 1, 0)
        assert deploy.assignments == expected, placement


def test_an_executor_lost_while_starting_fails_the_app():
    m = machine()
    m.start(0)
    m.slots_allocated(["w1", "w2"], 0)
    out = m.executor_stopped(1, "w2", "exited with code 1", False, 0)
    [end] = of(EndApp, out)
    assert end.state == AppState.FAILED and end.error.error_type == "ExecutorLost"
    assert of(Fence, out) == [Fence(1, "w2", "executor 1 on worker w2 exited with code 1")]


def test_registrations_that_do_not_fit_are_refused_with_a_reason():
    m = machine()
    running(m)
    with pytest.raises(Refused, match="already registered") as refused:
        m.executor_registered(0, "w9", [], 7, 1)
    assert refused.value.code == "conflict"
    with pytest.raises(Refused) as refused:
        m.executor_registered(9, "w1", [], 7, 1)
    assert refused.value.code == "not_found"


# -- recovery --------------------------------------------------------------------------------

def test_a_lost_executor_is_fenced_and_the_app_rolls_back_to_the_last_checkpoint_elsewhere():
    m = machine()
    running(m)
    complete_checkpoint(m, 1)
    out = m.executor_stopped(1, "w2", "exited with code -9", True, 2)
    assert of(Fence, out) == [Fence(1, "w2", "executor 1 lost its worker w2")]
    assert of(StoreEpoch, out) == [StoreEpoch(1, 1)]
    assert of(RequestSlot, out) == [RequestSlot(2, ("w2",))]
    assert m.phase is Phase.ROLLING_BACK
    deploy = rolled_back_to(m, 2, "w1", 2)
    assert deploy.epoch == 1 and deploy.restore.checkpoint_id == 1
    assert deploy.assignments == ((0, (SRC0, SINK0)), (2, (SRC1, SINK1)))
    assert not of(ReportState, m.deployed(1, 3)) and m.phase is Phase.RUNNING  # ACTIVE was reported once
    m.validate()


def test_a_slot_away_from_the_suspect_worker_is_asked_first_then_any_and_then_the_app_fails():
    m = machine()
    running(m)
    assert of(RequestSlot, m.executor_stopped(1, "w2", "exited with code -9", True, 2)) == [RequestSlot(2, ("w2",))]
    assert of(RequestSlot, m.slot_failed(2, "no free slot")) == [RequestSlot(2, ())]  # the suspect's worker will do
    [end] = of(EndApp, m.slot_failed(2, "no free slot"))
    assert end.state == AppState.FAILED and end.error.error_type == "RecoveryFailed"
    assert "no slot for the lost tasks: no free slot" in end.error.message
    m.validate()


def test_losses_during_a_rollback_join_it_and_a_loss_while_deploying_starts_a_new_epoch():
    m = machine()
    running(m)
    m.executor_stopped(0, "w1", "exited with code 1", False, 1)
    out = m.executor_stopped(1, "w2", "exited with code 1", False, 1)  # joins: no second epoch
    assert m.epoch == 1 and not of(StoreEpoch, out) and of(RequestSlot, out) == [RequestSlot(3, ())]
    m.slot_allocated(2, "w3", 1)
    m.slot_allocated(3, "w4", 1)
    assert m.executor_registered(2, "w3", [], 1, 1) == []
    [deploy] = m.executor_registered(3, "w4", [], 1, 1)
    assert deploy.epoch == 1
    m.executor_stopped(2, "w3", "exited with code 1", False, 2)  # while deploying
    assert m.epoch == 2 and m.phase is Phase.ROLLING_BACK
    assert m.deployed(1, 2) == []  # the older epoch's report changes nothing
    m.validate()


def test_the_restart_budget_ends_the_app_and_a_worker_failing_often_is_avoided():
    m = machine(max_restarts=2, blacklist_after=2)
    running(m)
    for epoch in (0, 1):
        [deploy] = of(Deploy, m.task_failed(SRC0, epoch, AppError("E", "boom"), True, 0, 1))
        assert deploy.epoch == epoch + 1
        m.deployed(epoch + 1, 1)
    assert m.blacklist == {"w1"}
    [end] = of(EndApp, m.task_failed(SRC0, 2, AppError("E", "boom again"), True, 0, 3))
    assert end.state == AppState.FAILED and end.error.error_type == "RestartBudgetExhausted"
    assert "boom again" in end.error.message


def test_many_tasks_failing_at_once_cost_one_restart():
    m = machine()
    running(m)
    m.executor_stopped(1, "w2", "exited with code 1", False, 1)
    for task in TASKS:
        assert m.task_failed(task, 1, AppError("E", "lost connection"), True, 0, 1) == []
    assert m.restarts == 1 and m.epoch == 1


def test_a_silent_executor_is_lost_after_five_heartbeats():
    m = machine()
    running(m)
    m.executor_heartbeat(0, 4)
    m.executor_heartbeat(1, 0.5)
    assert not of(Fence, m.tick(5.4))
    [fence] = of(Fence, m.tick(5.6))
    assert fence.executor_id == 1 and "sent no heartbeat" in fence.reason
    with pytest.raises(Refused) as refused:
        m.executor_heartbeat(1, 6)
    assert refused.value.code == "fenced"


def user_error(message: str = "bad record", record: str = "{'n': 7}") -> AppError:
    return AppError("ValueError", message, "task sink[0] of processor 'sink'", "Traceback ...", FailureKind.USER,
                    "parse", record, "counts.py:12")


def test_a_user_error_repeated_after_a_restore_fails_the_app_on_its_second_occurrence_blaming_no_worker():
    m = machine(blacklist_after=1)
    running(m)
    error = user_error()
    [deploy] = of(Deploy, m.task_failed(SINK0, 0, error, False, 0, 1))  # once: retried, from the last checkpoint
    assert deploy.epoch == 1 and m.restarts == 1
    assert m.task_failed(SINK1, 0, error, False, 1, 1) == []  # the same epoch's: the rollback covers it
    m.deployed(1, 2)
    out = m.task_failed(SINK0, 1, error, False, 0, 3)
    assert of(EndApp, out) == [EndApp(AppState.FAILED, error)] and ReportState(AppState.FAILED, error) in out
    assert m.restarts == 1 and m.blacklist == set() and not m.failures
    assert m.task_failed(SINK1, 1, error, False, 1, 3) == []  # decided once
    m.validate()


def test_a_fault_is_retried_and_counts_against_its_worker_a_user_error_never_does():
    m = machine(blacklist_after=2)
    running(m)
    m.task_failed(SRC0, 0, user_error(record="1"), False, 0, 1)
    m.deployed(1, 1)
    m.task_failed(SRC0, 1, user_error(record="2"), False, 0, 2)
    m.deployed(2, 2)
    assert m.blacklist == set() and m.restarts == 2
    fault = AppError("TimeoutError", "nats: timeout", kind=FailureKind.FAULT)
    m.task_failed(SRC0, 2, fault, True, 0, 3)
    m.deployed(3, 3)
    assert m.blacklist == set() and m.failures == {"w1": 1}
    [deploy] = of(Deploy, m.task_failed(SRC0, 3, fault, True, 0, 4))  # a fault, identical again: retried still
    assert deploy.epoch == 4 and m.blacklist == {"w1"} and m.phase is Phase.DEPLOYING
    m.validate()


def test_user_errors_that_differ_are_retried_within_the_budget_and_the_last_one_is_shown():
    m = machine(max_restarts=2, blacklist_after=1)
    m.names = {0: "source", 1: "count"}
    running(m)
    for epoch, record in enumerate(("1", "2")):
        [deploy] = of(Deploy, m.task_failed(SINK1, epoch, user_error(record=record), False, 1, 1))
        m.deployed(deploy.epoch, 1)
    [end] = of(EndApp, m.task_failed(SINK1, 2, user_error(record="3"), False, 1, 2))
    assert end.error.error_type == "RestartBudgetExhausted" and end.error.where == "count[1]"
    assert end.error.message.startswith("count[1] failed: ValueError: bad record; gave up after 2 restarts")
    assert (end.error.kind, end.error.step, end.error.record, end.error.location) == \
        (FailureKind.USER, "parse", "3", "counts.py:12")
    assert m.blacklist == set()


def test_the_same_user_error_with_another_message_is_a_repeat():
    """A message may name the worker or the time: a missing input read on another worker
    after the restore is the same error."""
    m = machine(blacklist_after=1)
    running(m)
    m.task_failed(SINK0, 0, user_error("cannot read in.jsonl on worker w1"), False, 0, 1)
    m.deployed(1, 2)
    [end] = of(EndApp, m.task_failed(SINK0, 1, user_error("cannot read in.jsonl on worker w2"), False, 1, 3))
    assert end.error.message.endswith("w2") and m.restarts == 1 and m.blacklist == set()


def test_a_failure_from_an_executor_predating_kinds_is_a_user_error_unless_recoverable():
    m = machine(blacklist_after=1)
    running(m)
    m.task_failed(SINK0, 0, AppError("E", "lost frames"), True, 0, 1)
    m.deployed(1, 1)
    assert m.blacklist == {"w1"}
    old = AppError("ValueError", "bad record", "task 1.0")
    m.task_failed(SINK1, 1, old, False, 1, 2)
    m.deployed(2, 2)
    [end] = of(EndApp, m.task_failed(SINK1, 2, old, False, 1, 3))
    assert end.error.kind == FailureKind.USER and end.error.step == "processor 1" and m.blacklist == {"w1"}


# -- adoption -------------------------------------------------------------------------------

def test_a_relaunched_appmaster_adopts_the_running_executors_and_deploys_at_once_when_all_are_back():
    m = machine(epoch=4)
    latest = cp.CheckpointMeta(7, 3, 0, 0, 0, tuple(TASKS), False)
    assert m.start(0, restore=latest, adopt=True) == [AskExecutorsToRegister()]
    assert m.executor_registered(0, "w1", [SRC0, SINK0], 1, 0.1) == []
    out = m.executor_registered(1, "w2", [SRC1, SINK1], 1, 0.2)
    assert of(Deploy, out) == [Deploy(4, latest, ((0, (SRC0, SINK0)), (1, (SRC1, SINK1))))]
    assert of(StoreEpoch, out) == [StoreEpoch(4, 0)]


def test_tasks_nobody_adopted_get_a_new_executor_when_the_window_passes():
    m = machine(epoch=1)
    m.start(0, adopt=True)
    m.executor_registered(0, "w1", [SRC0, SINK0], 1, 0.1)
    assert not of(RequestSlot, m.tick(1.9))
    assert of(RequestSlot, m.tick(2.0)) == [RequestSlot(1, ())]
    deploy = rolled_back_to(m, 1, "w2", 2)
    assert deploy.assignments == ((0, (SRC0, SINK0)), (1, (SRC1, SINK1)))


# -- the end ----------------------------------------------------------------------------------

def test_the_app_succeeds_when_every_task_finished_in_the_current_epoch():
    m = machine()
    running(m)
    for task in TASKS[:-1]:
        assert m.task_finished(task, 0) == []
    assert m.task_finished(SINK1, 5) == []  # another epoch's
    assert of(EndApp, m.task_finished(SINK1, 0)) == [EndApp(AppState.SUCCEEDED)]
    m.validate()


def test_the_final_checkpoint_is_announced_again_every_second_until_every_task_finished():
    """CheckpointComplete is core NATS: a lost one would leave a sink uncommitted."""
    m = machine()
    running(m)
    out = [i for task in TASKS for i in m.task_ended(task, 0, 1)]
    [trigger] = of(cp.TriggerCheckpoint, out)  # the final one, at once
    for task in TASKS:
        m.checkpoint_acked(trigger.checkpoint_id, 0, task, 10, True, 1)
    [notify] = of(cp.NotifyComplete, m.checkpoint_stored(trigger.checkpoint_id, 1))
    assert notify.final
    assert not of(RepeatFinalComplete, m.tick(1.5)) and not of(RepeatFinalComplete, m.tick(2.4))
    assert of(RepeatFinalComplete, m.tick(2.5)) == [RepeatFinalComplete(trigger.checkpoint_id, 0)]
    assert not of(RepeatFinalComplete, m.tick(3))
    for task in TASKS[:-1]:
        m.task_finished(task, 0)
    assert of(RepeatFinalComplete, m.tick(3.6)) == [RepeatFinalComplete(trigger.checkpoint_id, 0)]
    assert of(EndApp, m.task_finished(SINK1, 0)) == [EndApp(AppState.SUCCEEDED)]
    assert m.tick(9) == []
    m.validate()


def test_the_outcome_is_reported_again_through_a_fail_over_then_the_processes_stop():
    m = machine()
    running(m)
    error = AppError("ValueError", "bad record", "loading the application")
    assert of(ReportState, m.fail(error)) == [ReportState(AppState.FAILED, error)]
    # no master answers (one is being elected): again, for REPORT_RETRY_S from the first miss
    assert m.state_reported(AppState.FAILED, 10, "timed out", retryable=True) == [ReportState(AppState.FAILED, error)]
    assert m.state_reported(AppState.FAILED, 39, "timed out", retryable=True) == [ReportState(AppState.FAILED, error)]
    out = m.state_reported(AppState.FAILED, 40, "timed out", retryable=True)
    assert of(Shutdown, out) == [Shutdown("app failed")] and "state_report_failed" in [i.event for i in out
                                                                                        if hasattr(i, "event")]
    m.validate()


def test_an_answered_report_of_the_outcome_stops_the_processes_and_one_refused_is_not_repeated():
    m = machine()
    running(m)
    assert m.state_reported(AppState.ACTIVE, 1) == []  # the app goes on
    for task in TASKS[:-1]:
        m.task_finished(task, 0)
    assert of(ReportState, m.task_finished(SINK1, 0)) == [ReportState(AppState.SUCCEEDED)]
    assert m.state_reported(AppState.SUCCEEDED, 2) == [Shutdown("app ended")]
    other = machine()
    running(other)
    other.fail(AppError("E", "boom", "here"))
    out = other.state_reported(AppState.FAILED, 3, "unknown app id 1", retryable=False)
    assert of(ReportState, out) == [] and of(Shutdown, out) == [Shutdown("app failed")]


def test_a_savepoint_with_stop_answers_with_its_checkpoint_then_terminates_the_app():
    m = machine()
    running(m)
    with pytest.raises(Refused):
        machine().savepoint_requested(1, False, 0)
    out = m.savepoint_requested(41, True, 1)
    [trigger] = of(cp.TriggerCheckpoint, out)
    acks = []
    for task in TASKS:
        acks += m.checkpoint_acked(trigger.checkpoint_id, 0, task, 5, False, 1)
    [store] = of(cp.StoreCheckpoint, acks)
    [answer] = of(AnswerSavepoint, m.checkpoint_stored(store.meta.checkpoint_id, 1))
    assert answer.request_id == 41 and answer.meta.checkpoint_id == trigger.checkpoint_id
    assert m.savepoint_written(41) == [EndApp(AppState.TERMINATED), ReportState(AppState.TERMINATED)]


def test_a_savepoint_whose_checkpoint_fails_is_answered_with_the_reason_naming_the_task():
    m = machine()
    m.names = {0: "source", 1: "sink"}
    running(m)
    [trigger] = of(cp.TriggerCheckpoint, m.savepoint_requested(1, False, 1))
    [answer] = of(AnswerSavepoint, m.checkpoint_declined(trigger.checkpoint_id, 0, SRC0, "too big", 1))
    assert answer.meta is None and answer.error.endswith("failed: declined by source[0]: too big")


# -- any ordering ----------------------------------------------------------------------------

EXECUTORS = st.integers(0, 4)
events = st.one_of(
    st.tuples(st.just("allocated"), st.lists(st.sampled_from(["w1", "w2", "w3"]), min_size=1, max_size=3)),
    st.tuples(st.just("registered"), EXECUTORS),
    st.tuples(st.just("heartbeat"), EXECUTORS),
    st.tuples(st.just("stopped"), EXECUTORS, st.booleans()),
    st.tuples(st.just("worker_lost"), st.sampled_from(["w1", "w2", "w3"])),
    st.tuples(st.just("slot"), EXECUTORS, st.sampled_from(["w1", "w2", "w3"])),
    st.tuples(st.just("launch_failed"), EXECUTORS),
    st.tuples(st.just("deployed"), st.integers(0, 3)),
    st.tuples(st.just("deploy_failed"), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("finished"), st.sampled_from(TASKS), st.integers(0, 3)),
    st.tuples(st.just("failed"), st.sampled_from(TASKS), st.integers(0, 3), st.booleans(),
              st.sampled_from(["", FailureKind.USER, FailureKind.FAULT]), st.sampled_from(["x", "y"])),
    st.tuples(st.just("tick"), st.floats(0, 3)),
    st.tuples(st.just("rescale"), st.integers(0, 2), st.integers(0, 5)),
    st.tuples(st.just("checkpointed"), st.booleans(), st.booleans()),
    st.tuples(st.just("replace"), st.integers(0, 2), st.sampled_from([0, 50]), st.booleans()),
    st.tuples(st.just("watermarks"), st.integers(0, 100)),
)


@settings(max_examples=300, deadline=None)
@given(st.booleans(), st.lists(events, max_size=50))
def test_any_ordering_keeps_the_invariants(adopt, sequence):
    """The invariants hold after every event; the app ends at most once; every
    deployment hosts every task exactly once on registered executors; epochs only grow."""
    m, now = machine(max_restarts=6), 0.0
    m.start(now, adopt=adopt)
    ends, epoch = 0, m.epoch
    for kind, *args in sequence:
        try:
            if kind == "allocated":
                out = m.slots_allocated(args[0], now)
            elif kind == "registered":
                executor = m.executors.get(args[0])
                hosted = [TASKS[args[0] % 4]] if adopt and executor is None else []
                out = m.executor_registered(args[0], executor.worker_id if executor else "w1", hosted, 1, now)
            elif kind == "heartbeat":
                m.executor_heartbeat(args[0], now)
                out = []
            elif kind == "stopped":
                out = m.executor_stopped(args[0], "w1", "exited with code 1", args[1], now)
            elif kind == "worker_lost":
                out = m.worker_lost(args[0], now)
            elif kind == "slot":
                out = m.slot_allocated(args[0], args[1], now)
            elif kind == "launch_failed":
                out = m.executor_launch_failed(args[0], "refused", now)
            elif kind == "deployed":
                out = m.deployed(args[0], now)
            elif kind == "deploy_failed":
                out = m.deploy_failed(args[0], "refused", now, refused=args[1])
            elif kind == "finished":
                out = m.task_finished(*args)
            elif kind == "failed":
                blacklist = set(m.blacklist)
                out = m.task_failed(args[0], args[1], AppError("E", args[4], kind=args[3]), args[2], 0, now)
                if args[3] == FailureKind.USER or not args[3] and not args[2]:
                    assert m.blacklist == blacklist, "a user error blacklisted a worker"
            elif kind == "rescale":
                out = m.rescale_requested(len(sequence), {args[0]: args[1]}, now)
            elif kind == "replace":
                out = m.replace_requested(len(sequence) + 1, args[0], 2, (), now, args[1], args[2])
            elif kind == "watermarks":
                out = m.input_watermarks({task: args[0] for task in m.tasks}, now)
            elif kind == "checkpointed":  # every task acks the checkpoint in flight (and it is stored), or one declines
                out = []
                in_flight = m.coordinator.in_flight
                if in_flight is not None and m.coordinator.phase is cp.Phase.IN_FLIGHT:
                    for task in (m.tasks if args[0] else m.tasks[:1]):
                        out += (m.checkpoint_acked(in_flight, m.epoch, task, 10, False, now, records_in=int(args[1]))
                                if args[0] else
                                m.checkpoint_declined(in_flight, m.epoch, task, "no", now))
                if m.coordinator.phase is cp.Phase.STORING:
                    out += m.checkpoint_stored(m.coordinator.in_flight, now)
            else:
                now += args[0]
                out = m.tick(now)
        except Refused:
            out = []
        m.validate()
        assert m.epoch >= epoch
        epoch = m.epoch
        ends += len(of(EndApp, out))
        assert ends <= 1, "the app ended twice"
        for deploy in of(Deploy, out):
            assert deploy.epoch == m.epoch
            hosted = sorted(t for _, tasks in deploy.assignments for t in tasks)
            assert hosted == sorted(m.tasks)
            assert sorted((p, i) for p, n in {0: 2, 1: 2, **dict(deploy.parallelism)}.items() for i in range(n)) \
                == hosted
            assert all(m.executors[e].registered and not m.executors[e].lost for e, _ in deploy.assignments)


def test_the_stimulus_log_tells_each_event_with_an_id_its_arguments_and_what_it_decided():
    m = machine()
    running(m)
    complete_checkpoint(m, 1)
    m.executor_heartbeat(0, 1.5)
    m.tick(1.6)  # nothing due
    m.executor_stopped(1, "w2", "exited with code -9", True, 2)
    log = list(m.stimuli.entries)
    assert [s.stimulus_id for s in log] == list(range(1, len(log) + 1))
    events = [s.event for s in log]
    assert "executor_heartbeat" not in events and events.count("tick") == 1  # the one that triggered
    assert events.count("checkpoint_acked") == 1  # the last, which decided the store
    lost = log[-1]
    assert lost.event == "executor_stopped" and lost.at == 2
    assert "executor_id=1" in lost.detail and "exited with code -9" in lost.detail and "now" not in lost.detail
    assert {"Fence", "StoreEpoch", "RequestSlot"} <= set(lost.decided)
    m.task_failed(SRC0, 1, AppError("ValueError", "bad record " + "x" * 200, "step"), False, 0, 3)
    assert "error='ValueError: bad record" in m.stimuli.entries[-1].detail
    assert len(m.stimuli.entries[-1].detail) < 300


# -- rescale ----------------------------------------------------------------------------------

def checkpoint_all(m: AppMasterState, now: float) -> list:
    """Every task acks the checkpoint in flight; it is stored."""
    checkpoint_id, out = m.coordinator.in_flight, []
    for task in m.tasks:
        out += m.checkpoint_acked(checkpoint_id, m.epoch, task, 10, False, now)
    return out + m.checkpoint_stored(checkpoint_id, now)


@pytest.mark.parametrize("placement", ["by_index", "round_robin"])
def test_a_rescaled_task_goes_where_the_old_task_owning_most_of_its_key_groups_ran_within_its_share(placement):
    m = machine(placement=placement)
    running(m)
    hosted = {task: e.executor_id for e in m.executors.values() for task in e.tasks}
    m.rescale_requested(5, {1: 3}, 1)
    [deploy] = of(Deploy, checkpoint_all(m, 2))
    placed = {task: executor for executor, tasks in deploy.assignments for task in tasks}
    # groups 0-42 were old task 0's; 43-85 mostly old task 1's (64-85); 86-127 old task 1's
    assert [placed[(1, i)] for i in range(3)] == [hosted[(1, 0)], hosted[(1, 1)], hosted[(1, 1)]]
    m.deployed(deploy.epoch, 2)
    m.rescale_requested(6, {1: 1}, 2)
    out = checkpoint_all(m, 3)
    [deploy] = of(Deploy, out)
    assert {task: executor for executor, tasks in deploy.assignments for task in tasks}[(1, 0)] == hosted[(1, 0)]
    m.validate()


def test_a_rescale_checkpoints_then_goes_on_from_that_checkpoint_in_a_new_epoch_with_the_new_tasks():
    m = machine()
    running(m)
    out = m.rescale_requested(5, {1: 4}, 1)
    [trigger] = of(cp.TriggerCheckpoint, out)  # at once
    out = checkpoint_all(m, 2)
    [notify] = of(cp.NotifyComplete, out)
    [deploy] = of(Deploy, out)
    assert notify.checkpoint_id == trigger.checkpoint_id == deploy.restore.checkpoint_id and deploy.epoch == 1
    # the new tasks divide the old ones' snapshots, taken by 2 tasks, as they restore
    assert deploy.parallelism == ((1, 4),) and deploy.restore_parallelism == ((1, 2),)
    # each new task where the old task owning most of its key groups ran (its local copies are there)
    assert deploy.assignments == ((0, (SRC0, SINK0, (1, 1))), (1, (SRC1, (1, 2), (1, 3))))
    assert of(StoreEpoch, out) == [StoreEpoch(1, 0, ((1, 4),))] and m.restarts == 0  # not a failure
    assert m.phase is Phase.DEPLOYING and not of(AnswerRescale, out)
    m.validate()
    assert of(AnswerRescale, m.deployed(1, 3)) == [AnswerRescale(5)]
    [trigger] = of(cp.TriggerCheckpoint, m.tick(4))
    assert not of(cp.StoreCheckpoint, [i for t in m.tasks[:-1] for i in
                                       m.checkpoint_acked(trigger.checkpoint_id, 1, t, 10, False, 4)])
    assert of(cp.StoreCheckpoint, m.checkpoint_acked(trigger.checkpoint_id, 1, m.tasks[-1], 10, False, 4))
    m.checkpoint_stored(trigger.checkpoint_id, 4)
    # a later rollback restores a checkpoint taken at the new parallelism as it is
    [again] = of(Deploy, m.executor_stopped(1, "w2", "exited with code 1", False, 5) +
                 m.slot_allocated(2, "w3", 5) + m.executor_registered(2, "w3", [], 9, 5))
    assert again.restore.checkpoint_id == trigger.checkpoint_id and again.restore_parallelism == ()
    assert again.parallelism == ((1, 4),)
    assert sorted(t for _, tasks in again.assignments for t in tasks) == sorted(m.tasks)
    m.validate()


def test_a_rescale_asked_while_a_checkpoint_is_in_flight_parks_the_tasks_at_the_next_one():
    """The barriers of the one in flight may have passed without asking the tasks to park:
    the next one, triggered as soon as it completes, parks them; the processors not
    rescaled go on in place from it."""
    m = machine()
    running(m)
    [trigger] = of(cp.TriggerCheckpoint, m.tick(5))  # a periodic one
    assert not trigger.park
    assert not of(cp.TriggerCheckpoint, m.rescale_requested(5, {1: 4}, 5.1))
    out = checkpoint_all(m, 5.5)
    m.validate()
    assert not of(Deploy, out)
    [parking] = of(cp.TriggerCheckpoint, out)
    assert parking.park and parking.checkpoint_id == trigger.checkpoint_id + 1
    [deploy] = of(Deploy, checkpoint_all(m, 6))
    m.validate()
    assert deploy.restore.checkpoint_id == parking.checkpoint_id and deploy.parallelism == ((1, 4),)
    assert deploy.kept == tuple(t for t in m.tasks if t[0] != 1) and deploy.kept


def test_two_rescales_in_a_row_each_keep_the_other_processors_running():
    m = machine()
    running(m)
    for request_id, (parallelism, now) in enumerate((({1: 4}, 1), ({1: 1}, 3)), start=1):
        [parking] = of(cp.TriggerCheckpoint, m.rescale_requested(request_id, parallelism, now))
        m.validate()
        assert parking.park
        [deploy] = of(Deploy, checkpoint_all(m, now + 0.5))
        m.validate()
        assert deploy.kept == tuple(t for t in m.tasks if t[0] != 1)
        assert of(AnswerRescale, m.deployed(m.epoch, now + 1)) == [AnswerRescale(request_id)]
        m.validate()
    assert m.parallelism[1] == 1 and m.epoch == 2


def test_a_parking_checkpoint_failing_once_too_often_ends_the_app_without_a_rollback():
    coordinator = cp.CheckpointCoordinator(TASKS, [SRC0, SRC1], interval_s=1, timeout_s=5, keep=2,
                                           max_consecutive_failures=0)
    m = AppMasterState(TASKS, coordinator, Settings())
    running(m)
    [parking] = of(cp.TriggerCheckpoint, m.rescale_requested(5, {1: 4}, 1))
    out = m.checkpoint_declined(parking.checkpoint_id, m.epoch, m.tasks[0], "disk full", 2)
    m.validate()
    assert not of(Deploy, out) and m.phase is Phase.ENDING and m.restarts == 0
    assert m.outcome.state == AppState.FAILED and "disk full" in m.outcome.error.message


def test_a_failed_parking_checkpoint_rolls_the_app_back_and_answers_the_rescale():
    """The tasks parked at it: nothing would move them on but a new epoch."""
    m = machine()
    running(m)
    epoch = m.epoch
    [parking] = of(cp.TriggerCheckpoint, m.rescale_requested(5, {1: 4}, 1))
    assert parking.park
    out = m.checkpoint_declined(parking.checkpoint_id, m.epoch, m.tasks[0], "disk full", 2)
    m.validate()
    [answer] = of(AnswerRescale, out)
    assert "not done" in answer.error and "disk full" in answer.error
    [deploy] = of(Deploy, out)  # every executor lives: the rollback deploys at once, every task restarted
    assert m.phase is Phase.DEPLOYING and deploy.epoch == m.epoch == epoch + 1 and not deploy.kept
    assert m.parallelism[1] != 4 and m.restarts == 1


def rescaling(request_id: int, parallelism: dict[int, int]) -> tuple[AppMasterState, Deploy]:
    """A running app asked for a rescale at 1, whose checkpoint completed at 2: the
    deployment of its new tasks."""
    m = machine()
    running(m)
    m.rescale_requested(request_id, parallelism, 1)
    [deploy] = of(Deploy, checkpoint_all(m, 2))
    m.validate()
    return m, deploy


def test_a_rollback_while_the_rescale_deploys_keeps_the_new_parallelism_and_restores_by_the_old():
    m, deploy = rescaling(5, {1: 1})
    assert deploy.parallelism == ((1, 1),) and m.tasks == (SRC0, SRC1, SINK0)
    out = m.deploy_failed(1, "executor 0 lost", 3)
    assert not of(AnswerRescale, out) and m.phase is Phase.DEPLOYING  # every executor still live: at once
    [again] = of(Deploy, out)
    assert again.epoch == 2 and again.restore_parallelism == ((1, 2),) and again.parallelism == ((1, 1),)
    assert of(AnswerRescale, m.deployed(2, 4)) == [AnswerRescale(5)]
    m.validate()


def test_a_rescale_whose_tasks_an_executor_refuses_is_undone_and_the_app_goes_on_as_it_was():
    m, deploy = rescaling(5, {1: 4})
    out = m.deploy_failed(1, "task 1.0 cannot restore its share of checkpoint 1: records in flight", 3, refused=True)
    assert of(AnswerRescale, out) == [AnswerRescale(5, "rescale to processor 1: 4 undone, back to processor 1: 2: "
                                                       "deploying epoch 1 failed: task 1.0 cannot restore its share "
                                                       "of checkpoint 1: records in flight")]
    [again] = of(Deploy, out)
    assert again.epoch == 2 and again.parallelism == () and again.restore_parallelism == ()
    assert again.restore.checkpoint_id == deploy.restore.checkpoint_id
    assert m.tasks == tuple(TASKS) and m.parallelism == {0: 2, 1: 2}
    assert sorted(t for _, tasks in again.assignments for t in tasks) == sorted(TASKS)
    m.validate()
    assert not of(AnswerRescale, m.deployed(2, 4)) and m.phase is Phase.RUNNING
    m.rescale_requested(6, {1: 3}, 5)  # one may be asked again
    m.validate()


def test_a_rescale_is_refused_with_the_reason_and_the_app_untouched():
    m = machine()
    with pytest.raises(Refused, match="rescale it once it runs"):
        m.rescale_requested(1, {1: 4}, 0)
    running(m)
    for asked, reason in (({1: 0}, "parallelism 0 is not between 1 and 128"),
                          ({1: 129}, "parallelism 129 is not between 1 and 128"),
                          ({7: 2}, "processor 7: no such processor"), ({1: 2}, "nothing to change")):
        with pytest.raises(Refused, match=reason) as refused:
            m.rescale_requested(1, asked, 1)
        assert refused.value.code == "bad_request"
    m.rescale_requested(1, {1: 3}, 1)
    with pytest.raises(Refused, match="another change is in flight") as refused:
        m.rescale_requested(2, {0: 1}, 1)
    assert refused.value.code == "conflict"
    assert m.tasks == tuple(TASKS) and m.epoch == 0
    m.validate()


def test_a_rescale_whose_checkpoint_fails_or_that_a_failure_overtakes_is_answered_and_not_done():
    m = machine()
    running(m)
    m.rescale_requested(1, {1: 3}, 1)
    out = m.checkpoint_declined(m.coordinator.in_flight, 0, SRC0, "state cannot be serialised", 2)
    [answer] = of(AnswerRescale, out)
    assert "not done: its checkpoint 1 failed" in answer.error and m.tasks == tuple(TASKS)
    assert of(Deploy, out) and m.phase is Phase.DEPLOYING  # the tasks parked at it: the app rolls back
    m.deployed(m.epoch, 3)
    for executor in m.live_executors():
        m.executor_heartbeat(executor.executor_id, 3.4)
    assert of(cp.TriggerCheckpoint, m.tick(3.5))  # checkpoints go on
    m.validate()
    checkpoint_all(m, 3.6)
    m.rescale_requested(3, {1: 3}, 4.7)  # its checkpoint in flight...
    out = m.executor_stopped(0, "w1", "exited with code 1", False, 4.9)
    [answer] = of(AnswerRescale, out)
    assert answer.request_id == 3 and "the app rolled back" in answer.error
    assert m.parallelism == {0: 2, 1: 2}
    m.validate()


def test_the_app_ending_while_a_rescale_deploys_answers_it():
    m, _ = rescaling(1, {1: 3})
    out = m.fail(AppError("ValueError", "bad", "step"))
    assert of(AnswerRescale, out) == [AnswerRescale(1, "the app ended (FAILED)")]
    m.validate()


def test_a_rescale_whose_checkpoint_is_the_final_one_is_not_done():
    m = machine()
    running(m)
    m.rescale_requested(1, {1: 3}, 1)
    for task in TASKS:  # every task ends while its checkpoint is in flight: that one is final
        m.task_ended(task, 0, 1)
    in_flight = m.coordinator.in_flight
    out = []
    for task in TASKS:
        out += m.checkpoint_acked(in_flight, 0, task, 10, True, 2)
    out += m.checkpoint_stored(in_flight, 2)
    assert of(AnswerRescale, out) == [AnswerRescale(1, "rescale to processor 1: 3 not done: the app's tasks have "
                                                       "ended")]
    assert not of(Deploy, out) and m.parallelism == {0: 2, 1: 2}
    m.validate()


def test_a_savepoint_asked_during_the_rescales_checkpoint_is_taken_once_the_rescaled_tasks_run():
    """The tasks are parked at the rescale's checkpoint: nothing is triggered before the
    new epoch runs, and the savepoint's checkpoint is the first after it."""
    m = machine()
    running(m)
    m.rescale_requested(1, {1: 3}, 1)
    m.savepoint_requested(7, False, 1.5)
    out = checkpoint_all(m, 2)
    [deploy] = of(Deploy, out)
    assert deploy.restore.checkpoint_id == 1 and not of(cp.TriggerCheckpoint, out)
    assert not of(cp.TriggerCheckpoint, m.tick(2.1))
    out = m.deployed(m.epoch, 2.2) + m.tick(2.3)
    assert of(AnswerRescale, out) == [AnswerRescale(1)]
    [trigger] = of(cp.TriggerCheckpoint, out)
    assert trigger.checkpoint_id == 2 and not trigger.park
    [answer] = of(AnswerSavepoint, checkpoint_all(m, 2.5))
    assert answer.request_id == 7 and answer.meta.checkpoint_id == 2
    m.validate()


def test_a_relaunched_appmaster_adopts_only_the_tasks_of_its_plan_once():
    """Cut short by an AppMaster's death, a rescale leaves executors with the tasks of the
    plan before it: those it no longer runs, or that another executor reports, are orphans
    no executor keeps; the deployment places the plan's tasks."""
    coordinator = cp.CheckpointCoordinator([SRC0, SRC1, SINK0], [SRC0, SRC1], interval_s=1, timeout_s=5, keep=2,
                                           max_consecutive_failures=3, epoch=2)
    m = AppMasterState([SRC0, SRC1, SINK0], coordinator, Settings(), 2, 0, planned={0: 2, 1: 2})
    m.start(0, adopt=True)
    m.executor_registered(0, "w1", [SRC0, SINK0], 1, 0.1)
    [deploy] = of(Deploy, m.executor_registered(1, "w2", [SRC1, SINK1, SINK0], 2, 0.2))
    assert deploy.assignments == ((0, (SRC0, SINK0)), (1, (SRC1,)))
    assert deploy.parallelism == ((1, 1),)
    m.validate()


# -- replace ----------------------------------------------------------------------------------

def replacing(m: AppMasterState, now: float, at_ms: int = 0, same_state: bool = True, dropped=()) -> Deploy:
    """A replacement of processor 1 asked and its checkpoint completed: the deployment."""
    assert of(cp.TriggerCheckpoint, m.replace_requested(7, 1, 2, dropped, now, at_ms, same_state))
    [deploy] = of(Deploy, checkpoint_all(m, now))
    m.validate()
    return deploy


def trial_checkpoint(m: AppMasterState, now: float, records_in: int) -> list:
    [trigger] = of(cp.TriggerCheckpoint, m.tick(now))
    out = []
    for task in m.tasks:
        out += m.checkpoint_acked(trigger.checkpoint_id, m.epoch, task, 10, False, now, records_in=records_in)
    return out + m.checkpoint_stored(trigger.checkpoint_id, now)


def test_new_code_takes_over_at_a_checkpoint_and_passes_its_trial_once_one_covers_its_records():
    m = machine()
    running(m)
    deploy = replacing(m, 1, dropped=("count",), same_state=False)
    assert deploy.epoch == 1 and deploy.versions == ((1, 2),) and deploy.drop_state == ((1, ("count",)),)
    assert m.restarts == 0 and not of(AnswerReplace, m.deployed(1, 1))
    with pytest.raises(Refused, match="on trial"):
        m.rescale_requested(8, {1: 3}, 1)
    out = trial_checkpoint(m, 3, records_in=5)
    assert of(AnswerReplace, out) == [AnswerReplace(7)] and m.versions == {1: 2}
    m.validate()
    assert of(RequestSlot, m.executor_stopped(1, "w2", "killed", False, 4))
    again = rolled_back_to(m, 2, "w3", 4)
    assert again.versions == ((1, 2),) and again.drop_state == ()  # its own checkpoint: nothing to drop


def test_new_code_failing_on_trial_is_rolled_back_and_other_failures_are_not_its_fault():
    m = machine()
    running(m)
    replacing(m, 1)
    m.deployed(1, 1)
    # an executor lost on trial: a rollback with the new code, still on trial
    assert of(RequestSlot, m.executor_stopped(0, "w1", "killed", False, 2))
    deploy = rolled_back_to(m, 2, "w3", 2)
    assert deploy.versions == ((1, 2),) and m._replace is not None
    m.deployed(deploy.epoch, 2)
    # its own task failing, even with a user error: back to the old code, the app goes on
    out = m.task_failed(SINK0, deploy.epoch, AppError("KeyError", "'user'", "count"), False, 1, 3)
    [answer] = of(AnswerReplace, out)
    assert answer.rolled_back and "version 2 rolled back to version 1" in answer.error and "'user'" in answer.error
    [back] = of(Deploy, out)
    assert back.versions == () and m.phase is Phase.DEPLOYING and not of(EndApp, out)
    m.validate()
    # once the trial is over, a user error is the app's: it ends the app when it repeats after a restore
    m.deployed(back.epoch, 3)
    [again] = of(Deploy, m.task_failed(SRC0, back.epoch, AppError("KeyError", "'user'", "read"), False, 1, 4))
    m.deployed(again.epoch, 4)
    assert of(EndApp, m.task_failed(SRC0, again.epoch, AppError("KeyError", "'user'", "read"), False, 1, 5))


def test_code_keeping_the_same_state_stays_on_trial_until_it_processed_records():
    m = machine()
    running(m)
    replacing(m, 1, same_state=True)
    m.deployed(1, 1)
    assert not of(AnswerReplace, trial_checkpoint(m, 2, records_in=0))  # nothing processed: on trial still
    assert of(AnswerReplace, trial_checkpoint(m, 3, records_in=2)) == [AnswerReplace(7)]
    other = machine()
    running(other)
    replacing(other, 1, same_state=False)  # other state: the old code cannot restore what it stores
    other.deployed(1, 1)
    assert of(AnswerReplace, trial_checkpoint(other, 2, records_in=0)) == [AnswerReplace(7)]


def test_with_an_event_time_the_old_code_holds_records_until_the_watermark_passes_it():
    m = machine()
    running(m)
    m.input_watermarks({SINK0: 10, SINK1: 12}, 0)
    with pytest.raises(Refused, match="behind the watermark"):
        m.replace_requested(6, 1, 2, (), 0, 12)
    with pytest.raises(Refused, match="is a source"):
        m.replace_requested(6, 0, 2, (), 0, 100)
    m.input_watermarks({}, 0, {SINK1: 120})  # a record ahead of the watermark was processed
    with pytest.raises(Refused, match="processed a record of event time 120 already"):
        m.replace_requested(6, 1, 2, (), 0, 100)
    m.validate()
    hold = replacing(m, 1, at_ms=200)
    assert hold.hold_from == ((1, 200),) and hold.versions == () and m.epoch == 1
    m.deployed(1, 1)
    with pytest.raises(Refused, match="waiting for its watermark to pass 200"):
        m.replace_requested(8, 1, 3, (), 1, 0)
    with pytest.raises(Refused, match="hold records"):
        m.savepoint_requested(9, False, 1)
    assert m.input_watermarks({SINK0: 250, SINK1: 199}, 2) == []
    out = m.input_watermarks({SINK1: 200}, 2)
    [trigger] = of(cp.TriggerCheckpoint, out)
    assert trigger.park
    [switch] = of(Deploy, checkpoint_all(m, 6))
    assert switch.hold_from == () and switch.versions == ((1, 2),) and switch.epoch == 2
    assert switch.kept == tuple(t for t in m.tasks if t[0] != 1)  # the others go on in place
    m.validate()


def test_a_replacement_whose_parking_checkpoint_fails_is_not_taken_over_and_the_app_rolls_back():
    """The tasks parked at it: the app rolls back to its latest checkpoint, records held
    for the new code go to the old code (they are processed as the tasks restore)."""
    m = machine()
    running(m)
    replacing(m, 1, at_ms=200)
    m.deployed(1, 1)
    [trigger] = of(cp.TriggerCheckpoint, m.input_watermarks({SINK0: 250, SINK1: 201}, 2))
    out = m.checkpoint_declined(trigger.checkpoint_id, 1, SRC0, "no", 2)
    [answer] = of(AnswerReplace, out)
    assert answer.error.startswith(f"version 2 not taken over: its checkpoint {trigger.checkpoint_id} failed")
    [deploy] = of(Deploy, out)
    assert deploy.epoch == 2 and deploy.hold_from == () and deploy.versions == () and not deploy.kept
    m.validate()


def test_the_app_ending_while_records_are_held_answers_the_replacement():
    m = machine()
    running(m)
    replacing(m, 1, at_ms=100)
    out = m.fail(AppError("E", "boom"))
    assert of(AnswerReplace, out) and m._holding() == ()
    m.validate()


def test_new_code_on_trial_stays_on_trial_in_a_relaunched_appmaster():
    m = machine()
    running(m)
    replacing(m, 1)
    [record] = [i for i in m.executor_stopped(0, "w1", "killed", False, 2) if isinstance(i, StoreEpoch)]
    assert record.versions == ((1, 2),) and record.trial == (1, 2, 1, True, 1)
    coordinator = cp.CheckpointCoordinator(TASKS, [SRC0, SRC1], interval_s=1, timeout_s=5, keep=2,
                                           max_consecutive_failures=3, epoch=record.epoch + 1)
    relaunched = AppMasterState(TASKS, coordinator, Settings(), epoch=record.epoch + 1,
                                versions=dict(record.versions), trial=record.trial)
    relaunched.start(3, adopt=True)
    relaunched.executor_registered(0, "w1", [SRC0, SINK0], 1, 3)
    [deploy] = of(Deploy, relaunched.executor_registered(1, "w2", [SRC1, SINK1], 2, 3))
    assert deploy.versions == ((1, 2),)
    relaunched.deployed(deploy.epoch, 3)
    with pytest.raises(Refused, match="on trial"):
        relaunched.rescale_requested(5, {1: 3}, 3)
    out = relaunched.task_failed(SINK1, deploy.epoch, AppError("KeyError", "'user'", "count"), False, 1, 4)
    [answer] = of(AnswerReplace, out)
    assert answer.request_id == 0 and answer.rolled_back and of(Deploy, out)[0].versions == ()
    relaunched.validate()
