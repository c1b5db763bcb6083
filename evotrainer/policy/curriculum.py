"""Which train tasks a step trains on: the harness's ``select_tasks`` hook, held to the engine's rules.

The hook gets the train pool in the engine's seeded order for this step (the reference harness takes
its first n: the default sampler) and per-task attempt/correct counts. The engine, not the harness,
checks the choice: every id must be a train task. An id that is not (a held-out or test task, or an
unknown one) is never trained on; the step is filled from the seeded order and the violation is
returned, for the version to record: such a branch is invalid whatever it scores.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from evotrainer.domains.sampling import seeded_order
from evotrainer.domains.task import Task
from evotrainer.records.rollout import Rollout
from evotrainer.records.scores import correct

TaskStats = dict[str, dict[str, int]]


class SelectTasksHook(Protocol):
    def select_tasks(self, pool: Sequence[Task], stats: TaskStats, step: int, n: int) -> list[str]: ...
    def uses_reference(self, hook: str) -> bool: ...


def task_stats(rollouts: Iterable[Rollout]) -> TaskStats:
    """task id -> {"attempts", "correct"} from train rollouts (the verifier's visible verdicts)."""
    stats: TaskStats = {}
    for r in rollouts:
        s = stats.setdefault(r.task_id, {"attempts": 0, "correct": 0})
        s["attempts"] += 1
        s["correct"] += int(correct(r))
    return stats


def choose_tasks(harness: SelectTasksHook | None, pool: Sequence[Task], stats: TaskStats, step: int, n: int,
                 seed: int) -> tuple[list[Task], list[str]]:
    """(the step's tasks, engine violations of the harness's choice)."""
    order = seeded_order(pool, n, step, seed)
    n = min(n, len(order))
    if harness is None or harness.uses_reference("select_tasks"):
        return order[:n], []
    ids = harness.select_tasks(order, stats, step, n)
    by_id = {t.id: t for t in pool}
    chosen, violations = [], []
    for tid in ids:
        if tid in by_id:
            chosen.append(by_id[tid])
        else:
            violations.append(f"step {step}: select_tasks chose {tid!r}, which is not a train task; "
                              "a curriculum may only pick from the train pool it is given")
    taken = {t.id for t in chosen}
    chosen += [t for t in order if t.id not in taken][: n - len(chosen)]
    return chosen, violations
