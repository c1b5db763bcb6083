"""Splits from user task files, for every domain that loads them: the files given per split, a
held-out split carved from train when none is given, and each split cut to its configured size."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path

from evotrainer.domains.task import SPLITS, Task


def splits_from_files(files: dict[str, str | Path], sizes: dict[str, int | None], load: Callable[[str | Path, str], list[Task]],
                      rng: random.Random, heldout_share: float) -> dict[str, list[Task]]:
    """``load(path, split)`` reads one file; ``sizes[s]`` None keeps all (held-out: ``heldout_share``
    of train when carved), 0 carves no held-out split. Seeded by ``rng`` (carve first, then cut)."""
    unknown = set(files) - set(SPLITS)
    if unknown:
        raise ValueError(f"files: unknown split(s) {sorted(unknown)}; use {SPLITS}")
    splits = {s: load(files[s], s) if s in files else [] for s in SPLITS}
    if "heldout" not in files and splits["train"] and sizes["heldout"] != 0:
        n_held = sizes["heldout"] or max(1, round(heldout_share * len(splits["train"])))
        if n_held >= len(splits["train"]):
            raise ValueError(f"cannot carve {n_held} heldout tasks out of {len(splits['train'])} train tasks")
        picked = set(rng.sample(range(len(splits["train"])), n_held))
        train = splits["train"]
        splits["heldout"] = [dataclasses.replace(t, split="heldout") for i, t in enumerate(train) if i in picked]
        splits["train"] = [t for i, t in enumerate(train) if i not in picked]
    for s in SPLITS:
        k = sizes[s]
        if k is not None and k < len(splits[s]):
            keep = sorted(rng.sample(range(len(splits[s])), k))
            splits[s] = [splits[s][i] for i in keep]
    return splits
