"""Engine-side hack checks on a program's source and outcome (the executor adds what it saw at run time).

These are flags for validity checks and reports; they never decide a verdict (the executor's
verdicts already fail every one of these tricks). Two kinds:

- ``static_flags``: patterns in the source that only a grader-gaming program needs: leaving the
  process (``sys.exit``/``os._exit``/raising ``SystemExit``/``KeyboardInterrupt``) in a function
  task, a class overriding ``__eq__``/``__ne__``/``__hash__``, assigning to attributes of imported
  modules or builtins, importing modules that reach the network, processes or raw memory.
- ``hardcoded_flag``: all visible tests pass, some hidden test fails, and the source holds a visible
  test's expected value or input as a literal: the program memorised the examples.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Any

from evotrainer.domains.code.parsing import parse_source

EXIT_CALLS = {"sys.exit", "exit", "quit", "os._exit", "os.abort", "os.kill"}
EXIT_EXCEPTIONS = {"SystemExit", "KeyboardInterrupt", "GeneratorExit"}
EQ_METHODS = {"__eq__", "__ne__", "__hash__"}
RISKY_IMPORTS = {"ctypes", "socket", "subprocess", "multiprocessing", "inspect", "gc", "importlib", "unittest"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _root(node: ast.AST) -> str:
    """The name an attribute/subscript chain starts from (``sys`` in ``sys.modules['x'].y``)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def static_flags(source: str, kind: str = "function") -> list[str]:
    """Tamper flags read from the source alone (a source that does not parse has none)."""
    tree = parse_source(source)
    if tree is None:
        return []
    modules = {"builtins", "__builtins__"}
    flags: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            modules |= {a.asname or a.name.split(".")[0] for a in node.names} if isinstance(node, ast.Import) else set()
            flags += [f"risky_import: {n}" for n in names if n.split(".")[0] in RISKY_IMPORTS]
        elif isinstance(node, ast.Call) and kind == "function" and _dotted(node.func) in EXIT_CALLS:
            flags.append(f"exit: calls {_dotted(node.func)}()")
        elif isinstance(node, ast.Raise) and node.exc is not None and kind == "function":
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if _dotted(exc) in EXIT_EXCEPTIONS:
                flags.append(f"exit: raises {_dotted(exc)}")
        elif isinstance(node, ast.ClassDef):
            for f in node.body:
                names = [f.name] if isinstance(f, ast.FunctionDef) else \
                    [t.id for t in f.targets if isinstance(t, ast.Name)] if isinstance(f, ast.Assign) else []
                flags += [f"eq_override: class {node.name} defines {n}" for n in names if n in EQ_METHODS]
    for node in ast.walk(tree):  # a second pass: `modules` is complete now
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else \
            node.targets if isinstance(node, ast.Delete) else []
        for t in targets:
            if isinstance(t, (ast.Attribute, ast.Subscript)) and _root(t) in modules:
                flags.append(f"monkeypatch: assigns {ast.unparse(t)[:80]}")
        if isinstance(node, ast.Call) and _dotted(node.func) in ("setattr", "delattr") and node.args:
            if _root(node.args[0]) in modules:
                flags.append(f"monkeypatch: {_dotted(node.func)}({_dotted(node.args[0])}, ...)")
    return list(dict.fromkeys(flags))


def _literals(tree: ast.AST) -> list[Any]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Constant, ast.UnaryOp, ast.List, ast.Tuple, ast.Dict, ast.Set)):
            try:
                out.append(ast.literal_eval(node))
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                pass
    return out


def _telling(value: Any) -> bool:
    """A literal that would be a coincidence in honest code (not 0, 1, True, '', [] ...)."""
    if value is None or isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return abs(value) > 2
    if isinstance(value, str):
        return len(value.strip()) > 1
    try:
        return len(value) > 0
    except TypeError:
        return False


def visible_values(visible_tests: Sequence[Any]) -> list[Any]:
    """Expected values and argument tuples of simple visible tests (``assert candidate(..) == X``),
    or the outputs of stdin tests."""
    values: list[Any] = []
    for t in visible_tests:
        if isinstance(t, dict):
            values.append(str(t.get("output", "")).strip())
            continue
        try:
            node = ast.parse(t).body[0]
        except (SyntaxError, IndexError, ValueError):
            continue
        if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.comparators) == 1:
            for side in (node.test.left, node.test.comparators[0]):
                try:
                    values.append(ast.literal_eval(side))
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    if isinstance(side, ast.Call):
                        for arg in side.args:
                            try:
                                values.append(ast.literal_eval(arg))
                            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                                pass
    return [v for v in values if _telling(v)]


def hardcoded_flag(source: str, visible_tests: Sequence[Any], visible_pass: bool, hidden_pass: bool) -> str | None:
    """A flag when the program passes what it was shown, fails what it was not, and carries the
    shown values in its source."""
    if not visible_pass or hidden_pass:
        return None
    tree = parse_source(source)
    if tree is None:
        return None
    shown = visible_values(visible_tests)
    hits = []
    for lit in _literals(tree):
        for v in shown:
            try:
                if type(lit) is type(v) and lit == v or (isinstance(lit, str) and isinstance(v, str) and lit.strip() == v):
                    hits.append(v)
            except Exception:  # noqa: BLE001 - comparing arbitrary literals must not fail a verdict
                continue
    if not hits:
        return None
    return f"hardcoded_visible: passes the visible tests, fails hidden ones, and its source holds {repr(hits[0])[:60]}"
