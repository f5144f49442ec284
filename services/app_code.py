"""Loading an app's code in a process a worker launched (an AppMaster or an executor):
apart from services.launch, so the worker, which imports that, does not import the DSL,
the planner and the connectors (~0.25 s of every worker's start-up)."""

from __future__ import annotations

import os

from gearbus.api.graph import Application
from gearbus.artifact import ArtifactError, load_artifact
from gearbus.control.config import AppConfig
from gearbus.stages import stage_app
from services.launch import WORKDIR_ENV
from shared import digests, subjects
from shared.bus import object_bytes, ride_out
from shared.messages import AppVersion, LaunchExecutor


#: (artifact, args) -> the Application a later version of the app's code builds: each is
#: imported once per process, under a module name of its own (see ``version_module``)
_versions_loaded: dict[tuple[str, tuple[str, ...]], Application] = {}


def version_module(artifact: str) -> str:
    """The module name a later version's code is imported under: from its content-addressed
    object name (``entry-<digest>.py``), so versions never share one."""
    return artifact.rpartition(".")[0].replace("-", "__")


async def fetch_application(bus, launch: LaunchExecutor | AppVersion) -> Application:
    """Download the artifact of a launch (or of a later version of the app's code, once per
    process) from the object store, waiting out a JetStream outage, check it is the one
    recorded, and build the user's Application."""
    if isinstance(launch, AppVersion):
        key = (launch.artifact, tuple(launch.args))
        if key not in _versions_loaded:
            _versions_loaded[key] = await _fetch(bus, launch, version_module(launch.artifact))
        return _versions_loaded[key]
    return await _fetch(bus, launch)


async def _fetch(bus, launch: LaunchExecutor | AppVersion, module_name: str = "") -> Application:
    async def download() -> bytes:
        return await object_bytes(bus.js, subjects.ARTIFACT_BUCKET, launch.artifact)

    data = await ride_out(download, f"downloading artifact {launch.artifact}")
    if launch.artifact_digest and digests.sha256_hex(data) != launch.artifact_digest:
        raise ArtifactError(f"artifact {launch.artifact} is not the one submitted (SHA-256 {digests.sha256_hex(data)}, "
                            f"recorded {launch.artifact_digest}): refusing to run it")
    app = load_artifact(data, launch.artifact_kind, launch.entry, launch.args, os.environ.get(WORKDIR_ENV),
                        module_name, launch.submitter_dir)
    stage = AppConfig.parse(launch.config).stage if isinstance(launch, LaunchExecutor) else None
    return app if stage is None else stage_app(app, stage)
