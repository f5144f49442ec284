"""Package lines run one way: shared <- gearbus (api <- runtime <- connectors, runners,
with the command line, gearbus.cli, on top of gearbus) <- services. Every import counts,
at module level or inside a function, and no modules, nor packages, import each other in
a cycle."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("shared", "gearbus", "services")
#: The command line, on top of gearbus: it starts the roles as processes, never imports them.
CLI = "gearbus.cli"

#: (importer, what it must not import, why): a module within ``importer`` (the package or
#: module itself, or anything under it) imports nothing within the names that follow.
RULES = [
    ("shared", ("gearbus", "services"), "shared is the bottom layer: the wire every role speaks"),
    ("gearbus.api", ("gearbus.runtime", "gearbus.connectors", "gearbus.runners", CLI),
     "the api describes applications; the runtime, connectors and runners build on it"),
    ("gearbus.runtime", ("gearbus.connectors", "gearbus.runners", CLI),
     "the runtime runs tasks; connectors and runners build on it"),
    ("gearbus.connectors", ("gearbus.runners", CLI), "runners use connectors, not the other way"),
    ("gearbus", ("services",), "the roles build on gearbus, not the other way"),
    ("services", (CLI,), "the roles do not call the command line"),
]


@dataclass(frozen=True)
class Import:
    importer: str
    target: str
    where: str  # path:line, relative to the root

    def __str__(self) -> str:
        return f"{self.where}: {self.importer} imports {self.target}"


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def modules(root: Path) -> dict[str, Path]:
    """Every module of the project's packages, by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(root: Path) -> list[Import]:
    """Every import of a project module by a project module, wherever it stands in the file."""
    known = modules(root)
    found = []
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                # ``from package import module`` imports that module; ``from module import name`` the module
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            where = f"{path.relative_to(root)}:{node.lineno}"
            found += [Import(name, t, where) for t in dict.fromkeys(targets) if t.split(".")[0] in PACKAGES]
    return found


def against_the_lines(found: list[Import]) -> list[str]:
    wrong = []
    for imp in found:
        for importer, forbidden, why in RULES:
            if within(imp.importer, importer) and any(within(imp.target, f) for f in forbidden):
                wrong.append(f"{imp} ({why})")
    return wrong


def cycles(found: list[Import]) -> list[list[Import]]:
    """The strongly connected components (Tarjan) of the module graph with more than one
    module, each as the imports that join its modules."""
    graph: dict[str, list[Import]] = {}
    for imp in found:
        if imp.target != imp.importer:
            graph.setdefault(imp.importer, []).append(imp)
            graph.setdefault(imp.target, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imp in graph[module]:
            if imp.target not in index:
                visit(imp.target)
                low[module] = min(low[module], low[imp.target])
            elif imp.target in on_stack:
                low[module] = min(low[module], index[imp.target])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                components.append([i for m in sorted(component) for i in graph[m] if i.target in component])

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return components


def test_every_import_follows_the_package_lines():
    wrong = against_the_lines(imports(ROOT))
    assert not wrong, "imports against the package lines:\n" + "\n".join(wrong)


def part(name: str) -> str:
    """The part of the project a module belongs to: a subpackage (gearbus.api,
    services.executor) or a module standing alone (gearbus.planner, shared.bus)."""
    return ".".join(name.split(".")[:2])


def describe(found: list[list[Import]]) -> str:
    return "\n\n".join("\n".join(sorted(set(map(str, cycle)))) for cycle in found)


def test_no_modules_import_each_other_in_a_cycle():
    found = cycles(imports(ROOT))
    assert not found, "import cycles between modules:\n" + describe(found)


def test_no_parts_import_each_other_in_a_cycle():
    found = cycles([Import(part(i.importer), part(i.target), i.where) for i in imports(ROOT)])
    assert not found, "import cycles between packages:\n" + describe(found)


def test_the_checks_find_imports_hidden_in_functions_and_name_file_and_line(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "gearbus" / "api").mkdir()
    (tmp_path / "gearbus" / "api" / "__init__.py").write_text("")
    (tmp_path / "gearbus" / "api" / "dsl.py").write_text(
        "import shared.bus\n\n\ndef read():\n    from gearbus.connectors import files\n")
    (tmp_path / "gearbus" / "connectors").mkdir()
    (tmp_path / "gearbus" / "connectors" / "__init__.py").write_text("")
    (tmp_path / "gearbus" / "connectors" / "files.py").write_text("from ..api.dsl import read\n")
    (tmp_path / "shared" / "bus.py").write_text("")
    (tmp_path / "gearbus" / "cli.py").write_text("import services\n")
    found = imports(tmp_path)
    assert against_the_lines(found) == [
        "gearbus/api/dsl.py:5: gearbus.api.dsl imports gearbus.connectors.files (the api describes applications; "
        "the runtime, connectors and runners build on it)",
        "gearbus/cli.py:1: gearbus.cli imports services (the roles build on gearbus, not the other way)",
    ]
    assert describe(cycles(found)) == (
        "gearbus/api/dsl.py:5: gearbus.api.dsl imports gearbus.connectors.files\n"
        "gearbus/connectors/files.py:1: gearbus.connectors.files imports gearbus.api.dsl"
    )

