"""The shell app's AppMaster machine, without a network: events in, instructions out, its
invariants checked after every event."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gearbus.runtime.shell import (CUT_MARK, MAX_READ_BYTES, Command, LaunchExecutor, Logged, Phase, Refused, ReportState,
                                   RequestSlot, ShellAppState, Shutdown, StopCommand, StoreOutput, WorkerChoiceError,
                                   choose_workers)
from shared.messages import MAX_SHELL_LINE_CHARS, AppState, ErrorCode, ShellLine

OUT, ERR = "stdout", "stderr"


class Checked:
    """A machine whose invariants are checked after every event."""

    def __init__(self, *args, **kwargs):
        self.m = ShellAppState(*args, **kwargs)

    def __getattr__(self, name):
        attr = getattr(self.m, name)
        if not callable(attr):
            return attr

        def event(*args, **kwargs):
            try:
                return attr(*args, **kwargs)
            finally:
                self.m.validate()
        return event


def kinds(instructions, kind):
    return [i for i in instructions if isinstance(i, kind)]


def running(workers=("w0", "w1"), timeout_s=0.0, **kwargs) -> Checked:
    m = Checked(list(workers), timeout_s, **kwargs)
    assert m.start(0.0) == [RequestSlot(i, w) for i, w in enumerate(workers)]
    for i, w in enumerate(workers):
        assert m.slot_granted(i) == [LaunchExecutor(i, w)]
    for i, w in enumerate(workers):
        out = m.executor_registered(i, w, 0.0)
        assert out == ([ReportState(AppState.ACTIVE)] if i == len(workers) - 1 else [])
    return m


def lines(*texts, stream=OUT):
    return [ShellLine(stream, t) for t in texts]


def test_both_commands_exit_zero_the_app_succeeds_and_ends_once_its_state_is_reported():
    m = running()
    assert m.lines(0, 0, lines("a", "b")) == []
    assert m.lines(1, 0, lines("oops", stream=ERR)) == []
    assert m.exited(0, 0, "") == []
    assert m.exited(1, 0, "") == [StoreOutput(), ReportState(AppState.SUCCEEDED, None)]
    assert m.phase is Phase.REPORTING
    assert m.state_reported(AppState.SUCCEEDED) == [Shutdown("the shell app SUCCEEDED")]
    assert m.phase is Phase.ENDED
    [w0, w1] = m.outputs()
    assert (w0.exit_code, [x.text for x in w0.lines], w1.lines) == (0, ["a", "b"], lines("oops", stream=ERR))


def test_a_failing_command_fails_the_app_naming_the_worker_and_its_code():
    m = running()
    m.exited(0, 0, "")
    [_, report] = m.exited(1, 127, "")
    assert report.state == AppState.FAILED
    assert report.error.error_type == "CommandFailed"
    assert "1 of 2" in report.error.message and "w1: exit code 127" in report.error.message
    assert m.state_reported(AppState.FAILED, "no master")[0] == Logged(
        "state_report_failed", "error", (("state", AppState.FAILED), ("error", "no master")))


def test_a_batch_sent_again_is_kept_once_and_lines_keep_their_order():
    m = running(["w0"])
    m.lines(0, 0, lines("1", "2"))
    m.lines(0, 0, lines("1", "2"))  # its answer was lost
    m.lines(0, 1, lines("3"))
    assert [x.text for x in m.outputs()[0].lines] == ["1", "2", "3"]


def test_the_timeout_stops_each_command_that_long_after_it_started():
    m = Checked(["w0", "w1"], 5.0)
    m.start(10.0)
    m.slot_granted(0)
    m.executor_registered(0, "w0", 10.0)
    m.slot_granted(1)
    m.executor_registered(1, "w1", 13.0)  # its slot came later: it gets its 5 s all the same
    assert m.tick(14.9) == []
    out = m.tick(15.0)
    assert kinds(out, StopCommand) == [StopCommand(0, "stopped: it ran past the 5 s timeout")]
    assert m.tick(16.0) == [] and m.workers[1].state is Command.RUNNING
    assert m.exited(0, 143, "stopped: it ran past the 5 s timeout; ended by SIGTERM") == []
    assert kinds(m.tick(18.0), StopCommand) == [StopCommand(1, "stopped: it ran past the 5 s timeout")]
    [_, report] = m.exited(1, 143, "")
    assert report.error.error_type == "TimedOut" and "w1: exit code 143" in report.error.message


def test_a_command_stopped_at_the_deadline_fails_the_app_even_when_it_exits_zero():
    """A command that traps SIGTERM and exits 0 (or ends by itself as the stop comes) ran
    past its timeout all the same; the other worker's real failure names the kind."""
    m = running(timeout_s=5.0)
    assert kinds(m.tick(5.0), StopCommand) == [StopCommand(0, "stopped: it ran past the 5 s timeout"),
                                               StopCommand(1, "stopped: it ran past the 5 s timeout")]
    m.exited(0, 0, "stopped: it ran past the 5 s timeout")
    [_, report] = m.exited(1, 0, "")
    assert report.state == AppState.FAILED and report.error.error_type == "TimedOut"
    assert "2 of 2" in report.error.message
    mixed = running(timeout_s=5.0)
    mixed.exited(1, 1, "")
    mixed.tick(5.0)
    [_, report] = mixed.exited(0, 0, "")
    assert report.error.error_type == "CommandFailed" and "w1: exit code 1" in report.error.message


def test_an_executor_lost_before_its_exit_fails_the_app_and_its_later_end_changes_nothing():
    m = running()
    m.exited(1, 0, "")
    [logged, store, report] = m.executor_stopped(0, "exited with code -9")
    assert isinstance(logged, Logged) and store == StoreOutput()
    assert report.error.error_type == "CommandLost" and "w0: lost" in report.error.message
    assert m.executor_stopped(1, "exited with code 0") == []  # it reported its exit first
    assert m.exited(0, 0, "") == []


def test_a_lost_worker_loses_its_command_and_a_refused_slot_too():
    m = Checked(["w0", "w1"])
    m.start(0.0)
    out = m.slot_refused(1, "no 1 free slot(s) within 60 s")
    assert kinds(out, ReportState) == []
    m.slot_granted(0)
    assert m.executor_registered(0, "w0", 0.0) == [ReportState(AppState.ACTIVE)]  # the other will never start
    [_, _, report] = m.worker_lost("w0")
    assert report.state == AppState.FAILED and "no slot on the worker" in report.error.message


def test_registrations_and_messages_the_app_did_not_ask_for_are_refused():
    m = running(["w0"])
    with pytest.raises(Refused) as unknown:
        m.executor_registered(3, "w0", 0.0)
    assert unknown.value.code == ErrorCode.NOT_FOUND
    with pytest.raises(Refused) as again:
        m.executor_registered(0, "w0", 0.0)
    assert again.value.code == ErrorCode.CONFLICT
    with pytest.raises(Refused, match="not w9"):
        Checked(["w0"]).executor_registered(0, "w9", 0.0)
    with pytest.raises(Refused, match="unknown output stream"):
        m.lines(0, 0, lines("x", stream="stdin"))
    m.exited(0, 0, "")
    with pytest.raises(Refused):
        m.lines(0, 1, lines("late"))


def test_a_kill_keeps_the_output_once_every_command_reported_its_end():
    m = running()
    m.lines(0, 0, lines("partial"))
    assert m.stopping("this AppMaster was stopped") == [] and m.phase is Phase.STOPPING
    assert m.exited(0, 143, "stopped: the app was killed; ended by SIGTERM") == []
    assert m.exited(1, 143, "") == [StoreOutput()]  # no ReportState: the master ended the app
    assert m.phase is Phase.ENDED and m.stopping("again") == [] and m.stop_waited() == [] and m.tick(100.0) == []
    assert [(x.exit_code, [y.text for y in x.lines]) for x in m.outputs()] == [(143, ["partial"]), (143, [])]


def test_a_kill_keeps_what_there_is_when_the_ends_do_not_come_in_time():
    m = running()
    m.stopping("this AppMaster was stopped")
    assert m.stop_waited() == [StoreOutput()]
    assert [x.status for x in m.outputs()] == ["lost", "lost"]
    starting = Checked(["w0"])
    starting.start(0.0)
    assert starting.stopping("killed") == [StoreOutput()] and starting.outputs()[0].detail == "not started: killed"


def test_output_past_the_bound_drops_the_oldest_lines_and_a_reader_is_told_how_many():
    m = running(["w0"], output_bytes=100)  # 16 bytes a line, and its text
    m.lines(0, 0, lines(*(f"line{i}" for i in range(10))))  # 21 bytes each: 4 kept
    [kept] = m.outputs()
    assert (kept.first_line, kept.total_lines, [x.text for x in kept.lines]) == (6, 10, [f"line{i}" for i in range(6, 10)])
    [late] = m.output({}, 10_000)
    assert (late.dropped, late.first_line, late.next_line) == (6, 6, 10)
    [caught_up] = m.output({"w0": 8}, 10_000)
    assert (caught_up.dropped, [x.text for x in caught_up.lines], caught_up.next_line) == (0, ["line8", "line9"], 10)
    [nothing] = m.output({"w0": 10}, 10_000)
    assert (nothing.lines, nothing.next_line) == ([], 10)


def test_a_long_line_is_cut_and_a_read_takes_at_least_one_line_per_worker():
    m = running()
    m.lines(0, 0, lines("x" * (MAX_SHELL_LINE_CHARS + 10)))
    m.lines(1, 0, lines("y", "z"))
    [w0, w1] = m.output({}, 1)
    assert w0.lines[0].text.endswith(CUT_MARK) and len(w0.lines) == 1
    assert [x.text for x in w1.lines] == ["y"] and w1.next_line == 1


def test_a_read_stays_within_its_bound_however_many_workers_and_readers_read_on():
    """Sixty workers with a long line each: one read would be ~1 MB with a line per worker;
    it stops at the bound and the rest come from the next reads."""
    workers = [f"w{i}" for i in range(60)]
    m = running(workers)
    for i in range(60):
        m.lines(i, 0, lines("x" * MAX_SHELL_LINE_CHARS))
    offsets, reads = {}, 0
    while not offsets or any(offsets[w] < 1 for w in workers):
        views = m.output(offsets, 10**9)
        assert sum(len(line.text) for v in views for line in v.lines) <= MAX_READ_BYTES + MAX_SHELL_LINE_CHARS
        offsets.update({v.worker_id: v.next_line for v in views})
        reads += 1
    assert reads == 2


def test_which_workers_a_selection_means():
    alive = ["w2", "w0", "w1"]
    assert choose_workers("all", alive) == ["w0", "w1", "w2"]
    assert choose_workers("2", alive) == ["w0", "w1"]
    assert choose_workers("w2,w0", alive) == ["w2", "w0"]
    with pytest.raises(WorkerChoiceError, match="--workers 5: the cluster has 3 live worker.s.: w0, w1, w2"):
        choose_workers("5", alive)
    with pytest.raises(WorkerChoiceError, match="no live worker w9; the cluster has 3"):
        choose_workers("w0,w9", alive)
    with pytest.raises(WorkerChoiceError, match="more than once"):
        choose_workers("w0,w0", alive)
    for bad in ("0", "w0,,w1", ""):
        with pytest.raises(WorkerChoiceError):
            choose_workers(bad, alive)
    with pytest.raises(WorkerChoiceError, match="has 0 live"):
        choose_workers("all", [])


EVENTS = st.lists(st.tuples(st.sampled_from(["granted", "refused", "registered", "lines", "exited", "stopped",
                                             "lost", "tick", "kill", "waited"]),
                            st.integers(0, 2), st.integers(0, 3)), max_size=40)


@given(EVENTS)
def test_any_order_of_events_keeps_the_invariants_and_ends_once(events):
    m = Checked(["w0", "w1", "w2"], 5.0, output_bytes=200)
    m.start(0.0)
    now, reports = 0.0, []
    for kind, executor_id, n in events:
        now += n
        try:
            out = {"granted": lambda: m.slot_granted(executor_id),
                   "refused": lambda: m.slot_refused(executor_id, "full"),
                   "registered": lambda: m.executor_registered(executor_id, f"w{executor_id}", now),
                   "lines": lambda: m.lines(executor_id, n, lines(*(["l"] * n))),
                   "exited": lambda: m.exited(executor_id, n, ""),
                   "stopped": lambda: m.executor_stopped(executor_id, "exited"),
                   "lost": lambda: m.worker_lost(f"w{executor_id}"),
                   "tick": lambda: m.tick(now),
                   "kill": lambda: m.stopping("killed"),
                   "waited": lambda: m.stop_waited()}[kind]()
        except Refused:
            continue
        reports += [r.state for r in kinds(out, ReportState) if r.state in AppState.TERMINAL]
    assert len(reports) <= 1
    assert bool(reports) == (m.outcome is not None)
