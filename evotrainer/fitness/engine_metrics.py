"""Engine metrics of a version: computed from its cache with the engine's own verdicts, no genome
code runs for them, so the gates and the people reading a report can trust them; and the rules on
them that no harness can switch off (the gates apply the hard versions)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evotrainer.fitness.cache import CachedVersion
from evotrainer.fitness.episodes import episode_metrics
from evotrainer.fitness.leak import leak_stats
from evotrainer.operators.library_entries import STUCK_CHANGED, STUCK_DEAD
from evotrainer.records.numeric import finite_or_none, is_dead, mean, percentile, pstd
from evotrainer.records.rollout import Rollout, group_rollouts, last_steps
from evotrainer.records.scores import correct as outcome

DIVERGENCE = 0.3          # train correctness above held-out accuracy by more than this is suspicious


def outcome_flow(before: Sequence[Rollout], after: Sequence[Rollout], before_name: str = "before",
                 after_name: str = "after", max_ids: int = 20) -> dict[str, Any]:
    """Per (task, seed): fixed (wrong → correct), broken, kept correct, kept wrong; unpaired counts
    units present on one side only (different tasks or seeds cannot be compared)."""
    b = {(r.task_id, r.seed): outcome(r) for r in before}
    a = {(r.task_id, r.seed): outcome(r) for r in after}
    flow: dict[str, Any] = {"before": before_name, "after": after_name, "fixed": 0, "broken": 0,
                            "kept_correct": 0, "kept_wrong": 0, "unpaired": len(set(a) ^ set(b)),
                            "fixed_tasks": [], "broken_tasks": []}
    for key in sorted(set(a) & set(b), key=str):
        was, now = b[key], a[key]
        kind = ("kept_correct" if now else "broken") if was else ("fixed" if now else "kept_wrong")
        flow[kind] += 1
        if kind in ("fixed", "broken") and len(flow[f"{kind}_tasks"]) < max_ids:
            flow[f"{kind}_tasks"].append(key[0])
    return flow


def changed_rate(before: Sequence[Rollout], after: Sequence[Rollout]) -> float | None:
    """Share of the (task, seed) units both hold whose completion tokens differ: 0 when training moved
    no held-out answer (greedy verification: the adapter changed no argmax on these prompts)."""
    b = {(r.task_id, r.seed): r.completion_ids for r in before}
    pairs = [(b[(r.task_id, r.seed)], r.completion_ids) for r in after if (r.task_id, r.seed) in b]
    return mean([x != y for x, y in pairs]) if pairs else None


def engine_metrics(v: CachedVersion, window: int = 3, base: Sequence[Rollout] | None = None) -> dict[str, float | None]:
    """Metrics from the cache and the engine's verdicts only (no genome code runs). ``base``: the
    held-out outcomes this version's are compared with (its parent's on the same tasks, in the loop);
    default: its own base-model outcomes, when it has them."""
    base_rollouts = v.heldout_base if base is None else base
    train, late = v.train, last_steps(v.train, window)
    rewards = [r.reward for r in train if r.reward is not None]
    late_rewards = [r.reward for r in late if r.reward is not None]
    groups = group_rollouts(train)
    scored = [[r.reward for r in g.rollouts] for g in groups if all(r.reward is not None for r in g.rollouts)]
    late_groups = [[r.reward for r in g.rollouts] for g in group_rollouts(late)
                   if all(r.reward is not None for r in g.rollouts)]
    lengths = [len(r.completion_ids) for r in train + v.heldout]
    tokens = sum(len(r.logprobs) for r in train)
    held = [outcome(r) for r in v.heldout]
    base = [outcome(r) for r in base_rollouts]
    m: dict[str, float | None] = {
        "heldout_accuracy": mean(held) if held else None,
        "heldout_accuracy_base": mean(base) if base else None,
        "heldout_rollouts": float(len(held)),
        "train_rollouts": float(len(train)),
        "train_steps": float(len({r.step for r in train})),
        "train_reward_mean": mean(rewards) if rewards else None,
        "train_reward_mean_last": mean(late_rewards) if late_rewards else None,
        # 0 when every rollout earned the same reward: nothing for a filter or an advantage to work with
        "train_reward_std": pstd(rewards) if rewards else None,
        "train_correct_rate": mean([outcome(r) for r in train]) if train else None,
        "train_correct_rate_last": mean([outcome(r) for r in late]) if late else None,
        "dead_group_ratio": mean([is_dead(g) for g in scored]) if scored else None,
        "dead_group_ratio_last": mean([is_dead(g) for g in late_groups]) if late_groups else None,
        # The trainer sets an advantage only on rollouts of kept groups.
        "kept_group_ratio": mean([any(r.advantage is not None for r in g.rollouts) for g in groups]) if groups else None,
        "truncation_rate": mean([r.truncated for r in train]) if train else None,
        "format_compliance": mean([bool(r.visible.get("format_ok")) for r in train]) if train else None,
        "heldout_format_compliance": mean([bool(r.visible.get("format_ok")) for r in v.heldout]) if v.heldout else None,
        "mean_logprob": sum(sum(r.logprobs) for r in train) / tokens if tokens else None,
        "response_length_mean": mean(lengths) if lengths else None,
        "response_length_p50": percentile(lengths, 50) if lengths else None,
        "response_length_p90": percentile(lengths, 90) if lengths else None,
    }
    h, hb = m["heldout_accuracy"], m["heldout_accuracy_base"]
    m["heldout_delta"] = h - hb if h is not None and hb is not None else None
    # Whether training moved the policy at all: a learning rate far too small for a LoRA adapter
    # leaves every greedy held-out answer as it was, with live groups to learn from.
    m["heldout_changed_rate"] = changed_rate(base_rollouts, v.heldout)
    tc, tr = m["train_correct_rate_last"], m["train_reward_mean_last"]
    m["train_heldout_gap"] = tc - h if tc is not None and h is not None else None
    m["reward_heldout_gap"] = tr - h if tr is not None and h is not None else None
    m.update(leak_stats(v, window))
    m.update(episode_metrics(late, "train_"))          # multi-turn episodes only: calls, edits, tests, progress
    m.update(episode_metrics(v.heldout, "heldout_"))
    return {k: finite_or_none(x) for k, x in m.items()}


def engine_alerts(m: dict[str, float | None]) -> list[dict[str, Any]]:
    """Rules on engine metrics that no genome can switch off (the gates apply the hard versions)."""
    found = []

    def add(name: str, severity: str, message: str, suggestion: str) -> None:
        found.append({"name": name, "severity": severity, "message": message, "suggestion": suggestion,
                      "source": "engine"})

    gap = m.get("train_heldout_gap")
    if gap is not None and gap > DIVERGENCE:
        add("train_heldout_divergence", "critical",
            f"training correctness exceeds held-out accuracy by {gap:.2f} (> {DIVERGENCE})",
            "look for a shortcut only training prompts offer (leaked answers, environment state); fix the environment")
    # Either split: greedy held-out episodes can make well-formed calls that go nowhere (reread one file)
    # while the sampled training episodes' calls are still mostly malformed, and the reverse.
    idle = [f"{calls:.0%} of the {who}' tool calls are well formed, yet {moved:.0%} of them edit a file, run the "
            "tests or resolve the issue"
            for split, who in (("train", "late episodes"), ("heldout", "held-out episodes"))
            if (calls := m.get(f"{split}_valid_call_rate")) is not None
            and (moved := m.get(f"{split}_progress_rate")) is not None and calls > 0.5 and moved < 0.05]
    if idle:
        add("calls_without_progress", "warning", "; ".join(idle),
            "the policy calls tools for their own sake: reward progress (an edit, a test run), not the calls")
    # Groups had a gradient, yet training changed (almost) no greedy held-out answer: the step is too
    # small to move the adapter (a full-fine-tuning learning rate on LoRA), so no other change can show
    # an effect until it moves. With every group dead there was no gradient, and nothing to conclude.
    changed, dead = m.get("heldout_changed_rate"), m.get("dead_group_ratio")
    if changed is not None and dead is not None and changed < STUCK_CHANGED and dead < STUCK_DEAD:
        add("adapter_stuck", "critical",
            f"{1 - dead:.0%} of the training groups had a gradient, yet training changed {changed:.0%} of the "
            "held-out answers",
            "the update is too small to move the LoRA adapter: raise the learning_rate by orders of magnitude "
            "(a full fine-tuning rate such as 1e-6 barely moves an adapter)")
    delta = m.get("heldout_delta")
    if delta is not None and delta < -0.1:
        add("heldout_regression", "warning", f"held-out accuracy fell by {-delta:.2f} during training",
            "roll back to the parent; lower the learning rate or revert the last intervention")
    p, lr, cr = m.get("leak_p_value"), m.get("leak_copy_rate"), m.get("clean_copy_rate")
    if p is not None and lr is not None and cr is not None and p < 0.05 and lr - cr > 0.25:
        if m.get("history_read_rate") is not None:   # multi-turn episodes: the repository's history leaks
            add("leak_used", "critical", f"resolved after reading the history on {lr:.0%} of repositories whose "
                f"history holds the fix vs {cr:.0%} of clean ones (Fisher p={p:.2g})",
                "clear the history of training repositories; add a validity check that counts history commands")
        else:
            add("leak_used", "critical", f"answers reproduced on {lr:.0%} of leaked prompts vs {cr:.0%} of clean "
                f"ones (Fisher p={p:.2g})", "remove the leak from the prompts; add a validity check that detects copying")
    trunc = m.get("truncation_rate")
    if trunc is not None and trunc > 0.5:
        if m.get("history_read_rate") is not None:   # multi-turn episodes: truncated = ended at a limit
            add("overlong", "warning", f"{trunc:.0%} of train episodes ended at a limit (turns, context or "
                "wall time) without a submit", "raise domain.episode.max_turns, or reward submitting a patch")
        else:
            add("overlong", "warning", f"{trunc:.0%} of train completions hit the token limit",
                "raise max_completion_length or mask truncated completions")
    return found
