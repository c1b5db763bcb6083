"""What the engine reads off multi-turn episodes itself (no genome code): well-formed calls, edits,
test runs, progress, and the check that a shaped reward pays for progress rather than for activity.

An episode makes **progress** when it resolves the issue, edits a file successfully, or runs the
tests. A reward that rises on episodes without progress, while progress itself does not rise, pays
for something other than fixing the bug: the form of the calls, or calls for their own sake. A form
credit (``operators/swe_entries.py``) is the intervention that invites it; this check is why such a
branch cannot be promoted however its reward looks.
"""

from __future__ import annotations

import json
from typing import Any

from evotrainer.records.calls import accepted, broke_passing_tests
from evotrainer.records.numeric import mean
from evotrainer.records.rollout import Rollout, last_steps


def is_episode(r: Rollout) -> bool:
    return bool(r.turn_log) or bool(r.tool_calls)


def graded_text(r: Rollout) -> str:
    """What the engine verified: an episode's submitted patch (``policy/episodes.py`` grades that, not
    the last turn's text), else the completion. Re-verifying the last turn of an episode that handed
    in a patch called every such version tampered with."""
    patch = (r.episode or {}).get("patch") if is_episode(r) else None
    return patch if isinstance(patch, str) else r.completion


def episode_calls(r: Rollout) -> list[dict[str, Any]]:
    """The calls an episode made, one record per turn as the environment wrote it (``name``, ``args``,
    and ``error``, None when the environment accepted the call). An entry that is not such a record
    (a rollout file written by hand or by another tool) is left out, so it counts as no call."""
    return [c for c in (r.tool_calls or []) if isinstance(c, dict)]


def repeated_calls(r: Rollout) -> int:
    """Calls that repeat an earlier call of the same episode exactly (same tool, same arguments)."""
    seen, n = set(), 0
    for c in episode_calls(r):
        key = (c.get("name"), json.dumps(c.get("args"), sort_keys=True, default=str))
        n += key in seen
        seen.add(key)
    return n


def valid_calls(r: Rollout) -> int:
    """Calls the environment accepted (a known tool with arguments it took)."""
    return sum(1 for c in episode_calls(r) if accepted(c))


def edited(r: Rollout) -> bool:
    return any(c.get("name") == "edit" and c.get("error") is None for c in episode_calls(r))


def ran_tests(r: Rollout) -> bool:
    """A test run the environment accepted: a refused one (a test id the repository lacks, bad
    arguments) ran nothing, and counting it let a copied placeholder pass for progress."""
    return any(c.get("name") == "run_tests" and c.get("error") is None for c in episode_calls(r))


def resolved(r: Rollout) -> bool:
    return bool((r.hidden or r.visible).get("correct"))


def broke_tests(r: Rollout) -> bool:
    """Its handed-in patch applied and a test that passed before it (PASS_TO_PASS) fails after: the
    vandalism a credit for any applied edit taught (a function's ``def`` line replaced by ``...``)."""
    return broke_passing_tests(r.hidden or r.visible)


def progress(r: Rollout) -> bool:
    return resolved(r) or edited(r) or ran_tests(r)


def working_call_share(r: Rollout) -> float:
    """The share of an episode's working calls (every call but ``submit``) that the environment
    accepted; 0 for an episode that made none. What the gate reads when nothing is resolved on either
    side (``fitness/gates.py``): a submit-only episode makes one call, accepted, and scores 0 here,
    because handing in nothing is not a step toward a fix."""
    working = [c for c in episode_calls(r) if c.get("name") != "submit"]
    return sum(1 for c in working if accepted(c)) / len(working) if working else 0.0


def working_call_rate(rollouts: list[Rollout]) -> float | None:
    """The mean working-call share of the episodes among ``rollouts``; None when there are none (a
    single-turn domain): how the loop breaks a tie in held-out accuracy (``loop/stages/selection.py``)."""
    eps = [r for r in rollouts if is_episode(r)]
    return mean([working_call_share(r) for r in eps]) if eps else None


def guided(r: Rollout) -> bool:
    """Decoded under the call grammar (``guided_call_share``, ``guided_plan_share``): its form, and
    with a plan its edits and test runs, are the grammar's, not the policy's."""
    return bool((r.episode or {}).get("guided"))


def episode_metrics(rollouts: list[Rollout], prefix: str) -> dict[str, float | None]:
    """Valid-call and repeated-call rates (of all calls), and the shares of episodes that edited, ran
    tests, made progress: the policy's own, so of the free episodes where there are any; the share of
    all episodes whose issue quotes an editable line (``quoted_line_rate``); and, when some
    were guided, the share of the guided ones that made progress (``guided_progress_rate``) and that
    handed in a patch breaking a test that passed before (``guided_breaking_rate``: what the guided
    edits write)."""
    episodes = [r for r in rollouts if is_episode(r)]
    steered = [r for r in episodes if guided(r)]
    eps = [r for r in episodes if not guided(r)] or episodes
    if not eps:
        return {}
    calls = sum(len(episode_calls(r)) for r in eps)
    out = {f"{prefix}valid_call_rate": sum(valid_calls(r) for r in eps) / calls if calls else 0.0,
           # the echo trap: calls that repeat one the episode already made, the same tool and arguments
           f"{prefix}repeat_call_rate": sum(repeated_calls(r) for r in eps) / calls if calls else 0.0,
           f"{prefix}edit_rate": mean([edited(r) for r in eps]),
           f"{prefix}test_run_rate": mean([ran_tests(r) for r in eps]),
           f"{prefix}progress_rate": mean([progress(r) for r in eps]),
           # issues that quote a line a one-token edit can change (a level-0 rung): where `quoted` guided
           # edits differ from `token` ones; of all episodes, guided or not (it is the tasks', not the policy's)
           f"{prefix}quoted_line_rate": mean([bool((r.episode or {}).get("quotes_line")) for r in episodes])}
    if steered:   # what guidance (a plan) makes happen: progress a reward may or may not pay for
        out[f"{prefix}guided_progress_rate"] = mean([progress(r) for r in steered])
        out[f"{prefix}guided_breaking_rate"] = mean([broke_tests(r) for r in steered])
    return out


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
