"""Running a repository's tests in the code domain's sandbox (one confined process per run).

The repository travels inside the program: its files are written into the process's own scratch
folder before anything of it runs, so the process reads nothing of the host (the executor's mount
namespace, uid ``nobody``, rlimits and audit hook all apply as for any policy program). Two ways:

- ``checker_program`` (generated repositories, hidden grading): each test is a call spec; the
  process only *calls* the function and returns its value as plain data, and the comparison with
  the expected value happens in the executor's trusted checker, which the process never sees. A
  patch cannot forge a pass (no ``__eq__`` object, no patched assert reaches the comparison).
- ``runner_program`` (the ``run_tests`` tool, visible tests, loaded SWE-bench instances): the tests
  themselves run inside the process, which then reports ``ok`` or the failure. This is what any
  test harness does (SWE-bench's own included) and is only as trustworthy as the test code: the
  hidden tests are restored first, but patched source code runs in the same process.

Either way, a test whose call never happened (the process died, timed out, exited) is ``not_run``
or a failure verdict, never a pass.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Any

from evotrainer.domains.code.executor import CodeExecutor, ExecResult, Program

# Runs in the sandboxed process (standard library only). FILES is prepended as a literal.
_BOOT = '''
import importlib
import importlib.util
import os
import sys

for _path, _text in FILES.items():
    _d = os.path.dirname(_path)
    if _d:
        os.makedirs(_d, exist_ok=True)
    with open(_path, "w", encoding="utf-8") as _f:
        _f.write(_text)
del _path, _text
sys.path.insert(0, os.getcwd())
if os.path.isdir("src"):   # a src/ layout: the package lives one level down
    sys.path.insert(0, os.path.join(os.getcwd(), "src"))
importlib.invalidate_caches()
'''

_CALL = '''
def call(module, func, args):
    return getattr(importlib.import_module(module), func)(*args)
'''

_RUN = '''
_LOADED = {}


def _load(path):
    if path not in _LOADED:
        name = "_test_" + path.replace("/", "_").replace(".", "_")
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        _LOADED[path] = mod
    return _LOADED[path]


def _where(e, path):
    tb, line = e.__traceback__, 0
    if tb is not None and tb.tb_next is not None:
        line = tb.tb_next.tb_lineno
    text = FILES.get(path, "").splitlines()
    return f"{path}:{line}: {text[line - 1].strip()}" if 0 < line <= len(text) else path


def run_test(test_id):
    path, _, rest = test_id.partition("::")
    names = rest.split("::") if rest else []
    try:
        mod = _load(path)
    except BaseException as e:
        return f"ERROR collecting {path}: {type(e).__name__}: {e}"
    try:
        if len(names) == 1:
            fn = getattr(mod, names[0])
            fn()
        elif len(names) == 2:
            inst = getattr(mod, names[0])(names[1]) if hasattr(getattr(mod, names[0]), "setUp") else getattr(mod, names[0])()
            setup, teardown = getattr(inst, "setUp", None), getattr(inst, "tearDown", None)
            if setup:
                setup()
            try:
                getattr(inst, names[1])()
            finally:
                if teardown:
                    teardown()
        else:
            return f"ERROR: cannot read the test id {test_id!r}"
    except AssertionError as e:
        return f"FAILED {_where(e, path)}" + (f" ({e})" if str(e) else "")
    except BaseException as e:
        return f"ERROR {_where(e, path)}: {type(e).__name__}: {e}"
    return "ok"
'''


def _source(files: dict[str, str], tail: str) -> str:
    return f"FILES = {files!r}\n" + _BOOT + tail


def checker_program(files: dict[str, str], specs: Sequence[dict[str, Any]]) -> Program:
    tests = tuple({"code": f"assert _same(candidate({s['module']!r}, {s['func']!r}, {list(s['args'])!r}), {s['want']!r})"}
                  for s in specs)
    return Program(_source(files, _CALL), "function", tests, "call")


def runner_program(files: dict[str, str], test_ids: Sequence[str]) -> Program:
    tests = tuple({"code": f"_r = candidate({tid!r})\nif _r != 'ok':\n    raise ValueError(_r)"} for tid in test_ids)
    return Program(_source(files, _RUN), "function", tests, "run_test")


def collect_tests(files: dict[str, str], errors: list[str] | None = None) -> list[str]:
    """Ids of the tests in a repository's test files (``path::func``, ``path::Class::method``),
    read from the source without running it; a file that does not parse contributes none (and a
    line to ``errors``, when given)."""
    ids: list[str] = []
    for path in sorted(files):
        name = path.rsplit("/", 1)[-1]
        if not (name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))):
            continue
        try:
            tree = ast.parse(files[path])
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:   # policy-written: never a crash
            if errors is not None:
                errors.append(f"{path}: cannot collect: {type(e).__name__}: {e}")
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                ids.append(f"{path}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                ids += [f"{path}::{node.name}::{f.name}" for f in node.body
                        if isinstance(f, ast.FunctionDef) and f.name.startswith("test")]
    return ids


def outcomes(ids: Sequence[str], result: ExecResult) -> dict[str, dict[str, str]]:
    """Per test id: ``passed`` and the verdict (``pass`` only when the test ran and passed)."""
    out = {}
    for tid, v in zip(ids, result.verdicts):
        err = v.get("error", "")
        if err.startswith("ValueError: "):
            err = err[len("ValueError: "):]
        out[tid] = {"passed": v["verdict"] == "pass", "verdict": v["verdict"], "detail": err}
    for tid in ids[len(result.verdicts):]:
        out[tid] = {"passed": False, "verdict": "not_run", "detail": "the test did not run"}
    return out


def run_many(executor: CodeExecutor, jobs: Sequence[tuple[Program, Sequence[str]]]) -> list[dict[str, dict[str, str]]]:
    """Runs programs as one batch; per program, outcomes by test id."""
    results = executor.run([p for p, _ in jobs])
    return [outcomes(ids, r) for (_, ids), r in zip(jobs, results)]
