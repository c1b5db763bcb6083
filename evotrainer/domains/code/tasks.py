"""Code tasks: how a function task or a stdin/stdout task is laid out in a ``Task``.

Every code task carries two disjoint test sets. **Visible** tests are shown in the prompt and kept in
``task.visible["tests"]`` (a harness reward may use their verdicts); **hidden** tests live in
``task.hidden["tests"]`` and only the engine grades with them. ``task.answer`` is a reference
solution (never shown: the sandbox facade strips answers and hidden data).

Function tests are assert statements over ``candidate`` (``assert candidate(2, 3) == 5``), run by the
executor's trusted checker; the prompt shows them with the function's real name. Stdin tests are
``{"input": ..., "output": ...}`` pairs.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Any

from evotrainer.domains.task import SPLITS, Task

DOMAIN = "code"
FORMAT_INSTRUCTION = "Reply with the complete function in a ```python code block."
STDIO_INSTRUCTION = "Read from standard input and write to standard output. Reply with the program in a ```python code block."


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name(self.new, node.ctx) if node.id == self.old else node


def display_test(code: str, entry: str) -> str:
    """A test as the policy sees it: ``candidate`` renamed to the function's name."""
    try:
        return ast.unparse(_Rename("candidate", entry).visit(ast.parse(code)))
    except SyntaxError:
        return code.replace("candidate", entry)


def function_task(tid: str, split: str, difficulty: int, entry: str, header: str, visible: Sequence[str],
                  hidden: Sequence[str], reference: str, preamble: str = "", context: str = "",
                  intro: str = "Complete the following Python function.") -> Task:
    """A function task. ``header`` is the signature (and docstring) shown to the policy and used to
    complete a body-only answer; ``context`` is code the solution may rely on (imports, helpers)
    and is prepended to whole-function answers; ``preamble`` is trusted checker code run before
    the tests (helpers the asserts call)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not visible or not hidden:
        raise ValueError(f"code task {tid}: needs at least one visible and one hidden test")
    shown = "\n".join(display_test(t, entry) for t in visible)
    prompt = (f"{intro}\n\n```python\n{header.rstrip()}\n```\n\nIt must pass these tests:\n```python\n{shown}\n```\n"
              f"{FORMAT_INSTRUCTION}")
    return Task(id=tid, prompt=prompt, answer=reference, split=split, domain=DOMAIN, difficulty=difficulty,
                hidden={"kind": "function", "tests": list(hidden), "preamble": preamble},
                visible={"kind": "function", "entry": entry, "header": header, "context": context,
                         "tests": list(visible)})


def stdio_task(tid: str, split: str, difficulty: int, question: str, visible: Sequence[dict[str, str]],
               hidden: Sequence[dict[str, str]], reference: str = "") -> Task:
    """A stdin/stdout task (APPS/TACO/CodeContests/LiveCodeBench style)."""
    if not visible or not hidden:
        raise ValueError(f"code task {tid}: needs at least one visible and one hidden test")
    shown = "\n\n".join(f"Input:\n{t['input'].rstrip()}\nOutput:\n{t['output'].rstrip()}" for t in visible)
    prompt = f"{question.rstrip()}\n\nExamples:\n{shown}\n\n{STDIO_INSTRUCTION}"
    return Task(id=tid, prompt=prompt, answer=reference, split=split, domain=DOMAIN, difficulty=difficulty,
                hidden={"kind": "stdio", "tests": list(hidden)},
                visible={"kind": "stdio", "entry": "", "tests": list(visible)})


def split_tests(tests: Sequence[Any], max_visible: int = 3) -> tuple[list[Any], list[Any]]:
    """(visible, hidden): about a third of the tests shown, at least one and at most ``max_visible``,
    and at least one always hidden. Needs two tests or more."""
    if len(tests) < 2:
        raise ValueError(f"need at least 2 tests to split into visible and hidden, got {len(tests)}")
    k = max(1, min(max_visible, len(tests) // 3))
    return list(tests[:k]), list(tests[k:])
