"""A multi-stage app's family in the master (services/master/stages.py), without NATS:
what the end of the app or of one of its stages means for the others, with the family's
invariants checked after every end carried out."""

from __future__ import annotations

import dataclasses

import pytest

from services.master import stages as family
from services.master.store import ApplicationRecord
from shared.messages import AppError, AppState, IntermediateStreamSpec

pytestmark = pytest.mark.unit

STREAMS = [IntermediateStreamSpec("gearbus_wc_a", 4, "a", 0, 1), IntermediateStreamSpec("gearbus_wc_b", 2, "b", 1, 2)]


def make_family(stages: int = 3) -> dict[int, ApplicationRecord]:
    apps = {1: ApplicationRecord(1, "wc", AppState.ACTIVE, 0, "wc.py", "wc", stage_apps=list(range(2, 2 + stages)),
                                 streams=STREAMS)}
    for n in range(stages):
        apps[2 + n] = ApplicationRecord(2 + n, f"wc.stage{n}", AppState.ACTIVE, 0, "wc.py", "wc", stage_of=1,
                                        stage=n, streams=STREAMS)
    return apps


def end(apps: dict[int, ApplicationRecord], app_id: int, state: str, error: AppError | None = None) -> list:
    """End ``app_id`` and carry out what follows, as the master does; every instruction
    carried out, in order (deletions of streams included)."""
    done = []
    pending = [family.EndApp(app_id, state, error, "")]
    while pending:
        instruction = pending.pop(0)
        done.append(instruction)
        if isinstance(instruction, family.EndApp):
            if apps[instruction.app_id].state in AppState.TERMINAL:
                continue
            apps[instruction.app_id] = dataclasses.replace(apps[instruction.app_id], state=instruction.state,
                                                           error=instruction.error)
            pending.extend(family.after_end(apps[instruction.app_id], apps))
    family.validate(apps)
    return done[1:]


def test_the_app_succeeds_once_every_stage_has_and_its_streams_go():
    apps = make_family()
    assert end(apps, 3, AppState.SUCCEEDED) == []
    assert end(apps, 2, AppState.SUCCEEDED) == []
    follow = end(apps, 4, AppState.SUCCEEDED)
    assert follow == [family.EndApp(1, AppState.SUCCEEDED, None, "every stage succeeded"),
                      family.DeleteStreams(1, ("gearbus_wc_a", "gearbus_wc_b"))]
    assert apps[1].state == AppState.SUCCEEDED


def test_a_failed_stage_fails_the_app_naming_it_kills_the_others_and_keeps_the_streams():
    apps = make_family()
    cause = AppError("ValueError", "step 'split' on record 'x': ValueError: bad", "task split[0]", "Traceback ...")
    follow = end(apps, 3, AppState.FAILED, cause)
    failed = follow[0]
    assert failed.app_id == 1 and failed.state == AppState.FAILED
    assert failed.error == AppError("ValueError", "stage 1 (app 3) failed: step 'split' on record 'x': ValueError: bad",
                                    "stage 1, task split[0]", "Traceback ...")
    assert [(i.app_id, i.state) for i in follow[1:]] == [(2, AppState.TERMINATED), (4, AppState.TERMINATED)]
    assert not any(isinstance(i, family.DeleteStreams) for i in follow)


def test_a_stage_killed_alone_fails_the_app():
    apps = make_family(2)
    follow = end(apps, 2, AppState.TERMINATED)
    assert follow[0].error.error_type == "StageKilled" and follow[0].error.message == "stage 0 (app 2) was killed"
    assert apps[1].state == AppState.FAILED and apps[3].state == AppState.TERMINATED


def test_killing_the_app_kills_its_stages_and_deletes_its_streams():
    apps = make_family()
    apps[2] = dataclasses.replace(apps[2], state=AppState.SUCCEEDED)  # an early stage that had finished
    follow = end(apps, 1, AppState.TERMINATED)
    assert [(i.app_id, i.state) for i in follow if isinstance(i, family.EndApp)] == [(3, AppState.TERMINATED),
                                                                                   (4, AppState.TERMINATED)]
    assert follow[-1] == family.DeleteStreams(1, ("gearbus_wc_a", "gearbus_wc_b"))
    assert apps[2].state == AppState.SUCCEEDED


def test_a_failed_app_keeps_its_streams_and_an_app_without_stages_changes_nothing():
    apps = make_family()
    follow = end(apps, 1, AppState.FAILED, AppError("AppMasterLost", "gone"))
    assert all(isinstance(i, family.EndApp) for i in follow) and len(follow) == 3
    alone = {9: ApplicationRecord(9, "plain", AppState.FAILED, 0, "p.py", "p")}
    assert family.after_end(alone[9], alone) == []


def test_an_end_after_the_app_ended_changes_nothing():
    apps = make_family(2)
    end(apps, 1, AppState.TERMINATED)
    assert family.after_end(apps[2], apps) == []


def test_a_stage_the_master_never_recorded_keeps_the_app_from_succeeding():
    apps = make_family(2)
    del apps[3]  # named by the app, lost with a master before it was recorded
    assert family.after_end(dataclasses.replace(apps[2], state=AppState.SUCCEEDED), apps) == []
