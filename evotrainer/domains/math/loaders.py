"""Loaders for user math datasets in JSONL: GSM8K, MATH, and plain prompt/answer records.

- GSM8K: ``{"question": ..., "answer": "...reasoning...\\n#### 72"}``; the final answer is the text
  after the last ``####`` (thousands commas removed).
- MATH: ``{"problem": ..., "solution": "... \\boxed{\\frac{1}{2}} ..."}``; the final answer is the
  content of the last ``\\boxed{}`` (nested braces handled). A ``level`` field ("Level 3") becomes
  the task difficulty.
- plain: ``{"prompt": ..., "answer": ...}`` (already-prepared tasks).

A malformed line raises ``TaskFormatError`` naming the file, the line number and what is missing,
so a user can fix the file instead of training on silently dropped or mislabelled tasks.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from evotrainer.domains.math.tasks import ANSWER_INSTRUCTION, DOMAIN
from evotrainer.domains.math.verifier import last_boxed
from evotrainer.domains.task import SPLITS, Task

# MATH answers are LaTeX expressions, so the number-only instruction would be wrong for them.
LATEX_INSTRUCTION = "Give the final answer after 'Answer:' or in \\boxed{}."

FORMATS = ("gsm8k", "math", "plain")
_FIELDS = {"gsm8k": ("question", "answer"), "math": ("problem", "solution"),
           "plain": ("prompt", "answer")}


class TaskFormatError(ValueError):
    """A dataset line that cannot become a task (names file, line and what is wrong)."""

    def __init__(self, path: str | Path, lineno: int, problem: str) -> None:
        self.path, self.lineno, self.problem = str(path), lineno, problem
        super().__init__(f"{path}:{lineno}: {problem}")


def _records(path: str | Path):
    """(lineno, record) for each non-blank line; bad JSON or a non-object is a TaskFormatError."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"math dataset file not found: {path}")
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise TaskFormatError(path, lineno, f"invalid JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise TaskFormatError(path, lineno, f"expected a JSON object, got "
                                                    f"{type(rec).__name__}")
            yield lineno, rec


def _require(path: Path, lineno: int, rec: dict, fmt: str) -> None:
    missing = [k for k in _FIELDS[fmt] if not isinstance(rec.get(k), str) or not rec[k].strip()]
    if missing:
        raise TaskFormatError(path, lineno, f"{fmt} record is missing field(s) "
                                            f"{', '.join(repr(m) for m in missing)} "
                                            f"(need {', '.join(_FIELDS[fmt])})")


def gsm8k_final_answer(answer: str) -> str | None:
    """The text after the last '####', without thousands commas; None if there is no marker."""
    if "####" not in answer:
        return None
    final = answer.rsplit("####", 1)[1].strip()
    return re.sub(r"(?<=\d),(?=\d{3})", "", final) or None


def math_final_answer(solution: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}); None if there is none."""
    boxed = last_boxed(solution)
    return boxed or None


def _make_task(path: Path, lineno: int, rec: dict, fmt: str, split: str,
               instruction: str | None) -> Task:
    _require(path, lineno, rec, fmt)
    difficulty = 0
    if fmt == "gsm8k":
        question, solution = rec["question"], rec["answer"]
        answer = gsm8k_final_answer(solution)
        if answer is None:
            raise TaskFormatError(path, lineno, "GSM8K 'answer' has no final '#### <answer>' line")
    elif fmt == "math":
        question, solution = rec["problem"], rec["solution"]
        answer = math_final_answer(solution)
        if answer is None:
            raise TaskFormatError(path, lineno, "MATH 'solution' has no closed \\boxed{...} answer")
        m = re.search(r"\d+", str(rec.get("level", "")))
        difficulty = int(m.group()) if m else 0
    else:
        question, solution, answer = rec["prompt"], None, rec["answer"].strip()
        if isinstance(rec.get("difficulty"), int):
            difficulty = rec["difficulty"]
    if instruction is None:
        instruction = LATEX_INSTRUCTION if fmt == "math" else ANSWER_INSTRUCTION
    prompt = f"{question.strip()}\n{instruction}" if instruction else question.strip()
    # Keep a user's own id when the file has one (MATH-500 has unique_id); else file stem + line:
    # stable, traceable to the source, and independent of the split (heldout may be carved later).
    own_id = rec.get("id", rec.get("unique_id"))
    tid = str(own_id) if own_id is not None else f"{fmt}-{path.stem}-L{lineno}"
    hidden: dict[str, Any] = {"answer": answer, "question": question, "source": str(path),
                              "line": lineno, "leaked": False}
    if solution is not None:
        hidden["solution"] = solution
    return Task(id=tid, prompt=prompt, answer=answer, split=split, domain=DOMAIN,
                difficulty=difficulty, hidden=hidden)


def _detect(path: Path, lineno: int, rec: dict) -> str:
    for fmt, fields in _FIELDS.items():
        if all(k in rec for k in fields):
            return fmt
    raise TaskFormatError(path, lineno, "cannot tell the format: expected fields "
                          + " or ".join("/".join(f) for f in _FIELDS.values())
                          + f", got {sorted(rec)}")


def load_jsonl_tasks(path: str | Path, split: str, format: str = "auto",
                     instruction: str | None = None) -> list[Task]:
    """Tasks from a JSONL file. ``format``: "auto" (decided by the first record), "gsm8k",
    "math" or "plain". ``instruction`` overrides the line appended to each prompt ("" for none).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if format != "auto" and format not in FORMATS:
        raise ValueError(f"format must be 'auto' or one of {FORMATS}, got {format!r}")
    path = Path(path)
    tasks: list[Task] = []
    fmt = None if format == "auto" else format
    for lineno, rec in _records(path):
        fmt = fmt or _detect(path, lineno, rec)
        tasks.append(_make_task(path, lineno, rec, fmt, split, instruction))
    if not tasks:
        raise TaskFormatError(path, 0, "file has no tasks (empty or only blank lines)")
    first_line: dict[str, int] = {}
    for t in tasks:
        if t.id in first_line:
            raise TaskFormatError(path, t.hidden["line"], f"duplicate task id {t.id!r} "
                                  f"(first on line {first_line[t.id]})")
        first_line[t.id] = t.hidden["line"]
    return tasks


def load_gsm8k(path: str | Path, split: str, instruction: str | None = None) -> list[Task]:
    return load_jsonl_tasks(path, split, "gsm8k", instruction)


def load_math(path: str | Path, split: str, instruction: str | None = None) -> list[Task]:
    return load_jsonl_tasks(path, split, "math", instruction)
