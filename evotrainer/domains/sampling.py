"""The default curriculum: a seeded, step-dependent batch of train tasks."""

from __future__ import annotations

import random
from collections.abc import Sequence

from evotrainer.domains.task import Task


def sample_tasks(tasks: Sequence[Task], n: int, step: int, seed: int) -> list[Task]:
    """A seeded, step-dependent batch of tasks (epochs reshuffle; no task twice in one batch)."""
    if not tasks:
        raise ValueError("no tasks to sample from")
    n = min(n, len(tasks))
    epoch, start = divmod(step * n, len(tasks))
    order = list(tasks)
    random.Random(seed * 9973 + epoch).shuffle(order)
    return (order[start:] + order[:start])[:n]
