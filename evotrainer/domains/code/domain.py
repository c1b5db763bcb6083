"""CodeDomain: generated function tasks, HumanEval, or user files, graded by the sandboxed executor.

Difficulty levels: 1-3 are generated function tasks (``generated.py``), 4 is HumanEval; a mix takes
each level's share of every split. ``files={"train": path, ...}`` loads APPS/TACO/CodeContests or
LiveCodeBench JSONL instead (a missing ``heldout`` is carved out of train; shared questions between
splits are an error, as in math).

Verdicts. ``verify(task, completion)`` is what the engine stores for a rollout: on a *train* task
only the visible tests run (``correct`` = all visible pass), so nothing of the hidden tests can
reach a harness; on a held-out or test task the hidden tests run (``correct`` = all hidden pass)
and the visible ones too, for the hack checks that compare both. ``verify_full`` returns both
outcomes and is what ``evotrainer domain verify`` prints. Neither raises on any completion.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evotrainer.domains.code.executor import ExecLimits, ExecResult, Program
from evotrainer.domains.code.generated import make_splits
from evotrainer.domains.code.hacks import hardcoded_flag, static_flags
from evotrainer.domains.code.humaneval import DIFFICULTY as HUMANEVAL_LEVEL, humaneval_splits
from evotrainer.domains.code.loaders import load_code_tasks
from evotrainer.domains.code.parsing import extract_program
from evotrainer.domains.code.sandboxed import SandboxedDomain
from evotrainer.domains.file_splits import splits_from_files
from evotrainer.domains.task import SPLITS, Task, text_key

LEVELS = (1, 2, 3, HUMANEVAL_LEVEL)
DEFAULT_SIZES = {"train": 128, "heldout": 32, "test": 32}
HELDOUT_SHARE = 0.1


def _levels(difficulty: int | Sequence[int]) -> list[int]:
    levels = [difficulty] if isinstance(difficulty, int) else list(difficulty)
    if not levels:
        raise ValueError("code difficulty must be a level or a non-empty list of levels")
    for lvl in levels:
        if lvl not in LEVELS:
            raise ValueError(f"code difficulty must be in {LEVELS} (1-3 generated, 4 HumanEval), got {lvl!r}")
    return levels


class CodeDomain(SandboxedDomain):
    name = "code"

    def __init__(self, n_train: int | None = None, n_heldout: int | None = None, n_test: int | None = None,
                 difficulty: int | Sequence[int] = (1,), seed: int = 0, leak_share: float = 0.0,
                 files: dict[str, str | Path] | None = None, format: str = "auto", workers: int | None = None,
                 limits: ExecLimits | None = None) -> None:
        if leak_share:
            raise ValueError("leak_share plants answers in math prompts only; set domain.leak_share to 0 for code")
        self.seed, self.difficulty = seed, difficulty
        super().__init__(workers, limits)
        sizes = {"train": n_train, "heldout": n_heldout, "test": n_test}
        self._splits = self._from_files(files, sizes, format) if files else self._generate(sizes)

    # -- tasks ---------------------------------------------------------------------------------
    def _generate(self, sizes: dict[str, int | None]) -> dict[str, list[Task]]:
        levels = _levels(self.difficulty)
        share = levels.count(HUMANEVAL_LEVEL) / len(levels)
        if share == 1.0:
            return humaneval_splits(sizes, self.seed)
        n = {s: DEFAULT_SIZES[s] if k is None else k for s, k in sizes.items()}
        n_he = {s: round(k * share) for s, k in n.items()}
        gen = make_splits(*(n[s] - n_he[s] for s in SPLITS), [lv for lv in levels if lv != HUMANEVAL_LEVEL], self.seed)
        if not share:
            return gen
        he = humaneval_splits(n_he, self.seed)
        return {s: gen[s] + he[s] for s in SPLITS}

    def _from_files(self, files: dict[str, str | Path], sizes: dict[str, int | None], fmt: str) -> dict[str, list[Task]]:
        rng = random.Random(f"evotrainer-code-files-{self.seed}")
        splits = splits_from_files(files, sizes, lambda path, split: load_code_tasks(path, split, fmt), rng,
                                   HELDOUT_SHARE)
        owner: dict[str, str] = {}
        for s in SPLITS:
            for t in splits[s]:
                key = text_key(t.prompt)
                if owner.get(key, s) != s:
                    raise ValueError(f"code files overlap: task {t.id!r} of {s} has the same problem as a task "
                                     f"of {owner[key]}; remove it from one split")
                owner.setdefault(key, s)
        return splits

    def tasks(self, split: str) -> list[Task]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return list(self._splits[split])

    # -- grading -------------------------------------------------------------------------------
    def reference_completion(self, task: Task) -> str | None:
        """The reference solution in the fenced block the prompt asks for (None without one)."""
        return f"```python\n{task.answer.strip()}\n```" if task.answer.strip() else None

    def verify_batch(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[dict[str, Any]]:
        if len(tasks) != len(completions):
            raise ValueError(f"{self.name}: {len(tasks)} tasks but {len(completions)} completions")
        full = self._grade(tasks, completions, hidden=[t.split != "train" for t in tasks])
        return [f["hidden"] if t.split != "train" else f["visible"] for t, f in zip(tasks, full)]

    def verify_full(self, task: Task, completion: str) -> dict[str, Any]:
        """Both outcomes, per-test verdicts and tamper flags (what ``evotrainer domain verify`` prints)."""
        return self._grade([task], [completion], hidden=[True])[0]

    def _grade(self, tasks: Sequence[Task], completions: Sequence[str], hidden: Sequence[bool]) -> list[dict[str, Any]]:
        parsed = [extract_program(c, t.visible) for t, c in zip(tasks, completions)]
        programs, owners = [], []
        for i, (t, (src, _)) in enumerate(zip(tasks, parsed)):
            programs.append(_program(t, src, t.visible["tests"]))
            owners.append((i, "visible"))
            if hidden[i]:
                programs.append(_program(t, src, t.hidden["tests"]))
                owners.append((i, "hidden"))
        results: dict[tuple[int, str], ExecResult] = dict(zip(owners, self.executor.run(programs)))
        out = []
        for i, (t, (src, method)) in enumerate(zip(tasks, parsed)):
            kind = t.visible.get("kind", "function")
            static = static_flags(src, kind) if src else []
            vis = results[(i, "visible")]
            entry: dict[str, Any] = {"method": method, "format_ok": method == "fenced" and bool(src.strip()),
                                     "program": src}
            entry["visible"] = _outcome(vis, method, static + vis.flags)
            if hidden[i]:
                hid = results[(i, "hidden")]
                flags = static + vis.flags + hid.flags
                hard = hardcoded_flag(src, t.visible["tests"], vis.all_passed, hid.all_passed)
                flags += [hard] if hard else []
                entry["hidden"] = _outcome(hid, method, flags)
                entry["hidden"]["visible_correct"] = vis.all_passed
            entry["tamper"] = entry.get("hidden", entry["visible"])["tamper"]
            out.append(entry)
        return out


def _program(task: Task, source: str, tests: Sequence[Any]) -> Program:
    if task.visible.get("kind") == "stdio":
        return Program(source, "stdio", tuple(tests))
    return Program(source, "function", tuple({"code": c} for c in tests), task.visible["entry"],
                   task.hidden.get("preamble", ""))


def _outcome(result: ExecResult, method: str, flags: list[str]) -> dict[str, Any]:
    verdicts = [v["verdict"] for v in result.verdicts]
    total = len(verdicts)
    return {"correct": result.all_passed, "format_ok": method == "fenced", "method": method,
            "passed": result.passed, "total": total, "pass_rate": result.passed / total if total else 0.0,
            "verdicts": verdicts, "errors": [v.get("error", "") for v in result.verdicts],
            "tamper": list(dict.fromkeys(flags))}
