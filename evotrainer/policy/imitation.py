"""Which tokens a step imitates (``guided_imitation``): the accepted calls of guided episodes.

A guided episode's calls are decoded under the environment's call grammar (``guided_call_share``,
``guided_plan_share``), so they have the form the free policy lacks. The policy gradient learns from
them only through their advantage, and a group whose members all earn the same reward (every group,
under a resolution-only reward the policy cannot reach) gives them none. Imitation adds a
behaviour-cloning term on the calls the environment accepted, whatever their reward: rejection
sampling's filter (keep what passed the check) applied to the guided samples, as in rejection-sampling
fine-tuning (RFT; Yuan et al., 2023) and expert iteration (Anthony et al., 2017). Refused calls (an
edit whose old text the file lacks) and the free members are never imitated, and neither are the edits
of an episode whose patch broke a test that passed before it: the grammar makes a guided edit apply,
not keep the module working (with any line to fill, every guided edit the 135M policy wrote broke a
test), and cloning it would teach the vandalism the progress credit refuses to pay for. Only the
training-visible grade is read (``visible``), as a harness would.
"""

from __future__ import annotations

from typing import Sequence

from evotrainer.records.calls import accepted, broke_passing_tests
from evotrainer.records.rollout import Rollout


def imitation_mask(r: Rollout) -> list[int]:
    """1 on each sampled token of the turns of a guided episode whose call the environment accepted,
    0 elsewhere (the length of ``r.completion_ids``); an ``edit`` turn counts only when the episode's
    patch broke no passing test. All 0 for a free episode or a single-turn rollout."""
    mask = [0] * len(r.completion_ids)
    if not (r.episode or {}).get("guided"):
        return mask
    sampled = r.sampled_mask()
    vandal = broke_passing_tests(r.visible or {})
    for turn in r.turn_log:
        span = turn.get("span") if isinstance(turn, dict) else None
        call = turn.get("tool_call") if isinstance(turn, dict) else None
        if not (isinstance(span, (list, tuple)) and len(span) == 2 and accepted(call)):
            continue
        if vandal and call.get("name") == "edit":
            continue
        start, end = max(0, int(span[0])), min(len(mask), int(span[1]))
        for i in range(start, end):
            mask[i] = sampled[i]
    return mask


def to_imitate(rollouts: Sequence[Rollout]) -> list[Rollout]:
    """The rollouts with at least one token to imitate, in order."""
    return [r for r in rollouts if any(imitation_mask(r))]
