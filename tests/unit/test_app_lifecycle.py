"""The master's app lifecycle machine, without a network: events in, instructions out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.master.lifecycle import (
    AnswerSubmission,
    AppLifecycles,
    FenceAppMaster,
    Fenced,
    LaunchAppMaster,
    Phase,
    SetState,
    StopAppProcesses,
    Timeouts,
)
from shared.messages import AppError, AppState

TIMEOUTS = Timeouts(register_s=60, heartbeat_s=10, reconfirm_s=5)


def machine() -> AppLifecycles:
    return AppLifecycles(TIMEOUTS)


def running(m: AppLifecycles, app_id: int = 1, worker: str = "w1", now: float = 0, allowed: int = 3):
    assert m.submitted(app_id, allowed) == [LaunchAppMaster(app_id, 0)]
    assert m.launched(app_id, 0, worker, now) == []
    assert m.registered(app_id, 0, worker, now) == [AnswerSubmission(app_id)]
    assert m.phase(app_id) is Phase.RUNNING
    m.validate()


# -- submission ------------------------------------------------------------------------------

def test_a_submission_is_answered_once_its_appmaster_registers():
    m = machine()
    running(m)
    assert not m.starting(1)


def test_an_appmaster_that_never_registers_fails_the_submission_with_the_reason():
    m = machine()
    m.submitted(1, 3)
    m.launched(1, 0, "w1", now=0)
    assert m.tick(59) == []
    answer, state, stop, fence = m.tick(60)
    assert answer == AnswerSubmission(1, "app 1 could not start: the AppMaster did not register within 60 s",
                                      "unavailable")
    assert state.state == AppState.FAILED and state.error.error_type == "AppMasterLaunchFailed"
    assert isinstance(stop, StopAppProcesses)
    assert fence == FenceAppMaster(1, "w1", "the AppMaster did not register within 60 s")  # it may only be slow
    assert m.phase(1) is Phase.ENDED
    m.validate()


def test_a_failed_first_launch_fails_the_submission_and_is_not_relaunched():
    m = machine()
    m.submitted(1, 3)
    answer, state, _ = m.launch_failed(1, 0, "no free slot")
    assert answer.code == "unavailable" and "no free slot" in answer.error
    assert state.state == AppState.FAILED


def test_an_appmaster_exiting_before_it_registered_fails_the_submission():
    m = machine()
    m.submitted(1, 3)
    m.launched(1, 0, "w1", now=0)
    answer, state, _ = m.appmaster_exited(1, 0, "w1", "the AppMaster exited with code 2")
    assert "exited with code 2" in answer.error and state.state == AppState.FAILED


def test_a_kill_while_starting_answers_the_submitter_conflict_and_terminates():
    m = machine()
    m.submitted(1, 3)
    answer, state, stop = m.kill(1)
    assert answer == AnswerSubmission(1, "app 1 was killed while starting", "conflict")
    assert state == SetState(1, AppState.TERMINATED, None) and stop == StopAppProcesses(1, "killed by request")
    assert m.launched(1, 0, "w1", 1) == [] and m.phase(1) is Phase.ENDED  # the launch finishing late changes nothing
    with pytest.raises(KeyError):
        m.registered(1, 0, "w1", 1)


def test_registration_before_the_launch_answer_arrives_counts():
    m = machine()
    m.submitted(1, 3)
    assert m.registered(1, 0, "w1", 0) == [AnswerSubmission(1)]
    assert m.launched(1, 0, "w1", 0) == [] and m.phase(1) is Phase.RUNNING


# -- a running app's AppMaster ------------------------------------------------------------------

def test_heartbeats_keep_a_running_appmaster_alive_and_silence_relaunches_it():
    m = machine()
    running(m)
    assert m.heartbeat(1, 0, now=9) and m.tick(18) == []
    fence, launch = m.tick(19)
    assert fence == FenceAppMaster(1, "w1", "the AppMaster sent no heartbeat for 10 s")
    assert launch == LaunchAppMaster(1, 1, avoid="w1")
    assert m.phase(1) is Phase.LAUNCHING and m.attempt(1) == 1
    m.validate()


def test_an_exited_appmaster_is_relaunched_without_fencing_and_the_budget_ends_the_app():
    m = machine()
    running(m, allowed=2)
    for attempt in (1, 2):
        assert m.appmaster_exited(1, attempt - 1, "w1", "exited") == [LaunchAppMaster(1, attempt, "w1")]
        m.launched(1, attempt, "w1", 0)
        m.registered(1, attempt, "w1", 0)
    state, stop = m.appmaster_exited(1, 2, "w1", "exited")
    assert state.state == AppState.FAILED and "gave up after 2 relaunches" in state.error.message
    assert stop == StopAppProcesses(1, "AppMaster lost")


def test_reports_of_a_replaced_attempt_change_nothing_and_its_registration_is_fenced():
    m = machine()
    running(m)
    m.appmaster_exited(1, 0, "w1", "exited")
    m.launched(1, 1, "w2", 0)
    m.registered(1, 1, "w2", 0)
    assert m.appmaster_exited(1, 0, "w1", "the old one exits late") == []
    assert not m.heartbeat(1, 0, 1)  # asked to register again: then refused
    with pytest.raises(Fenced):
        m.registered(1, 0, "w1", 1)
    assert m.phase(1) is Phase.RUNNING and m.attempt(1) == 1


def test_a_lost_worker_relaunches_the_appmasters_it_ran_only():
    m = machine()
    running(m, 1, "w1")
    running(m, 2, "w2")
    assert m.worker_lost("w1", "sent no heartbeat for 10 s") == [LaunchAppMaster(1, 1, "w1")]
    assert m.phase(2) is Phase.RUNNING


def test_a_worker_back_without_the_appmaster_relaunches_it_and_one_with_it_does_not():
    m = machine()
    running(m, 1, "w1")
    assert m.worker_registered("w1", [1]) == []
    assert m.worker_registered("w1", []) == [LaunchAppMaster(1, 1, "w1")]


def test_an_ended_app_leaves_the_machine_alone():
    m = machine()
    running(m)
    m.state_reported(1, AppState.SUCCEEDED)
    assert m.phase(1) is Phase.ENDED
    assert m.tick(1000) == [] and m.worker_lost("w1", "gone") == [] and m.kill(1) == []
    assert m.heartbeat(1, 0, 1000)  # nothing to ask of it


# -- a new leader ---------------------------------------------------------------------------------

def test_a_new_leader_relaunches_the_running_apps_whose_appmaster_does_not_register():
    m = machine()
    m.took_office([(1, AppState.ACTIVE, "w1", 0, 3), (2, AppState.ACTIVE, "w2", 1, 3),
                   (3, AppState.SUCCEEDED, "w1", 0, 3)], now=100)
    assert m.phase(3) is None
    m.registered(2, 1, "w2", 101)
    assert m.tick(104.9) == []
    fence, launch = m.tick(105)
    assert fence.app_id == 1 and "did not register with the new leader within 5 s" in fence.reason
    assert launch == LaunchAppMaster(1, 1, "w1")
    assert m.phase(2) is Phase.RUNNING
    m.validate()


def test_a_new_leader_relaunches_at_once_when_the_appmasters_worker_comes_back_without_it():
    m = machine()
    m.took_office([(1, AppState.ACTIVE, "w1", 2, 3)], now=0)
    assert m.worker_registered("w1", []) == [LaunchAppMaster(1, 3, "w1")]


def test_a_new_leader_tells_an_unconfirmed_appmaster_to_register():
    m = machine()
    m.took_office([(1, AppState.ACTIVE, "w1", 0, 3)], now=0)
    assert not m.heartbeat(1, 0, 1)
    m.registered(1, 0, "w1", 1)
    assert m.heartbeat(1, 0, 2)


def test_a_submission_lost_in_a_fail_over_fails_and_is_not_relaunched():
    m = machine()
    m.took_office([(1, AppState.PENDING, "", 0, 3)], now=0)
    assert m.tick(5) == []  # a PENDING app gets the registration timeout, not the grace
    [state] = m.tick(60)
    assert state.state == AppState.FAILED and state.error.error_type == "SubmissionLost"


def test_a_pending_app_whose_appmaster_registers_with_the_new_leader_runs_on():
    m = machine()
    m.took_office([(1, AppState.PENDING, "w1", 0, 3)], now=0)
    assert m.registered(1, 0, "w1", 1) == []
    assert m.appmaster_exited(1, 0, "w1", "exited") == [LaunchAppMaster(1, 1, "w1")]


# -- any ordering -----------------------------------------------------------------------------------

APPS = (1, 2)
WORKERS = ("w1", "w2")
events = st.one_of(
    st.tuples(st.just("submitted"), st.sampled_from(APPS)),
    st.tuples(st.just("launched"), st.sampled_from(APPS), st.integers(0, 3), st.sampled_from(WORKERS)),
    st.tuples(st.just("launch_failed"), st.sampled_from(APPS), st.integers(0, 3)),
    st.tuples(st.just("registered"), st.sampled_from(APPS), st.integers(0, 3), st.sampled_from(WORKERS)),
    st.tuples(st.just("heartbeat"), st.sampled_from(APPS), st.integers(0, 3)),
    st.tuples(st.just("exited"), st.sampled_from(APPS), st.integers(0, 3), st.sampled_from(WORKERS)),
    st.tuples(st.just("worker_lost"), st.sampled_from(WORKERS)),
    st.tuples(st.just("worker_registered"), st.sampled_from(WORKERS), st.sets(st.sampled_from(APPS))),
    st.tuples(st.just("state"), st.sampled_from(APPS),
              st.sampled_from([AppState.ACTIVE, AppState.SUCCEEDED, AppState.FAILED])),
    st.tuples(st.just("kill"), st.sampled_from(APPS)),
    st.tuples(st.just("tick"), st.floats(0, 30)),
    st.tuples(st.just("took_office"),
              st.lists(st.tuples(st.sampled_from(APPS), st.sampled_from([AppState.PENDING, AppState.ACTIVE]),
                                 st.sampled_from(("",) + WORKERS), st.integers(0, 2)), unique_by=lambda a: a[0])),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(events, max_size=40))
def test_any_ordering_keeps_the_invariants(sequence):
    """Whatever arrives in whatever order: the invariants hold after every step; an app
    ends at most once; every launch has a new attempt number within the budget; a
    submitter is answered at most once, and only while it waited."""
    m, now = machine(), 0.0
    ended: set[int] = set()
    answered: set[int] = set()
    last_attempt: dict[int, int] = {}
    for event in sequence:
        kind, args = event[0], event[1:]
        if kind == "submitted":
            if m.phase(args[0]) is not None:
                continue  # app ids are never reused
            out = m.submitted(args[0], 2)
            ended.discard(args[0])
            answered.discard(args[0])
            last_attempt.pop(args[0], None)
        elif kind == "launched":
            out = m.launched(*args, now)
        elif kind == "launch_failed":
            out = m.launch_failed(*args, "refused")
        elif kind == "registered":
            try:
                out = m.registered(args[0], args[1], args[2], now)
            except (Fenced, KeyError):
                out = []
        elif kind == "heartbeat":
            m.heartbeat(*args, now)
            out = []
        elif kind == "exited":
            out = m.appmaster_exited(*args, "exited")
        elif kind == "worker_lost":
            out = m.worker_lost(args[0], "silent")
        elif kind == "worker_registered":
            out = m.worker_registered(*args)
        elif kind == "state":
            out = m.state_reported(*args)
            if args[1] in AppState.TERMINAL:
                ended.add(args[0])
        elif kind == "kill":
            out = m.kill(args[0])
        elif kind == "tick":
            now += args[0]
            out = m.tick(now)
        else:
            out = m.took_office([(a, s, w, n, 2) for a, s, w, n in args[0]], now)
            ended = {a for a in ended if m.phase(a) is None}
            answered.clear()
            last_attempt = {a: n for a, _, _, n in args[0]}
        m.validate()
        for instruction in out:
            if isinstance(instruction, SetState):
                assert instruction.app_id not in ended, "an app ended twice"
                ended.add(instruction.app_id)
                assert m.phase(instruction.app_id) is Phase.ENDED
            elif isinstance(instruction, AnswerSubmission):
                assert instruction.app_id not in answered, "a submitter answered twice"
                answered.add(instruction.app_id)
            elif isinstance(instruction, LaunchAppMaster):
                assert instruction.attempt == m.attempt(instruction.app_id) <= 2
                assert instruction.attempt > last_attempt.get(instruction.app_id, -1)
                last_attempt[instruction.app_id] = instruction.attempt


def test_the_master_ends_a_running_app_with_a_state_of_its_choosing():
    m = machine()
    running(m)
    error = AppError("ValueError", "stage 0 (app 2) failed: boom", "stage 0")
    assert m.end(1, AppState.FAILED, error, "stage 0 failed") == [
        SetState(1, AppState.FAILED, error), StopAppProcesses(1, "stage 0 failed")]
    assert m.end(1, AppState.SUCCEEDED, None, "again") == []
    m.validate()
