"""A multi-stage app in the master: the app its user submitted, one app per stage (each
checkpoints and recovers on its own), and the intermediate streams between them.

Decisions without I/O: when one of the family ends, :func:`after_end` says what follows::

    ended          how          then
    a stage        succeeded    the app succeeds once every stage has; its streams are deleted
    a stage        failed or    the app fails, naming the stage; the other stages are killed;
                   was killed   the streams are kept (what they hold is there to look into)
    the app        succeeded    its streams are deleted
    the app        killed       its stages are killed and its streams deleted
    the app        failed       its stages are killed; its streams are kept

The master carries out each instruction, and ending an app feeds this again.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.master.store import ApplicationRecord
from shared.messages import AppError, AppState


@dataclass(frozen=True)
class EndApp:
    app_id: int
    state: str
    error: AppError | None
    reason: str


@dataclass(frozen=True)
class DeleteStreams:
    app_id: int
    names: tuple[str, ...]


def after_end(ended: ApplicationRecord, apps: dict[int, ApplicationRecord]) -> list[EndApp | DeleteStreams]:
    """What follows the end of ``ended`` (recorded in ``apps`` with its final state)."""
    if ended.stage_of:
        app = apps.get(ended.stage_of)
        if app is None or app.state in AppState.TERMINAL:
            return []
        if ended.state == AppState.SUCCEEDED:
            if all(i in apps and apps[i].state == AppState.SUCCEEDED for i in app.stage_apps):
                return [EndApp(app.app_id, AppState.SUCCEEDED, None, "every stage succeeded")]
            return []
        how = "was killed" if ended.state == AppState.TERMINATED else "failed"
        cause = ended.error
        message = f"stage {ended.stage} (app {ended.app_id}) {how}" + (f": {cause.message}" if cause else "")
        error = AppError(cause.error_type if cause else "StageKilled", message,
                         f"stage {ended.stage}" + (f", {cause.where}" if cause and cause.where else ""),
                         cause.traceback if cause else "")
        return [EndApp(app.app_id, AppState.FAILED, error, f"stage {ended.stage} {how}")]
    if not ended.stage_apps:
        return []
    follow: list[EndApp | DeleteStreams] = [
        EndApp(i, AppState.TERMINATED, None, f"app {ended.app_id}, whose stage it is, ended")
        for i in ended.stage_apps if i in apps and apps[i].state not in AppState.TERMINAL]
    if ended.state != AppState.FAILED and ended.streams:
        follow.append(DeleteStreams(ended.app_id, tuple(s.name for s in ended.streams)))
    return follow


def validate(apps: dict[int, ApplicationRecord]) -> None:
    """Invariants of every family: a stage's app lists it at its place; an ended app's
    stages have all ended."""
    for record in apps.values():
        if record.stage_of and record.stage_of in apps:
            app = apps[record.stage_of]
            assert app.stage_apps[record.stage] == record.app_id, (record.app_id, app.stage_apps)
        if record.stage_apps and record.state in AppState.TERMINAL:
            assert all(apps[i].state in AppState.TERMINAL for i in record.stage_apps if i in apps), record.app_id
