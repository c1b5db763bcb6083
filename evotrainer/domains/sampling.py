"""The default curriculum: a seeded, step-dependent order of the train tasks.

``seeded_order`` is what a harness's ``select_tasks`` hook receives as its pool; the reference
harness trains on its first n tasks, which is ``sample_tasks``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from evotrainer.domains.task import Task


def seeded_order(tasks: Sequence[Task], n: int, step: int, seed: int) -> list[Task]:
    """All tasks, in the order step ``step`` of a run with ``n`` tasks per step takes them: one
    seeded shuffle per epoch, rotated to where this step starts (so epochs cover every task)."""
    if not tasks:
        raise ValueError("no tasks to sample from")
    n = min(n, len(tasks))
    epoch, start = divmod(step * n, len(tasks))
    order = list(tasks)
    random.Random(seed * 9973 + epoch).shuffle(order)
    return order[start:] + order[:start]


def sample_tasks(tasks: Sequence[Task], n: int, step: int, seed: int) -> list[Task]:
    """A seeded, step-dependent batch of tasks (epochs reshuffle; no task twice in one batch)."""
    return seeded_order(tasks, n, step, seed)[: min(n, len(tasks))]
