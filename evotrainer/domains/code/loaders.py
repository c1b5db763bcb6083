"""Loaders for user code datasets in JSONL: APPS/TACO/CodeContests and LiveCodeBench layouts.

- APPS/TACO/CodeContests: ``{"question": ..., "input_output": {"inputs": [...], "outputs": [...],
  "fn_name": optional}}`` (``input_output`` may be a JSON string, as APPS stores it). Without
  ``fn_name`` a test is a stdin/stdout pair; with it, ``inputs[i]`` is the argument list of a call
  and ``outputs[i]`` its expected value (APPS wraps it in a one-element list; both are accepted).
  Tests are split into visible and hidden (``tasks.split_tests``).
- LiveCodeBench: ``{"question_content": ..., "public_test_cases": [...], "private_test_cases": [...],
  "metadata": {"func_name": ...}}`` (lists and objects may be JSON strings). Each case has
  ``input``, ``output`` and ``testtype`` ("stdin" or "functional": one JSON argument per line).
  Public cases are the visible tests, private ones the hidden tests. Compressed private cases (the
  pickled form of some releases) are refused: a dataset file is never unpickled.

A malformed line raises ``TaskFormatError`` naming the file, the line and what is wrong.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evotrainer.domains.code.tasks import function_task, split_tests, stdio_task
from evotrainer.domains.task import Task

FORMATS = ("apps", "livecodebench")
DIFFICULTY_NAMES = {"introductory": 1, "easy": 1, "interview": 2, "medium": 2, "competition": 3, "hard": 3}


class TaskFormatError(ValueError):
    """A dataset line that cannot become a task (names file, line and what is wrong)."""

    def __init__(self, path: str | Path, lineno: int, problem: str) -> None:
        self.path, self.lineno, self.problem = str(path), lineno, problem
        super().__init__(f"{path}:{lineno}: {problem}")


def _records(path: Path):
    if not path.is_file():
        raise FileNotFoundError(f"code dataset file not found: {path}")
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise TaskFormatError(path, lineno, f"invalid JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise TaskFormatError(path, lineno, f"expected a JSON object, got {type(rec).__name__}")
            yield lineno, rec


def _json_field(path: Path, lineno: int, rec: dict, key: str, want: type, default: Any = None) -> Any:
    value = rec.get(key, default)
    if isinstance(value, str) and want is not str:
        try:
            value = json.loads(value) if value.strip() else default
        except json.JSONDecodeError:
            raise TaskFormatError(path, lineno, f"field {key!r} is a string but not JSON (compressed or "
                                                f"pickled test cases are not read; decompress them to JSON)") from None
    if value is None or not isinstance(value, want):
        raise TaskFormatError(path, lineno, f"field {key!r} must be a {want.__name__}, got {type(value).__name__}")
    return value


def _difficulty(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return DIFFICULTY_NAMES.get(str(value).strip().lower(), 0)


def _text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def _call_test(args: Any, expected: Any) -> str:
    """A data-driven call test; ``_same`` (the checker's) treats tuples as lists and floats closely."""
    return (f"_r = candidate(*{args!r})\n"
            f"assert _same(_r, {expected!r}) or (isinstance({expected!r}, list) and len({expected!r}) == 1 "
            f"and _same(_r, {expected!r}[0]))")


def _function_header(fn_name: str, starter: str) -> str:
    return starter.rstrip() + "\n" if starter.strip() else f"def {fn_name}(*args):\n"


def _apps_task(path: Path, lineno: int, rec: dict, split: str, index: int) -> Task:
    question = rec.get("question")
    if not isinstance(question, str) or not question.strip():
        raise TaskFormatError(path, lineno, "missing field 'question' (the problem statement)")
    io = _json_field(path, lineno, rec, "input_output", dict)
    inputs, outputs = io.get("inputs"), io.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise TaskFormatError(path, lineno, "input_output needs lists 'inputs' and 'outputs' of the same length")
    if len(inputs) < 2:
        raise TaskFormatError(path, lineno, f"{len(inputs)} test(s): need at least 2 (one visible, one hidden)")
    tid = str(rec.get("problem_id", rec.get("id", rec.get("name", f"{path.stem}-{lineno}"))))
    level = _difficulty(rec.get("difficulty", 0))
    fn_name = io.get("fn_name") or rec.get("fn_name")
    if fn_name:
        if not all(isinstance(a, list) for a in inputs):
            raise TaskFormatError(path, lineno, "with fn_name, every input must be a list of arguments")
        visible, hidden = split_tests([_call_test(a, o) for a, o in zip(inputs, outputs)])
        header = _function_header(fn_name, str(rec.get("starter_code") or ""))
        return function_task(tid, split, level, fn_name, header, visible, hidden, reference="",
                             intro=question.strip() + "\n\nComplete the following Python code.")
    cases = [{"input": _text(i), "output": _text(o)} for i, o in zip(inputs, outputs)]
    visible, hidden = split_tests(cases)
    return stdio_task(tid, split, level, question, visible, hidden)


def _lcb_cases(path: Path, lineno: int, rec: dict, key: str) -> list[dict]:
    cases = _json_field(path, lineno, rec, key, list, default=[])
    for c in cases:
        if not isinstance(c, dict) or not isinstance(c.get("input"), str) or not isinstance(c.get("output"), str):
            raise TaskFormatError(path, lineno, f"every case of {key!r} needs string 'input' and 'output'")
    return cases


def _lcb_task(path: Path, lineno: int, rec: dict, split: str, index: int) -> Task:
    question = rec.get("question_content")
    if not isinstance(question, str) or not question.strip():
        raise TaskFormatError(path, lineno, "missing field 'question_content' (the problem statement)")
    public, private = _lcb_cases(path, lineno, rec, "public_test_cases"), _lcb_cases(path, lineno, rec, "private_test_cases")
    if not public or not private:
        raise TaskFormatError(path, lineno, "needs at least one public (visible) and one private (hidden) test case")
    tid = str(rec.get("question_id", f"{path.stem}-{lineno}"))
    level = _difficulty(rec.get("difficulty", 0))
    if any(c.get("testtype") == "functional" for c in public + private):
        meta = _json_field(path, lineno, rec, "metadata", dict, default={})
        fn_name = meta.get("func_name")
        if not isinstance(fn_name, str) or not fn_name:
            raise TaskFormatError(path, lineno, "functional test cases need metadata.func_name")

        def call(c: dict) -> str:
            try:
                args = [json.loads(a) for a in c["input"].split("\n") if a.strip()]
                return _call_test(args, json.loads(c["output"]))
            except json.JSONDecodeError:
                raise TaskFormatError(path, lineno, "a functional case's input/output is not JSON") from None
        header = _function_header(fn_name, str(rec.get("starter_code") or ""))
        return function_task(tid, split, level, fn_name, header, [call(c) for c in public], [call(c) for c in private],
                             reference="", intro=question.strip() + "\n\nComplete the following Python code.")
    strip = [{"input": c["input"], "output": c["output"]} for c in public + private]
    return stdio_task(tid, split, level, question, strip[:len(public)], strip[len(public):])


def detect_format(rec: dict) -> str:
    return "livecodebench" if "question_content" in rec or "public_test_cases" in rec else "apps"


def load_code_tasks(path: str | Path, split: str, fmt: str = "auto") -> list[Task]:
    """Tasks of one split from a JSONL file (``fmt``: "apps", "livecodebench" or "auto" per line)."""
    if fmt not in FORMATS + ("auto",):
        raise ValueError(f"code dataset format must be one of {FORMATS + ('auto',)}, got {fmt!r}")
    path = Path(path)
    out, seen = [], set()
    for lineno, rec in _records(path):
        kind = detect_format(rec) if fmt == "auto" else fmt
        task = (_lcb_task if kind == "livecodebench" else _apps_task)(path, lineno, rec, split, len(out))
        if task.id in seen:
            raise TaskFormatError(path, lineno, f"duplicate task id {task.id!r}")
        seen.add(task.id)
        out.append(task)
    if not out:
        raise ValueError(f"{path}: no tasks (the file is empty)")
    return out
