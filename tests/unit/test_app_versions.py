"""An app's code versions in its AppMaster: what became of each after a replacement."""

from __future__ import annotations

import pytest

from gearbus import Pipeline
from gearbus.planner import plan
from services.appmaster.versions import AppVersions
from shared.messages import AppVersion, LaunchExecutor

pytestmark = pytest.mark.unit


def versions() -> AppVersions:
    p = Pipeline("counts")
    p.from_collection(["a", "b"], name="read").map(str.upper, name="count").write_jsonl("out.jsonl", name="write")
    return AppVersions(LaunchExecutor(7, -1, "appmaster", "v1.py", "v1.py"), plan(p), created_ms=1000)


def ask(history: AppVersions, request_id: int, processor: int, step: str) -> None:
    number = history.next_version
    history.asked(request_id, AppVersion(number, f"v{number}.py", f"v{number}.py", "module", processor=processor,
                                         step=step, created_ms=1000 * number), history.apps[1])


def states(history: AppVersions) -> list[tuple[int, str]]:
    return [(v.version, v.state) for v in history.history]


def test_a_replacement_that_runs_makes_the_versions_it_took_over_from_replaced():
    history = versions()
    ask(history, 1, processor=1, step="count")
    assert states(history) == [(1, "running"), (2, "pending")]
    history.answered(1, "", rolled_back=False)
    assert states(history) == [(1, "replaced"), (2, "running")]
    ask(history, 2, processor=1, step="count")
    history.answered(2, "", rolled_back=False)
    assert states(history) == [(1, "replaced"), (2, "replaced"), (3, "running")]


def test_a_rolled_back_replacement_leaves_the_previous_version_running():
    history = versions()
    ask(history, 1, processor=1, step="count")
    history.answered(1, "ValueError: bad record", rolled_back=True)
    assert states(history) == [(1, "running"), (2, "rolled back")]
    assert history.history[1].error == "ValueError: bad record"


def test_a_relaunched_appmaster_shows_what_its_predecessor_left_pending_and_ran_as_replacing():
    stored = versions()
    ask(stored, 1, processor=1, step="count")  # stored pending: the AppMaster died before answering
    relaunched = versions()
    relaunched.restore(stored.history, running={2})
    assert states(relaunched) == [(1, "replaced"), (2, "running")]
