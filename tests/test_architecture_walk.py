"""docs/architecture.md walks one child from proposal to promotion through the files: every step's
file exists and defines the function it names, every file of the walk is reached at run time from the
driver (loop/experiment.py) by imports, and none imports the driver back."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.test_layers import PACKAGE, _from_module_imports, imports, module_name

ROOT = PACKAGE.parent
STEP = re.compile(r"^\d+\. `([\w/]+\.py)` `([\w.]+)`", re.M)


def walk() -> list[tuple[Path, str]]:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    block = doc.split("<!-- child walk -->")[1].split("<!-- end of child walk -->")[0]
    return [(PACKAGE / f, fn) for f, fn in STEP.findall(block)]


def defines(path: Path, dotted: str) -> bool:
    tree = ast.parse(path.read_text())
    scope: list[ast.AST] = tree.body
    for part in dotted.split("."):
        found = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        if found is None:
            return False
        scope = found.body
    return True


def reached_from(start: Path) -> set[str]:
    """Modules of the package imported at run time, transitively, from ``start`` (the operator
    registry's built-ins count as imported by it: it loads them by name)."""
    from evotrainer.operators.registry import BUILTINS

    builtins = [spec.split(":")[0] for spec in BUILTINS.values()]
    by_name = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    seen, todo = set(), [module_name(start)]
    while todo:
        name = todo.pop()
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        for _, imported in imports(by_name[name]) + _from_module_imports(by_name[name]):
            todo += [imported, imported.rsplit(".", 1)[0]]
        if name == "evotrainer.operators.registry":
            todo += builtins
    return seen


def test_the_walk_names_files_and_functions_that_exist():
    steps = walk()
    assert 12 <= len(steps) <= 18, f"the walk has {len(steps)} steps; it should read in about 15"
    for path, fn in steps:
        assert path.is_file(), f"{path} (in docs/architecture.md's walk) does not exist"
        assert defines(path, fn), f"{path.relative_to(ROOT)} defines no {fn}"


def test_the_driver_reaches_every_file_of_the_walk_and_none_imports_it_back():
    driver = PACKAGE / "loop" / "experiment.py"
    reached = reached_from(driver)
    for path, _ in walk():
        name = module_name(path)
        assert name in reached, f"{name} is on the walk but the driver never imports it"
        if path != driver:
            back = {m for _, m in imports(path) + _from_module_imports(path)}
            assert "evotrainer.loop.experiment" not in back, f"{name} imports the driver back"
