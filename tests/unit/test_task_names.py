"""Wherever a user reads about a task, it is named by its processor and index (``count[1]``),
not by ids (``task 3.1``), and a failure says whose it was; ids stay in --json."""

from __future__ import annotations

import pytest

from gearbus.cli import _task_executor, error_text, format_status, status_json
from shared.bus import RequestError
from shared.messages import AppDag, AppError, AppSummary, FailureKind, ProcessorInfo, TaskCounters, TaskId

pytestmark = pytest.mark.unit


def summary(**kw) -> AppSummary:
    dag = AppDag([ProcessorInfo(0, "read", 1), ProcessorInfo(3, "count", 2)])
    tasks = [TaskCounters(TaskId(0, 0), records_out=5, executor_id=0),
             TaskCounters(TaskId(3, 1), records_in=5, executor_id=1)]
    return AppSummary(7, "counts", "FAILED", 1, dag=dag, tasks=tasks, **kw)


def test_status_names_each_task_and_says_whose_the_failure_was():
    error = AppError("ValueError", "no count for 'x' (step 'count' on record 'x')", "task count[1] of processor "
                     "'count'", "Traceback ...", FailureKind.USER, "count", "'x'", "counts.py:12")
    lines = format_status(summary(error=error, restarts=1)).splitlines()
    assert "  read[0]: in 0 out 5" in lines and "  count[1]: in 5 out 0" in lines
    assert not any("task 3.1" in line for line in lines)
    assert "    user error (the app's code or input: fix it, then submit again): step count, at counts.py:12, " \
           "on record 'x'" in lines
    assert error_text(summary(error=error)).endswith("[user error (the app's code or input: fix it, then submit "
                                                     "again): step count, at counts.py:12, on record 'x']")
    fault = AppError("RestartBudgetExhausted", "count[1] failed: ...; gave up after 10 restarts", "count[1]",
                     kind=FailureKind.FAULT, step="count")
    assert "    fault (a process died, hung or lost its connection): step count" in \
        format_status(summary(error=fault)).splitlines()
    assert "[" not in error_text(summary(error=AppError("ConfigError", "bad", "planning tasks")))


def test_json_keeps_the_ids_and_adds_the_names():
    shown = status_json(summary())
    assert [(t["task"], t["name"]) for t in shown["tasks"]] == [({"processor": 0, "index": 0}, "read[0]"),
                                                                ({"processor": 3, "index": 1}, "count[1]")]


def test_a_task_is_found_by_its_name_as_status_shows_it_or_by_ids():
    app = summary()
    assert _task_executor(app, "count[1]") == _task_executor(app, "3.1") == _task_executor(app, "count.1") == 1
    with pytest.raises(RequestError, match=r"has no task count\[4\] \(tasks: read\[0\], count\[1\]\)"):
        _task_executor(app, "count[4]")
    with pytest.raises(RequestError, match=r"NAME\[INDEX\]"):
        _task_executor(app, "count[one]")


def test_a_task_is_named_by_ids_only_before_the_plan_is_known():
    assert TaskId(3, 1).named({3: "count"}) == "count[1]"
    assert TaskId(3, 1).named({}) == "task 3.1"
