"""The package's layers: imports only run downward, and no module imports itself back.

Every ``import`` counts, wherever it stands: at the top, inside a function, or under
``TYPE_CHECKING``.  A function-level import is how a module defers a cost, not a way
around the layering.  docs/design.md ("The package") describes each folder.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "imexctl"

# bottom first: a folder may import its own modules and those of the folders before it
LAYERS = ("platform", "config", "gpu", "slurm", "imex", "channels", "hooks", "doctor", "commands", "cli")
# the simulator stands in for NVIDIA's programs: it imports nothing of the product
APART = ("sim",)


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module(p): p for p in PACKAGE.rglob("*.py")}


def _targets(node: ast.AST, here: str, is_package: bool, known: dict[str, Path]) -> Iterator[str]:
    """The imexctl modules one import statement loads (a ``from x import y`` of a submodule y loads y)."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names if a.name.split(".")[0] == "imexctl")
        return
    if not isinstance(node, ast.ImportFrom):
        return
    base = node.module or ""
    if node.level:
        parent = here.split(".")[: len(here.split(".")) - node.level + (1 if is_package else 0)]
        base = ".".join([*parent, base] if base else parent)
    if base.split(".")[0] != "imexctl":
        return
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        yield sub if sub in known else base


def _graph() -> dict[str, set[str]]:
    known = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        graph[name] = {t for n in ast.walk(tree) for t in _targets(n, name, is_package, known) if t != name}
    return graph


def _folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else ""


def test_every_folder_has_a_layer() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert folders == set(LAYERS) | set(APART)


def test_the_top_level_holds_only_the_entry_points() -> None:
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py", "__main__.py"]


def _allowed(module: str, target: str) -> bool:
    here, there = _folder(module), _folder(target)
    if target == "imexctl":
        return True  # the version
    if here in APART or there in APART:
        return here == there
    if not here:
        return (module, target) == ("imexctl.__main__", "imexctl.cli")
    return LAYERS.index(there) <= LAYERS.index(here)


def test_imports_run_downward() -> None:
    wrong = sorted(f"{m} -> {t}" for m, targets in _graph().items() for t in targets if not _allowed(m, t))
    assert not wrong, "imports against the layers (docs/design.md):\n" + "\n".join(wrong)


def _cycle_from(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    """A path start -> ... -> start, if there is one."""
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_no_import_cycle() -> None:
    graph = _graph()
    cycles = {" -> ".join(c) for m in graph if (c := _cycle_from(m, graph))}
    assert not cycles, "import cycles:\n" + "\n".join(sorted(cycles))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from imexctl.hooks import prolog", {"imexctl.hooks.prolog"}),
        ("def f():\n    from imexctl.platform.errors import ConfigError", {"imexctl.platform.errors"}),
        ("if TYPE_CHECKING:\n    from imexctl.config import settings", {"imexctl.config.settings"}),
        ("import imexctl.cli", {"imexctl.cli"}),
        ("from . import gate", {"imexctl.hooks.gate"}),
        ("from imexctl import __version__", {"imexctl"}),
    ],
)
def test_the_scan_sees_every_kind_of_import(source: str, expected: set[str]) -> None:
    known = _modules()
    tree = ast.parse(source)
    found = {t for n in ast.walk(tree) for t in _targets(n, "imexctl.hooks.entry", False, known)}
    assert found == expected
