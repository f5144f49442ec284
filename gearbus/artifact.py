"""Application artifacts: packing a user's file or package for the object store, and
loading it back into an Application in the AppMaster and executor processes.

An application module defines ``application(args: list[str])`` returning a DSL
``gearbus.Pipeline`` (planned here) or a low-level ``gearbus.Application``.

User code never stands in for the framework's: an application named like a framework
package (``gearbus``, ``services``, ``shared``) is refused, and the loader imports the
application from its own file, directory or zip without putting anything on ``sys.path``
ahead of the framework.

Loading imports the DSL and the planner where it builds the Application: packing (the
client, and the CLI's commands that only ask the cluster) needs neither.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import os
import sys
import tempfile
import zipfile
import zipimport
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.messages import FRAMEWORK_PACKAGES

if TYPE_CHECKING:
    from gearbus.api.dsl import BasePipeline
    from gearbus.api.graph import Application

ENTRY_FUNCTION = "application"


MAX_ARTIFACT_BYTES = 256 << 20  # an application's code, zipped or inflated


class ArtifactError(ValueError):
    """The application file or package cannot be used; the message says why."""


def check_name(name: str, origin: str) -> None:
    """Refuse an application whose module or package would clash with the framework's."""
    if name in FRAMEWORK_PACKAGES:
        raise ArtifactError(f"{origin}: the application name {name!r} clashes with gearbus's own package {name!r} "
                            f"({', '.join(FRAMEWORK_PACKAGES)} are the framework's): rename the application")


def package_init(path: str) -> str:
    """The ``__init__.py`` of the package directory ``path``."""
    init = os.path.join(path, "__init__.py")
    if not os.path.exists(init):
        raise ArtifactError(f"{path} is a directory but not a Python package (no __init__.py)")
    return init


@dataclass(frozen=True)
class Artifact:
    data: bytes
    kind: str  # "module" or "zip"
    entry: str  # module name to import

    @property
    def name(self) -> str:
        """Object-store name: content-addressed, so re-submitting uploads nothing new."""
        digest = hashlib.sha256(self.data).hexdigest()[:32]
        return f"{self.entry}-{digest}.{'py' if self.kind == 'module' else 'zip'}"


def pack(path: str | os.PathLike) -> Artifact:
    """Pack a ``.py`` file, or a package directory (zipped), into an Artifact."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.exists(path):
        raise ArtifactError(f"application file {path} does not exist")
    if os.path.isdir(path):
        package_init(path)
        entry = os.path.basename(path)
        check_name(entry, path)
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
            for root, dirs, files in os.walk(path):
                dirs[:] = [d for d in dirs if d != "__pycache__"]
                for f in files:
                    full = os.path.join(root, f)
                    zf.write(full, os.path.join(entry, os.path.relpath(full, path)))
        return Artifact(buffer.getvalue(), "zip", entry)
    if not path.endswith(".py"):
        raise ArtifactError(f"{path} is not a Python file (.py) or package directory")
    entry = os.path.splitext(os.path.basename(path))[0]
    check_name(entry, path)
    with open(path, "rb") as f:
        return Artifact(f.read(), "module", entry)


def call_application(module, args: list[str], origin: str, submitter_dir: str = "") -> BasePipeline | Application:
    """Call the module's ``application(args)`` and check what it returns. Its relative file
    paths are in ``submitter_dir`` ("": this process's working directory, the client's)."""
    from gearbus.api.dsl import BasePipeline
    from gearbus.api.graph import Application
    from gearbus.api.paths import submitted_from

    factory = getattr(module, ENTRY_FUNCTION, None)
    if not callable(factory):
        raise ArtifactError(f"{origin} does not define {ENTRY_FUNCTION}(args) -> gearbus.Pipeline or Application")
    said = io.StringIO()  # what argparse and friends print before they exit: the user must see it
    try:
        with contextlib.redirect_stderr(said), submitted_from(submitter_dir):
            app = factory(list(args))
    except SystemExit as exc:  # argparse and friends exit on bad arguments
        message = said.getvalue().strip()
        raise ArtifactError(f"{origin}: application arguments rejected (exit code {exc.code})"
                            + (f":\n{message}" if message else "")) from None
    except BaseException:
        sys.stderr.write(said.getvalue())
        raise
    sys.stderr.write(said.getvalue())  # what it printed without exiting (warnings) still reaches the log
    if not isinstance(app, (BasePipeline, Application)):
        raise ArtifactError(
            f"{origin}: {ENTRY_FUNCTION}() returned {type(app).__name__}, expected gearbus.Pipeline or Application"
        )
    return app


def build_application(module, args: list[str], origin: str, runner: str = "cluster", note: bool = True,
                      submitter_dir: str = "") -> Application:
    """Call the module's ``application(args)`` (paths as :func:`call_application`); plan a
    Pipeline for ``runner`` (``note``: see plan; an Application's config is checked as a plan
    checks a Pipeline's)."""
    from gearbus.api.dsl import BasePipeline
    from gearbus.control.config import AppConfig
    from gearbus.planner import plan

    app = call_application(module, args, origin, submitter_dir)
    if isinstance(app, BasePipeline):
        return plan(app, runner, note)
    AppConfig.parse(app.config)
    return app


def import_file(path: str):
    """Import a .py file as a module named after its stem."""
    name = os.path.splitext(os.path.basename(path))[0]
    check_name(name, path)
    return _import(name, importlib.util.spec_from_file_location(name, path), path)


def import_package(path: str):
    """Import a package directory as the package named after it, from there alone."""
    name = os.path.basename(path)
    check_name(name, path)
    spec = importlib.util.spec_from_file_location(name, package_init(path), submodule_search_locations=[path])
    return _import(name, spec, f"package {path}")


def _import(name: str, spec, what: str):
    """Run the module ``spec`` describes as ``name``. It is registered first (its own
    submodules and pickles find it there); the framework's names never get this far."""
    if spec is None or spec.loader is None:
        raise ArtifactError(f"cannot import {what}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise ArtifactError(f"importing {what} failed: {type(exc).__name__}: {exc}") from exc
    return module


def load_local(path: str, args: list[str], runner: str = "cluster") -> Application:
    """Import a local file or package and build its Application (the CLI's pre-check)."""
    path = os.path.abspath(path)
    return build_application(import_local(path), args, path, runner)


def load_pipeline(path: str, args: list[str]) -> BasePipeline:
    """Import a local file or package and return the DSL Pipeline it builds."""
    from gearbus.api.dsl import BasePipeline

    path = os.path.abspath(path)
    app = call_application(import_local(path), args, path)
    if not isinstance(app, BasePipeline):
        raise ArtifactError(f"{path} builds a low-level Application; this runner runs DSL pipelines (gearbus.Pipeline)")
    return app


def import_local(path: str):
    """Import a local .py file or package directory."""
    if not os.path.exists(path):
        raise ArtifactError(f"application file {path} does not exist")
    return import_package(path) if os.path.isdir(path) else import_file(path)


def unpack_artifact(data: bytes, kind: str, entry: str, workdir: str) -> str:
    """Check an artifact fetched from the object store and write it into ``workdir`` as the
    one file Python imports it from (a ``.py``, or a ``.zip`` read by zipimport, which
    never extracts); return that file's path. Anything else is an ArtifactError: an
    unknown kind, an entry that is not a module name (it names the file), an oversized
    artifact, a zip that is corrupt, would inflate past the limit, holds unsafe names or
    lacks the entry package."""
    if kind not in ("module", "zip"):
        raise ArtifactError(f"unknown artifact kind {kind!r}; expected 'module' or 'zip'")
    if not isinstance(entry, str) or not entry.isidentifier():
        raise ArtifactError(f"artifact entry {entry!r} is not a Python module name")
    check_name(entry, f"artifact entry {entry!r}")
    if len(data) > MAX_ARTIFACT_BYTES:
        raise ArtifactError(f"artifact of {len(data)} bytes is larger than {MAX_ARTIFACT_BYTES}")
    if kind == "zip":
        _check_zip(data, entry)
    path = os.path.join(workdir, f"{entry}.{'py' if kind == 'module' else 'zip'}")
    with open(path, "wb") as f:
        f.write(data)
    return path


def _check_zip(data: bytes, entry: str) -> None:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            members = zf.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
        raise ArtifactError(f"artifact is not a valid zip: {exc}") from None
    if sum(m.file_size for m in members) > MAX_ARTIFACT_BYTES:
        raise ArtifactError(f"artifact zip would inflate past {MAX_ARTIFACT_BYTES} bytes")
    for member in members:
        name = member.filename
        if name.startswith(("/", "\\")) or ".." in name.replace("\\", "/").split("/") or ":" in name:
            raise ArtifactError(f"artifact zip holds an unsafe name {name!r}")
        top = name.replace("\\", "/").split("/")[0]
        check_name(top.partition(".")[0], f"artifact zip member {name!r}")
    if f"{entry}/__init__.py" not in {m.filename for m in members}:
        raise ArtifactError(f"artifact zip has no package {entry!r} ({entry}/__init__.py)")


def load_artifact(data: bytes, kind: str, entry: str, args: list[str], workdir: str | None = None,
                  module_name: str = "", submitter_dir: str = "") -> Application:
    """Materialise an artifact fetched from the object store in ``workdir`` (its owner
    removes it) and build its Application, its relative file paths in ``submitter_dir``
    (where it was submitted from). ``module_name``: import a module artifact under
    this name instead of its own (a later version of a running app's code, beside the
    first: pickles of each version's objects name their own module); a package keeps its
    name, so one already imported is refused. A file step the module makes as it is
    imported (at its top level) takes its relative path in ``submitter_dir`` too."""
    from gearbus.api.paths import submitted_from

    workdir = workdir or tempfile.mkdtemp(prefix="gearbus-artifact-")
    if module_name and kind == "module":
        workdir = os.path.join(workdir, module_name)
        os.makedirs(workdir, exist_ok=True)
    path = unpack_artifact(data, kind, entry, workdir)
    if kind == "zip" and module_name and entry in sys.modules:
        raise ArtifactError(f"package {entry!r} is loaded already (the version running): a new version of a "
                            "package app needs a package name of its own")
    with submitted_from(submitter_dir):
        if kind == "zip":
            module = _import(entry, zipimport.zipimporter(path).find_spec(entry), f"package {entry}")
        elif module_name:
            module = _import(module_name, importlib.util.spec_from_file_location(module_name, path), path)
        else:
            module = import_file(path)
    return build_application(module, args, f"application {entry}", note=False,  # the submitter was told
                             submitter_dir=submitter_dir)
