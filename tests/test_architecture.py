"""The house (docs/architecture.md), read from the source without running it: every import points down the
layers, no import cycle, every import name under `tito_rl`, no folder a long flat list, and pyproject.toml
installing exactly the packages the folders hold.

Layers, bottom to top: trajectory, cassette, fake_engine, recorder, replayer, and the `tito` program (the modules of
the folder `tito_rl/`, the package the other folders are installed in). A module may import its own folder and the
folders below it. Imports inside functions count: a lazy import is still a dependency, and a
cycle through one is still a cycle.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "tito_rl"
LAYERS = ("trajectory", "cassette", "fake_engine", "recorder", "replayer", NAMESPACE)  # folders, bottom to top
# The folders' own names as top-level imports, and the old command module's: each another project's on PyPI or a
# user's folder, never tito's.
OLD_NAMES = ("trajectory", "cassette", "fake_engine", "recorder", "replayer", "tito_cli")
MAX_MODULES = 12  # per folder, __init__ aside


@dataclass(frozen=True)
class Import:
    source: Path  # the importing file
    line: int
    target: str  # the tito_rl module it names


def module_name(path: Path) -> str:
    """The installed name of a source file: `replayer/replay/cli.py` is `tito_rl.replayer.replay.cli`, and
    `tito_rl/main.py` is `tito_rl.main`."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join((NAMESPACE, *parts[1:])) if parts[0] == NAMESPACE else ".".join((NAMESPACE, *parts))


def folder(module: str) -> str:
    """The top-level folder a module's file is in: its layer."""
    first = module.split(".")[1] if "." in module else ""
    return first if first in LAYERS[:-1] else NAMESPACE


def modules() -> dict[str, Path]:
    return {module_name(path): path for top in LAYERS for path in sorted((ROOT / top).rglob("*.py"))}


def imported(path: Path, known: set[str]) -> Iterator[tuple[int, str]]:
    """(line, name) of every tito_rl module `path` imports, at any depth: `from a.b import c` names `a.b.c` where
    that is a module, else `a.b`."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known and name.startswith(NAMESPACE + "."):
                name = name.rpartition(".")[0]
            if name in known:
                yield node.lineno, name


def graph() -> tuple[dict[str, Path], list[Import]]:
    found = modules()
    edges = [
        Import(path, line, target)
        for name, path in found.items()
        for line, target in imported(path, set(found))
        if target != name
    ]
    return found, edges


def layer(module: str) -> int:
    return LAYERS.index(folder(module))


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_import_points_down_the_layers() -> None:
    found, edges = graph()
    upward = [
        f"{rel(e.source)}:{e.line} imports {rel(found[e.target])} ({folder(e.target)}/ is above "
        f"{folder(module_name(e.source))}/)"
        for e in edges
        if layer(e.target) > layer(module_name(e.source))
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def cycles(nodes: set[str], edges: list[Import]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's, iterative)."""
    out: dict[str, list[str]] = {n: [] for n in nodes}
    for e in edges:
        out[module_name(e.source)].append(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(out[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(out[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle() -> None:
    found, edges = graph()
    lines = []
    for component in cycles(set(found), edges):
        members = set(component)
        links = [
            f"  {rel(e.source)}:{e.line} imports {rel(found[e.target])}"
            for e in edges
            if module_name(e.source) in members and e.target in members
        ]
        lines.append("a cycle:\n" + "\n".join(links))
    assert not lines, "\n".join(lines)


def test_the_checks_catch_what_they_guard_against() -> None:
    """The two checks above, on a made-up graph: an upward import and a cycle are each found and named."""
    a, b = ROOT / "recorder" / "a.py", ROOT / "replayer" / "b.py"
    edges = [Import(a, 3, module_name(b)), Import(b, 7, module_name(a))]
    assert layer(module_name(b)) > layer(module_name(a))  # a's import of b is upward
    assert cycles({module_name(a), module_name(b)}, edges) == [sorted([module_name(a), module_name(b)])]
    assert cycles({module_name(a), module_name(b)}, edges[:1]) == []


def python_files() -> list[Path]:
    return [p for top in [*LAYERS, "tests", "benchmarks"] for p in sorted((ROOT / top).rglob("*.py"))]


def test_nothing_imports_tito_by_a_bare_folder_name() -> None:
    """`import recorder` would find PyPI's `recorder`, or a user's own folder: every import of tito is through
    `tito_rl`."""
    bare = []
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom) or isinstance(node, ast.ImportFrom) and node.level:
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            bare += [f"{rel(path)}:{node.lineno}: {name}" for name in names if name.split(".")[0] in OLD_NAMES]
    assert not bare, "imports by a bare folder name:\n" + "\n".join(bare)


def test_no_folder_is_a_long_flat_list() -> None:
    long = []
    for top in LAYERS:
        for package in [ROOT / top, *(p.parent for p in (ROOT / top).rglob("*/__init__.py"))]:
            count = len([p for p in package.glob("*.py") if p.name not in ("__init__.py", "__main__.py")])
            if count > MAX_MODULES:
                long.append(f"{rel(package)}: {count} modules")
    assert not long, f"folders of more than {MAX_MODULES} modules:\n" + "\n".join(long)


def test_pyproject_installs_every_package_under_the_namespace() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "package-dir" not in setuptools  # the links below are the one mapping: wheel, editable, checkers alike
    packages = sorted(module_name(p) for top in LAYERS for p in (ROOT / top).rglob("__init__.py"))
    assert setuptools["packages"] == packages


@pytest.mark.parametrize("top", LAYERS[:-1])
def test_namespace_links_each_top_level_folder(top: str) -> None:
    """`tito_rl/<folder>` is a relative link to the top-level folder, so that an editor, mypy and setuptools all read
    `tito_rl.<folder>.x` from `<folder>/x.py` in the checkout, with no configuration and no import hook."""
    link = ROOT / NAMESPACE / top
    assert link.is_symlink(), f"{rel(link)} is not a link (git config core.symlinks false?)"
    assert str(link.readlink()) == f"../{top}"
    assert link.resolve() == (ROOT / top).resolve()
    links = sorted(p.name for p in (ROOT / NAMESPACE).iterdir() if p.is_symlink())
    assert links == sorted(LAYERS[:-1])


@pytest.mark.parametrize("top", LAYERS)
def test_every_folder_is_a_package(top: str) -> None:
    """A folder of modules without an __init__.py would not be installed (`packages` lists folders that have one)."""
    missing = [
        rel(d)
        for d in [ROOT / top, *(ROOT / top).rglob("*")]
        if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")) and not (d / "__init__.py").exists()
    ]
    assert not missing


def static_path(module: str) -> Path | None:
    """Where a static resolver (mypy, pyright, an editor) finds `module` from the checkout's root: the dotted name as
    folders, a module file or a package's __init__.py; no import hook, no setuptools mapping."""
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def test_every_tito_import_resolves_statically_to_its_file_in_the_checkout() -> None:
    """Issue #37: an editor following `tito_rl.replayer.replay.cli` lands on `replayer/replay/cli.py`, because
    `tito_rl/replayer` links there; every module tito imports, and every module tito has, is found that way."""
    found, edges = graph()
    unresolved = [
        f"{rel(e.source)}:{e.line} imports {e.target}"
        for e in edges
        if static_path(e.target) is None or static_path(e.target).resolve() != found[e.target].resolve()
    ]
    assert not unresolved, "imports a static resolver cannot follow:\n" + "\n".join(unresolved)
    for name, path in found.items():
        at = static_path(name)
        assert at is not None and at.resolve() == path.resolve(), f"{name}: {at} is not {rel(path)}"
