"""An app's code versions in its AppMaster (gearbus replace): the history `gearbus status`
shows and the key-value store keeps for a relaunched AppMaster, the Application each
version builds, and the plan the app runs with the versions its processors run. Which
processor runs which version is the state machine's to decide; this keeps the rest."""

from __future__ import annotations

import dataclasses

from gearbus.api.graph import Application
from gearbus.runtime.replace import compose
from shared.messages import AppVersion, LaunchExecutor

RUNNING, PENDING, REPLACED, ROLLED_BACK, NOT_TAKEN_OVER = "running", "pending", "replaced", "rolled back", \
    "not taken over"


class AppVersions:
    def __init__(self, launch: LaunchExecutor, app: Application, created_ms: int) -> None:
        """Version 1: the app as submitted (``app``, built from ``launch``'s artifact)."""
        self.history: list[AppVersion] = [AppVersion(1, launch.artifact, launch.entry, launch.artifact_kind,
                                                     list(launch.args), created_ms=created_ms,
                                                     artifact_digest=launch.artifact_digest,
                                                     submitter_dir=launch.submitter_dir)]
        self.apps: dict[int, Application] = {1: app}
        self.requests: dict[int, int] = {}  # replace request id -> its version

    @property
    def next_version(self) -> int:
        return len(self.history) + 1

    def restore(self, stored: list[AppVersion], running: set[int], on_trial: int = 0) -> None:
        """A relaunched AppMaster's history, as its predecessor stored it; a replacement it
        left pending is still on trial (``on_trial``: the machine answers it as request 0),
        runs if its epoch record says so (``running``), else never will."""
        self.history = [v if v.state != PENDING or v.version == on_trial
                        else dataclasses.replace(v, state=RUNNING) if v.version in running
                        else dataclasses.replace(v, state=NOT_TAKEN_OVER, error="the AppMaster was relaunched first")
                        for v in stored] or self.history
        for v in list(self.history):
            if v.state == RUNNING and v.version in running:
                self._took_over(v)
        if on_trial:
            self.requests[0] = on_trial

    def asked(self, request_id: int, version: AppVersion, app: Application) -> None:
        """A replacement the state machine took (pending until it answers)."""
        self.history.append(dataclasses.replace(version, state=PENDING))
        self.apps[version.version] = app
        self.requests[request_id] = version.version

    def answered(self, request_id: int, error: str, rolled_back: bool) -> AppVersion | None:
        """The machine's answer to a replacement: the version runs (the one it replaced is
        now "replaced"), or was rolled back or not taken over, with why."""
        number = self.requests.pop(request_id, None)
        if number is None:
            return None
        version = self.history[number - 1]
        if error:
            version = dataclasses.replace(version, state=ROLLED_BACK if rolled_back else NOT_TAKEN_OVER, error=error)
        else:
            version = dataclasses.replace(version, state=RUNNING)
            self._took_over(version)
        self.history[number - 1] = version
        return version

    def _took_over(self, version: AppVersion) -> None:
        """``version`` runs its processor: the earlier versions that ran it are "replaced"
        (version 1, the app as submitted, as soon as one of its processors is)."""
        self.history = [dataclasses.replace(v, state=REPLACED) if v.version < version.version and v.state == RUNNING
                        and v.processor in (version.processor, -1) else v for v in self.history]

    def running(self, versions: dict[int, int]) -> dict[int, AppVersion]:
        """Processor id -> the version record of the code it runs, for ``versions`` (the
        machine's processor -> version number, where not version 1)."""
        return {processor: self.history[number - 1] for processor, number in versions.items()}

    def plan(self, versions: dict[int, int]) -> Application:
        """The app as planned (version 1's parallelism) with those processors' code from
        their versions (each loaded by :meth:`asked` or :meth:`loaded`)."""
        return compose(self.apps[1], {processor: self.apps[number] for processor, number in versions.items()})

    def loaded(self, number: int, app: Application) -> None:
        self.apps[number] = app
