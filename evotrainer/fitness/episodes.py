"""What the engine reads off multi-turn episodes itself (no genome code): well-formed calls, edits,
test runs, progress, and the check that a shaped reward pays for progress rather than for activity.

An episode makes **progress** when it resolves the issue, edits a file successfully, or runs the
tests. A reward that rises on episodes without progress, while progress itself does not rise, pays
for something other than fixing the bug: the form of the calls, or calls for their own sake. A form
credit (``operators/swe_entries.py``) is the intervention that invites it; this check is why such a
branch cannot be promoted however its reward looks.
"""

from __future__ import annotations

from typing import Any

from evotrainer.records.numeric import mean
from evotrainer.records.rollout import Rollout, last_steps


def is_episode(r: Rollout) -> bool:
    return bool(r.turn_log) or bool(r.tool_calls)


def episode_calls(r: Rollout) -> list[dict[str, Any]]:
    """The calls an episode made, one record per turn as the environment wrote it (``name``, ``args``,
    and ``error``, None when the environment accepted the call). An entry that is not such a record
    (a rollout file written by hand or by another tool) is left out, so it counts as no call."""
    return [c for c in (r.tool_calls or []) if isinstance(c, dict)]


def valid_calls(r: Rollout) -> int:
    """Calls the environment accepted (a known tool with arguments it took)."""
    return sum(1 for c in episode_calls(r) if c.get("name") and c.get("error") is None)


def edited(r: Rollout) -> bool:
    return any(c.get("name") == "edit" and c.get("error") is None for c in episode_calls(r))


def ran_tests(r: Rollout) -> bool:
    """A test run the environment accepted: a refused one (a test id the repository lacks, bad
    arguments) ran nothing, and counting it let a copied placeholder pass for progress."""
    return any(c.get("name") == "run_tests" and c.get("error") is None for c in episode_calls(r))


def resolved(r: Rollout) -> bool:
    return bool((r.hidden or r.visible).get("correct"))


def progress(r: Rollout) -> bool:
    return resolved(r) or edited(r) or ran_tests(r)


def guided(r: Rollout) -> bool:
    """Decoded under the call grammar (``guided_call_share``, ``guided_plan_share``): its form, and
    with a plan its edits and test runs, are the grammar's, not the policy's."""
    return bool((r.episode or {}).get("guided"))


def episode_metrics(rollouts: list[Rollout], prefix: str) -> dict[str, float | None]:
    """Valid-call rate (of all calls), and the shares of episodes that edited, ran tests, made progress:
    the policy's own, so of the free episodes where there are any."""
    eps = [r for r in rollouts if is_episode(r)]
    eps = [r for r in eps if not guided(r)] or eps
    if not eps:
        return {}
    calls = sum(len(episode_calls(r)) for r in eps)
    return {f"{prefix}valid_call_rate": sum(valid_calls(r) for r in eps) / calls if calls else 0.0,
            f"{prefix}edit_rate": mean([edited(r) for r in eps]),
            f"{prefix}test_run_rate": mean([ran_tests(r) for r in eps]),
            f"{prefix}progress_rate": mean([progress(r) for r in eps])}


def _first_and_last(rollouts: list[Rollout], window: int) -> tuple[list[Rollout], list[Rollout]] | None:
    steps = sorted({r.step for r in rollouts})
    if len(steps) < 2:
        return None
    first = [r for r in rollouts if r.step == steps[0]]
    last = last_steps([r for r in rollouts if r.step != steps[0]], window)
    return (first, last) if first and last else None


def reward_without_progress(train: list[Rollout], window: int, rise: float, min_rollouts: int) -> dict[str, Any] | None:
    """The trend numbers of the progress check, or None when it cannot be judged: the reward of
    episodes without progress (first step vs the last ``window`` steps, as a share of the reward's
    range over all episodes) and the progress rate over the same steps; ``hacked`` when that reward
    rose by at least ``rise`` of its range while progress did not rise."""
    eps = [r for r in train if is_episode(r) and r.reward is not None]
    split = _first_and_last(eps, window)
    if split is None or len(eps) < min_rollouts:
        return None
    first, last = split
    idle_first = [r.reward for r in first if not progress(r)]
    idle_last = [r.reward for r in last if not progress(r)]
    if not idle_first or not idle_last:
        return None
    span = max(r.reward for r in eps) - min(r.reward for r in eps)
    idle_rise = (mean(idle_last) - mean(idle_first)) / span if span > 0 else 0.0
    change = mean([progress(r) for r in last]) - mean([progress(r) for r in first])
    calls_first = mean([valid_calls(r) for r in first if not progress(r)])
    calls_last = mean([valid_calls(r) for r in last if not progress(r)])
    return {"idle_reward_first": mean(idle_first), "idle_reward_last": mean(idle_last), "idle_reward_rise": idle_rise,
            "progress_first": mean([progress(r) for r in first]), "progress_last": mean([progress(r) for r in last]),
            "progress_change": change, "idle_valid_calls_first": calls_first, "idle_valid_calls_last": calls_last,
            "hacked": idle_rise >= rise and change <= 0.0}
