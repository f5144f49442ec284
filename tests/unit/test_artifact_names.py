"""User code cannot stand in for the framework: an application named like a framework
package is refused with the clash named, and the loader imports an application from its
own file, directory or zip without putting anything on sys.path."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

import shared
from gearbus.artifact import ArtifactError, load_artifact, load_local, pack, unpack_artifact
from shared.messages import FRAMEWORK_PACKAGES
from tests.support.files import zipped

ROOT = Path(__file__).resolve().parents[2]

APP = """
from gearbus import Pipeline
from {package}.steps import double


def application(args):
    p = Pipeline("{package}")
    p.from_collection([1, 2], name="numbers").map(double).write_jsonl(args[0], name="out")
    return p
"""


def package(where: Path, name: str) -> Path:
    """A package ``name`` whose application() imports its own submodule."""
    path = where / name
    path.mkdir(parents=True)
    (path / "__init__.py").write_text(APP.format(package=name))
    (path / "steps.py").write_text("def double(x):\n    return 2 * x\n")
    return path


def clash(name: str) -> str:
    return f"the application name '{name}' clashes with gearbus's own package '{name}'"


def test_the_reserved_names_are_the_packages_gearbus_installs():
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert sorted(FRAMEWORK_PACKAGES) == sorted(pattern.removesuffix("*") for pattern in include)


@pytest.mark.parametrize("name", FRAMEWORK_PACKAGES)
def test_a_package_named_like_the_framework_is_refused_naming_the_clash(tmp_path, name):
    path = package(tmp_path, name)
    with pytest.raises(ArtifactError, match=clash(name)):
        pack(path)
    with pytest.raises(ArtifactError, match=clash(name)):
        load_local(str(path), [str(tmp_path / "out.jsonl")], "test")


def test_a_module_named_like_the_framework_is_refused_and_shadows_nothing(tmp_path):
    path = tmp_path / "shared.py"
    path.write_text("def application(args):\n    raise AssertionError('never imported')\n")
    with pytest.raises(ArtifactError, match=clash("shared")):
        pack(path)
    with pytest.raises(ArtifactError, match=clash("shared")):
        load_local(str(path), [], "test")
    assert sys.modules["shared"] is shared


def test_an_artifact_entry_or_zip_member_named_like_the_framework_is_refused(tmp_path):
    with pytest.raises(ArtifactError, match=clash("services")):
        unpack_artifact(b"x = 1\n", "module", "services", str(tmp_path))
    data = zipped({"app/__init__.py": "", "gearbus/__init__.py": "", "shared.py": ""})
    with pytest.raises(ArtifactError, match=f"artifact zip member 'gearbus/__init__.py': {clash('gearbus')}"):
        unpack_artifact(data, "zip", "app", str(tmp_path))
    with pytest.raises(ArtifactError, match=f"artifact zip member 'shared.py': {clash('shared')}"):
        unpack_artifact(zipped({"app/__init__.py": "", "shared.py": ""}), "zip", "app", str(tmp_path))


def test_a_local_package_loads_from_its_directory_alone(tmp_path):
    """A sibling directory named like a framework package is never put ahead of it."""
    project = tmp_path / "project"
    package(project, "services").joinpath("__init__.py").write_text("raise AssertionError('shadowed')\n")
    path = package(project, "doubling_app")
    before = list(sys.path)
    app = load_local(str(path), [str(tmp_path / "out.jsonl")], "test")
    assert sys.path == before
    assert app.name == "doubling_app"
    assert sys.modules["doubling_app.steps"].__file__ == str(path / "steps.py")


def test_a_zip_artifact_loads_without_going_on_sys_path(tmp_path):
    data = pack(package(tmp_path / "src", "zipped_app")).data
    before = list(sys.path)
    app = load_artifact(data, "zip", "zipped_app", [str(tmp_path / "out.jsonl")], str(tmp_path))
    assert sys.path == before
    assert app.name == "zipped_app"
    assert sys.modules["zipped_app.steps"].double(2) == 4
