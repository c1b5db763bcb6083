"""Scoring rollouts by the engine's verdict: the fitness (held-out accuracy) and per-task scores.

The verdict is the hidden outcome for held-out and test rollouts (engine-only verification) and
the verifier's visible outcome for train rollouts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from evotrainer.records.rollout import Rollout


def correct(r: Rollout) -> bool:
    """The engine's verdict of one rollout."""
    return bool((r.hidden or r.visible).get("correct"))


def heldout_accuracy(rollouts: Sequence[Rollout]) -> float:
    """Share of rollouts verified correct: the fitness of a version when given its held-out rollouts."""
    return sum(correct(r) for r in rollouts) / len(rollouts) if rollouts else 0.0


def task_scores(rollouts: Sequence[Rollout], score: Callable[[Rollout], float] = correct) -> dict[str, dict[int, float]]:
    """task id -> {sampling seed: ``score`` (1.0 correct / 0.0 wrong by default)}: the input of every
    paired comparison."""
    scores: dict[str, dict[int, float]] = {}
    for r in rollouts:
        scores.setdefault(r.task_id, {})[r.seed] = float(score(r))
    return scores


def by_seed(scores: dict[str, dict[int, float]]) -> dict[str, list[float]]:
    """Per-task score lists ordered by seed, so two sides sampled with the same seeds pair up."""
    return {t: [s[k] for k in sorted(s, key=str)] for t, s in scores.items()}
