"""Reference harness: the human-engineered RL recipe every experiment starts from.

GRPO advantages, clip-higher (0.2 / 0.28), no KL, temperature 1.0, group size 4, binary
correctness reward from the verifier's visible verdict, no group filtering, and a standard set of
metrics and alert rules. It is a real harness file (what evolution edits) and the fallback of every
hook a genome leaves out. Hooks see plain JSON data (see evotrainer/records/rollout.py ``for_harness``);
the engine adds ``reward`` and ``advantage`` to each rollout before ``metrics``/``validity``.

Only allow-listed modules may be imported here: this file runs inside the sandbox too. Load it
with ``evotrainer.genome.reference_program()`` (it is data to the engine, not imported).
"""

import math

# EVOLVE-BLOCK-START
KNOBS = {
    "learning_rate": {"value": 1e-04, "range": [1e-06, 1e-03], "log": True},  # LoRA-sized step
    "num_generations": {"value": 4, "choices": [2, 4, 8]},
    "temperature": {"value": 1.0, "range": [0.3, 1.5]},
    "max_completion_length": {"value": 64, "choices": [32, 64, 128, 256]},
    "epsilon": {"value": 0.2, "range": [0.05, 0.5]},
    "epsilon_high": {"value": 0.28, "range": [0.05, 0.5]},  # clip-higher (DAPO)
    "beta": {"value": 0.0, "range": [0.0, 0.2]},  # KL coefficient: no KL by default
    "loss_type": {"value": "dapo", "choices": ["grpo", "dr_grpo", "dapo", "bnpo"]},
    "scale_rewards": {"value": "group", "choices": ["group", "batch", "none"]},
    "mask_truncated_completions": {"value": False, "choices": [True, False]},
}
# EVOLVE-BLOCK-END


# ---- helpers (fixed; not evolved) -------------------------------------------------------------
def _mean(xs):
    return sum(xs) / len(xs) if xs else 0.0


def _pstd(xs):
    """Population standard deviation (what GRPO normalises by)."""
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def _sstd(xs):
    """Sample standard deviation (n - 1): what GRPO advantages divide by, as in TRL."""
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _percentile(xs, q):
    """Linear-interpolated percentile, q in [0, 100] (numpy's default method)."""
    xs = sorted(xs)
    if not xs:
        return 0.0
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _reward_of(rollout):
    """The shaped reward the engine attached, or binary correctness when called without one."""
    r = rollout.get("reward")
    return float(r) if r is not None else (1.0 if rollout["visible"].get("correct") else 0.0)


# ---- hooks -------------------------------------------------------------------------------------
# EVOLVE-BLOCK-START
def reward(rollouts, tasks):
    """Binary correctness from the verifier's visible verdict."""
    return [1.0 if r["visible"].get("correct") else 0.0 for r in rollouts]
# EVOLVE-BLOCK-END


# EVOLVE-BLOCK-START
def keep_groups(groups):
    """No filtering: every group trains, dead ones included."""
    return [True for _ in groups]
# EVOLVE-BLOCK-END


# EVOLVE-BLOCK-START
def advantages(groups, rewards):
    """GRPO: (r - group mean) / (std + 1e-4), sample std as in TRL; the scale follows KNOBS."""
    scale = KNOBS["scale_rewards"]["value"]
    batch_std = _sstd([r for rs in rewards for r in rs])
    out = []
    for rs in rewards:
        m = _mean(rs)
        std = _sstd(rs) if scale == "group" else batch_std if scale == "batch" else None
        out.append([(r - m) / (std + 1e-4) if std is not None else r - m for r in rs])
    return out
# EVOLVE-BLOCK-END


# EVOLVE-BLOCK-START
def metrics(rollouts, groups):
    """Score, signal, behaviour, efficiency and model-state metrics of one batch."""
    if not rollouts:
        return {"num_rollouts": 0.0, "num_groups": float(len(groups))}
    rewards = [_reward_of(r) for r in rollouts]
    group_stds = [_pstd([_reward_of(r) for r in g]) for g in groups if g]
    lengths = [len(r["completion_ids"]) for r in rollouts]
    out = {
        "num_rollouts": float(len(rollouts)),
        "num_groups": float(len(groups)),
        "reward_mean": _mean(rewards),
        "reward_std": _pstd(rewards),
        "correct_rate": _mean([1.0 if r["visible"].get("correct") else 0.0 for r in rollouts]),
        "format_compliance": _mean([1.0 if r["visible"].get("format_ok") else 0.0 for r in rollouts]),
        "dead_group_ratio": _mean([1.0 if s < 1e-6 else 0.0 for s in group_stds]),
        "reward_spread": _mean(group_stds),
        "response_length_p50": _percentile(lengths, 50),
        "response_length_p90": _percentile(lengths, 90),
        "truncation_rate": _mean([1.0 if r["truncated"] else 0.0 for r in rollouts]),
    }
    tokens = sum(len(r["logprobs"]) for r in rollouts)
    if tokens:  # absent rather than a misleading 0.0 when the sampler gave no logprobs
        out["mean_logprob"] = sum(sum(r["logprobs"]) for r in rollouts) / tokens
    return out
# EVOLVE-BLOCK-END


# EVOLVE-BLOCK-START
def alerts(metrics, history):
    """Rules from the field notes; each finding names a suggested intervention."""
    found = []

    def add(name, severity, message, suggestion):
        found.append({"name": name, "severity": severity, "message": message, "suggestion": suggestion})

    dead = metrics.get("dead_group_ratio")
    if dead is not None and dead > 0.3:
        add("insufficient_signal", "critical" if dead > 0.5 else "warning",
            f"{dead:.0%} of groups have no reward variance (dead groups)",
            "make the reward more continuous or add an auxiliary signal; or filter dead groups")
    spread = metrics.get("reward_spread")
    if spread is not None and spread < 0.05:
        add("weak_reward_spread", "warning", f"mean within-group reward std is {spread:.3f} (< 0.05)",
            "add a denser auxiliary reward or raise the temperature / group size")
    logprob = metrics.get("mean_logprob")
    if logprob is not None and logprob > -0.05:
        add("exploration_collapse", "critical", f"mean sampler logprob is {logprob:.3f} (> -0.05)",
            "raise the temperature or add an exploration bonus")
    elif logprob is not None and logprob > -0.1:
        add("over_confident", "info", f"mean sampler logprob is {logprob:.3f} (> -0.1)",
            "watch diversity; consider a higher temperature")
    window = list(history[-3:]) + [metrics]
    if len(window) == 4 and all("reward_mean" in m and "correct_rate" in m for m in window):
        shaped = [m["reward_mean"] for m in window]
        correct = [m["correct_rate"] for m in window]
        rising = all(b > a for a, b in zip(shaped, shaped[1:])) and shaped[-1] - shaped[0] > 0.05
        if rising and correct[-1] - correct[0] < 0.02:   # flat or falling: the reward is not paying for solving
            add("reward_hacking", "critical",
                f"shaped reward rose {shaped[0]:.3f} -> {shaped[-1]:.3f} while correctness went "
                f"{correct[0]:.3f} -> {correct[-1]:.3f}", "simplify the reward; check what the policy learned to exploit")
    return found
# EVOLVE-BLOCK-END


# EVOLVE-BLOCK-START
def select_tasks(pool, stats, step, n):
    """The engine's seeded sampler: the pool arrives shuffled for this step; train on the first n.

    ``pool``: train tasks (id, prompt, difficulty, visible fields; never answers); ``stats``: task id ->
    {"attempts", "correct"} over the lineage's recent training. A curriculum reorders by these.
    """
    return [t["id"] for t in pool[:n]]
# EVOLVE-BLOCK-END


# EVOLVE-BLOCK-START
def prompt(task):
    """The task's own prompt as one user message (the model keeps its default system prompt)."""
    return [{"role": "user", "content": task["prompt"]}]
# EVOLVE-BLOCK-END


# EVOLVE-BLOCK-START
def validity(rollouts, metrics, history):
    """No validity checks in the reference recipe: evolved diagnostics add them."""
    return []
# EVOLVE-BLOCK-END

