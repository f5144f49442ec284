"""Application types: the registry a launched AppMaster or executor process picks its
implementation from (docs/application-types.md).

An application type names what an app's AppMaster decides and what its executors run, on
the one AppMaster/Executor machinery (Gearpump's templates): the master records the app,
launches its AppMaster on a worker and starts the executors the AppMaster asks for, the
same for every type; ``LaunchExecutor.app_type`` then says which program the worker's
process runs. Streaming (the processor DAG) and shell (a command on chosen workers) are
built in; another type is a package that declares an :class:`ApplicationType` under the
entry-point group ``gearbus.app_types``, installed beside gearbus on the masters (which
read only the names) and the workers (whose processes load it)."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points

from services.launch import launch_from_env
from shared import subjects
from shared.messages import AppType

ENTRY_POINT_GROUP = "gearbus.app_types"
EXIT_UNKNOWN_TYPE = 2


@dataclass(frozen=True)
class ApplicationType:
    """One application type. ``appmaster`` and ``executor`` are ``"module:function"``: the
    ``main()`` of the process a worker launches for the app's AppMaster and for each of its
    executors (each reads its LaunchExecutor with ``services.launch.launch_from_env``).
    ``needs_artifact``: a submission must name an uploaded artifact (and a module to load
    from it); ``needs_workers``: it must name the workers to run on
    (``SubmitApplication.workers``); ``submit_subject``: the only subject its apps are
    submitted on where the cluster is secured (a subject of its own lets the operator grant
    it to some credentials only)."""

    name: str
    appmaster: str
    executor: str
    needs_artifact: bool = True
    needs_workers: bool = False
    submit_subject: str = subjects.APP_SUBMIT
    summary: str = ""


STREAMING = ApplicationType(
    AppType.STREAMING, "services.appmaster.appmaster:main", "services.executor.executor:main",
    summary="a DAG of processors joined by partitioners: its AppMaster plans tasks, checkpoints and recovers them")
SHELL = ApplicationType(
    AppType.SHELL, "services.appmaster.shell:main", "services.executor.shell:main", needs_artifact=False,
    needs_workers=True, submit_subject=subjects.APP_SUBMIT_SHELL,
    summary="a command run once on each chosen worker: its output and exit codes are kept for the client")
BUILT_IN = {t.name: t for t in (STREAMING, SHELL)}


class UnknownApplicationType(LookupError):
    pass


def names() -> list[str]:
    """Every type this installation knows, built-in or plug-in (plug-ins are not loaded)."""
    return sorted({*BUILT_IN, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})


def built_in(name: str) -> ApplicationType | None:
    """A built-in type's declaration (the master consults only these: it never loads plug-ins)."""
    return BUILT_IN.get(name)


def get(name: str) -> ApplicationType:
    """A type by name: built in, or loaded from its entry point."""
    if name in BUILT_IN:
        return BUILT_IN[name]
    for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
        declared = ep.load()
        if not isinstance(declared, ApplicationType) or declared.name != name:
            raise UnknownApplicationType(f"entry point {ep.value} of {ENTRY_POINT_GROUP} {name!r} is not an "
                                         f"ApplicationType named {name!r}")
        return declared
    raise UnknownApplicationType(f"unknown application type {name!r}; this worker knows {', '.join(names())}")


def run(role: str) -> int:
    """The ``main()`` of a launched AppMaster (``role`` "appmaster") or executor process:
    the one its app's type declares."""
    launch = launch_from_env()
    try:
        app_type = get(launch.app_type)
    except UnknownApplicationType as exc:
        print(f"gearbus {role} of app {launch.app_id}: {exc}", file=sys.stderr, flush=True)
        return EXIT_UNKNOWN_TYPE
    module, _, function = getattr(app_type, role).partition(":")
    return getattr(importlib.import_module(module), function)()
