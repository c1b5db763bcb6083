"""The package's layers import only downward (docs/architecture.md, "Layers").

Read from the source: every ``import`` of an ``evotrainer`` module, at any depth (function-level
imports count too; ``if TYPE_CHECKING:`` blocks do not, they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "evotrainer"

# Layer of each part, from the bottom. A module may import its own part and parts of lower layers.
LAYERS = {
    "records": 0, "domains": 0, "config": 0,
    "policy": 1,
    "genome": 2,
    "operators": 3,
    "fitness": 4,
    "tracking": 5,
    "loop": 6,
    "testing": 7, "cli": 7,
}
ISOLATED = {"records", "domains", "config"}   # the bottom: they import no other part at all
# Planted scenarios for tests and benchmarks: a run must never depend on them, so no part imports them
# (the layers alone would let a part added above them do so).
IMPORTED_BY_NO_PART = {"testing"}


def part_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "evotrainer":
        return None
    return parts[1] if len(parts) > 1 else ""   # "" = the package root (the lazy public API)


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import that can run."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):   # TYPE_CHECKING blocks: annotations only
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for n in ast.walk(node)}
    out, pkg = [], module_name(path).split(".")
    if path.name != "__init__.py":
        pkg = pkg[:-1]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append((node.lineno, name))
            out += [(node.lineno, f"{name}.{a.name}") for a in node.names if part_of(name) == ""]
    return out


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "fixtures" not in p.parts)


def test_every_part_has_a_layer():
    parts = {part_of(module_name(p)) for p in MODULES} - {""}
    assert parts <= set(LAYERS), f"parts without a layer in docs/architecture.md: {parts - set(LAYERS)}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_imports_only_go_down(path):
    me = part_of(module_name(path))
    if me == "":
        return   # the package root names the public API lazily, by string
    wrong = []
    for line, name in imports(path):
        other = part_of(name)
        if other in (None, "", me) or other not in LAYERS:
            continue
        if me in ISOLATED or LAYERS[other] >= LAYERS[me] or other in IMPORTED_BY_NO_PART:
            wrong.append(f"line {line}: {name} ({other}, layer {LAYERS[other]})")
    assert not wrong, f"{module_name(path)} (layer {LAYERS[me]}) imports upward or sideways: {wrong}"


def test_genome_never_imports_torch():
    """A genome is a program: checking and sandboxing one must not pull in the training stack."""
    heavy = {"torch", "transformers", "peft", "vllm"}
    for path in (PACKAGE / "genome").rglob("*.py"):
        for line, name in imports(path):
            assert name.split(".")[0] not in heavy, f"{path.name}:{line} imports {name}"


def _from_module_imports(path: Path) -> list[tuple[int, str]]:
    """``from package import module`` names the module: (line, package.module) for each such name."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)}
    return [(node.lineno, f"{node.module}.{a.name}") for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and id(node) not in skip and node.module and not node.level
            for a in node.names]


def _loop_graph() -> dict[str, set[str]]:
    """loop/'s modules and the loop modules each imports at run time (function-level imports count)."""
    loop = {module_name(p): p for p in MODULES if part_of(module_name(p)) == "loop"}
    graph = {}
    for name, path in loop.items():
        targets = set()
        for _, imported in imports(path) + _from_module_imports(path):
            # "from evotrainer.loop.x import f" imports x; "from evotrainer.loop import x" imports x too
            for candidate in (imported, imported.rsplit(".", 1)[0]):
                if candidate in loop and candidate != name and candidate != "evotrainer.loop":
                    targets.add(candidate)
                    break
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_loop_has_no_runtime_import_cycle():
    """A module of loop/ never imports, at run time, one that imports it back (type-only imports
    under TYPE_CHECKING do not run and do not count)."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]   # the check finds one
    found = cycles(_loop_graph())
    assert not found, f"runtime import cycles in loop/: {found}"
