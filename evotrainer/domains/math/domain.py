"""MathDomain: generated arithmetic problems or user GSM8K/MATH files, with the math verifier.

Generated (default): ``make_splits`` draws disjoint train/heldout/test splits for the requested
difficulty levels. From files: ``files={"train": path, "test": path, ...}``; a missing ``heldout``
is carved out of train (selection must never use test), and prompts shared between splits are an
error, because a train/eval overlap silently inflates every held-out score the gates rely on.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evotrainer.domains.base import Domain
from evotrainer.domains.math.loaders import load_jsonl_tasks
from evotrainer.domains.math.tasks import make_splits, plant_leak
from evotrainer.domains.math.verifier import verify_math
from evotrainer.domains.file_splits import splits_from_files
from evotrainer.domains.task import SPLITS, Task, text_key

DEFAULT_SIZES = {"train": 128, "heldout": 32, "test": 32}
DEFAULT_DIFFICULTY = (1, 2, 3)
HELDOUT_SHARE = 0.1  # of train, when files give no heldout split and n_heldout is not set


class MathDomain(Domain):
    name = "math"

    def __init__(self, n_train: int | None = None, n_heldout: int | None = None,
                 n_test: int | None = None, difficulty: int | Sequence[int] = DEFAULT_DIFFICULTY,
                 seed: int = 0, leak_share: float = 0.0,
                 files: dict[str, str | Path] | None = None, format: str = "auto") -> None:
        """Sizes default to DEFAULT_SIZES when generating; with ``files`` None means "all of the
        file" and an int takes a seeded sample of that size (file order kept)."""
        self.seed, self.leak_share = seed, leak_share
        self.difficulty = difficulty
        sizes = {"train": n_train, "heldout": n_heldout, "test": n_test}
        if files:
            self._splits = self._from_files(files, sizes, format)
        else:
            n = {s: DEFAULT_SIZES[s] if k is None else k for s, k in sizes.items()}
            self._splits = make_splits(n["train"], n["heldout"], n["test"], difficulty, seed,
                                       leak_share=leak_share)

    def tasks(self, split: str) -> list[Task]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return list(self._splits[split])

    def verify(self, task: Task, completion: str) -> dict[str, Any]:
        return verify_math(completion, task.hidden.get("answer", task.answer))

    def reference_completion(self, task: Task) -> str | None:
        """The answer after the tag the prompt asks for: ``Answer: 107``."""
        return f"Answer: {task.hidden.get('answer', task.answer)}"

    # -- user files ----------------------------------------------------------------------------

    def _from_files(self, files: dict[str, str | Path], sizes: dict[str, int | None],
                    fmt: str) -> dict[str, list[Task]]:
        rng = random.Random(f"evotrainer-math-files-{self.seed}")
        splits = splits_from_files(files, sizes, lambda path, split: load_jsonl_tasks(path, split, fmt), rng,
                                   HELDOUT_SHARE)
        _check_disjoint(splits)
        splits["train"] = plant_leak(splits["train"], self.leak_share, self.seed)
        return splits


def _check_disjoint(splits: dict[str, list[Task]]) -> None:
    """Raises ValueError if a question appears in two splits."""
    owner: dict[str, str] = {}
    for s in SPLITS:
        for t in splits[s]:
            key = text_key(t.hidden.get("question", t.prompt))
            if key in owner and owner[key] != s:
                raise ValueError(f"math files overlap: task {t.id!r} of {s} has the same question as "
                                 f"a task of {owner[key]}; remove it from one split")
            owner.setdefault(key, s)
