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


def heldout_draws(tasks: Sequence[Task], selection_share: float, seed: int) -> tuple[list[Task], list[Task]]:
    """(gate draw, selection draw): two disjoint, seeded parts of the held-out pool.

    The gate draw decides promotions (a child against its control, paired on the same tasks) and
    tests reverts; the selection draw ranks versions (survivors, parents, the final pick, the revert's
    choice of ancestor). A choice made on one draw is then tested on tasks it never saw. The split is
    a function of the task ids and the seed only, so a resumed run (and every generation) draws the
    same two sets whatever the order the domain lists its tasks in.
    """
    if not 0.0 < selection_share < 1.0:
        raise ValueError(f"selection_share must be in (0, 1), got {selection_share}")
    if len(tasks) < 2:
        raise ValueError(f"{len(tasks)} held-out task(s): gating and selection need at least one each; "
                         "raise domain.n_heldout (or train.eval_size)")
    order = sorted(tasks, key=lambda t: t.id)
    random.Random(seed * 7919 + 17).shuffle(order)
    n_sel = min(len(order) - 1, max(1, round(selection_share * len(order))))
    selection = {t.id for t in order[:n_sel]}
    return [t for t in tasks if t.id not in selection], [t for t in tasks if t.id in selection]
