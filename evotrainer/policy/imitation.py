"""Which tokens a step imitates (``guided_imitation``): the accepted calls of guided episodes.

A guided episode's calls are decoded under the environment's call grammar (``guided_call_share``,
``guided_plan_share``), so they have the form the free policy lacks. The policy gradient learns from
them only through their advantage, and a group whose members all earn the same reward (every group,
under a resolution-only reward the policy cannot reach) gives them none. Imitation adds a
behaviour-cloning term on the calls the environment accepted, whatever their reward: rejection
sampling's filter (keep what passed the check) applied to the guided samples, as in rejection-sampling
fine-tuning (RFT; Yuan et al., 2023) and expert iteration (Anthony et al., 2017). Refused calls (an
edit whose old text the file lacks) and the free members are never imitated.
"""

from __future__ import annotations

from typing import Sequence

from evotrainer.records.rollout import Rollout


def accepted(call: object) -> bool:
    """A call record the environment took: a known tool with arguments it accepted (``error`` None)."""
    return isinstance(call, dict) and bool(call.get("name")) and call.get("error") is None


def imitation_mask(r: Rollout) -> list[int]:
    """1 on each sampled token of the turns of a guided episode whose call the environment accepted,
    0 elsewhere (the length of ``r.completion_ids``). All 0 for a free episode or a single-turn rollout."""
    mask = [0] * len(r.completion_ids)
    if not (r.episode or {}).get("guided"):
        return mask
    sampled = r.sampled_mask()
    for turn in r.turn_log:
        span = turn.get("span") if isinstance(turn, dict) else None
        if not (isinstance(span, (list, tuple)) and len(span) == 2 and accepted(turn.get("tool_call"))):
            continue
        start, end = max(0, int(span[0])), min(len(mask), int(span[1]))
        for i in range(start, end):
            mask[i] = sampled[i]
    return mask


def to_imitate(rollouts: Sequence[Rollout]) -> list[Rollout]:
    """The rollouts with at least one token to imitate, in order."""
    return [r for r in rollouts if any(imitation_mask(r))]
