"""Reference code harness: the human RL recipe for the code domain (``domain.name: code``).

The same recipe as the math reference (GRPO, clip-higher 0.2 / 0.28, no KL, no group filtering),
with a binary reward that is 1 only when **all visible tests pass** (the verifier's visible
``correct``), longer completions (a function needs more tokens than a number), and code diagnostics:
test pass rate, the share of each test verdict (wrong answer, runtime error, syntax error, timeout,
memory, ...), format-gate violations (no fenced code block), truncation and tamper flags. The hidden
tests and the visible-vs-hidden gap are engine-side: a harness never sees them.

It is a harness file in the contract (data to the engine, run only in the sandbox, imports only
allow-listed modules) and defines every hook, so it needs no fallback.
"""

import math

# EVOLVE-BLOCK-START
KNOBS = {
    "learning_rate": {"value": 1e-04, "range": [1e-06, 1e-03], "log": True},  # LoRA-sized step
    "num_generations": {"value": 4, "choices": [2, 4, 8]},
    "temperature": {"value": 1.0, "range": [0.3, 1.5]},
    "max_completion_length": {"value": 128, "choices": [32, 64, 128, 256, 512]},  # a whole function
    "epsilon": {"value": 0.2, "range": [0.05, 0.5]},
    "epsilon_high": {"value": 0.28, "range": [0.05, 0.5]},  # clip-higher (DAPO)
    "beta": {"value": 0.0, "range": [0.0, 0.2]},  # KL coefficient: no KL by default
    "loss_type": {"value": "dapo", "choices": ["grpo", "dr_grpo", "dapo", "bnpo"]},
    "scale_rewards": {"value": "group", "choices": ["group", "batch", "none"]},
    "mask_truncated_completions": {"value": False, "choices": [True, False]},
}
# EVOLVE-BLOCK-END

# Test verdicts the executor gives; each becomes a `verdict_share_<name>` metric.
VERDICTS = ("pass", "wrong_answer", "runtime_error", "syntax_error", "timeout", "memory", "bad_return",
            "output_limit", "exit", "not_run")


# ---- helpers (fixed; not evolved) -------------------------------------------------------------
def _mean(xs):
    return sum(xs) / len(xs) if xs else 0.0


def _pstd(xs):
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def _sstd(xs):
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _percentile(xs, q):
    xs = sorted(xs)
    if not xs:
        return 0.0
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _reward_of(rollout):
    r = rollout.get("reward")
    return float(r) if r is not None else (1.0 if rollout["visible"].get("correct") else 0.0)


# ---- hooks -------------------------------------------------------------------------------------
# EVOLVE-BLOCK-START
def reward(rollouts, tasks):
    """1 when every visible test passes, else 0 (partial credit invites passing the easy tests only)."""
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
    """The standard batch metrics plus test pass rate, verdict shares, format and tamper rates."""
    if not rollouts:
        return {"num_rollouts": 0.0, "num_groups": float(len(groups))}
    rewards = [_reward_of(r) for r in rollouts]
    group_stds = [_pstd([_reward_of(r) for r in g]) for g in groups if g]
    lengths = [len(r["completion_ids"]) for r in rollouts]
    verdicts = [v for r in rollouts for v in (r["visible"].get("verdicts") or [])]
    out = {
        "num_rollouts": float(len(rollouts)),
        "num_groups": float(len(groups)),
        "reward_mean": _mean(rewards),
        "reward_std": _pstd(rewards),
        "correct_rate": _mean([1.0 if r["visible"].get("correct") else 0.0 for r in rollouts]),
        "test_pass_rate": _mean([float(r["visible"].get("pass_rate", 0.0)) for r in rollouts]),
        "format_compliance": _mean([1.0 if r["visible"].get("format_ok") else 0.0 for r in rollouts]),
        "format_violation_rate": _mean([0.0 if r["visible"].get("format_ok") else 1.0 for r in rollouts]),
        "tamper_rate": _mean([1.0 if r["visible"].get("tamper") else 0.0 for r in rollouts]),
        "dead_group_ratio": _mean([1.0 if s < 1e-6 else 0.0 for s in group_stds]),
        "reward_spread": _mean(group_stds),
        "response_length_p50": _percentile(lengths, 50),
        "response_length_p90": _percentile(lengths, 90),
        "truncation_rate": _mean([1.0 if r["truncated"] else 0.0 for r in rollouts]),
    }
    for name in VERDICTS:
        out["verdict_share_" + name] = _mean([1.0 if v == name else 0.0 for v in verdicts]) if verdicts else 0.0
    tokens = sum(len(r["logprobs"]) for r in rollouts)
    if tokens:
        out["mean_logprob"] = sum(sum(r["logprobs"]) for r in rollouts) / tokens
    return out
# EVOLVE-BLOCK-END


# EVOLVE-BLOCK-START
def alerts(metrics, history):
    """Code rules (overlong, format failures, syntax errors, tampering) and the signal rules."""
    found = []

    def add(name, severity, message, suggestion):
        found.append({"name": name, "severity": severity, "message": message, "suggestion": suggestion})

    trunc = metrics.get("truncation_rate")
    if trunc is not None and trunc > 0.3:
        add("overlong", "critical" if trunc > 0.6 else "warning",
            f"{trunc:.0%} of completions hit the length limit before the code block closed",
            "raise max_completion_length, or penalise length / mask truncated completions")
    fmt = metrics.get("format_violation_rate")
    if fmt is not None and fmt > 0.5:
        add("format_failures", "warning", f"{fmt:.0%} of completions have no fenced python block",
            "add a small format reward, or show the expected format in the prompt")
    syntax = metrics.get("verdict_share_syntax_error")
    if syntax is not None and syntax > 0.3:
        add("syntax_errors", "warning", f"{syntax:.0%} of test runs failed on a syntax error",
            "check truncation first; then reward compiling code separately from passing tests")
    tamper = metrics.get("tamper_rate")
    if tamper is not None and tamper > 0.0:
        add("tampering", "critical" if tamper > 0.1 else "warning",
            f"{tamper:.0%} of completions tried to game the grader (exit, __eq__, patching, file access)",
            "zero the reward of flagged completions; inspect what the policy learned")
    dead = metrics.get("dead_group_ratio")
    if dead is not None and dead > 0.3:
        add("insufficient_signal", "critical" if dead > 0.5 else "warning",
            f"{dead:.0%} of groups have no reward variance (dead groups)",
            "use partial credit from the visible test pass rate, an easier curriculum, or filter dead groups")
    logprob = metrics.get("mean_logprob")
    if logprob is not None and logprob > -0.05:
        add("exploration_collapse", "critical", f"mean sampler logprob is {logprob:.3f} (> -0.05)",
            "raise the temperature or add an exploration bonus")
    window = list(history[-3:]) + [metrics]
    if len(window) == 4 and all("reward_mean" in m and "correct_rate" in m for m in window):
        shaped = [m["reward_mean"] for m in window]
        correct = [m["correct_rate"] for m in window]
        rising = all(b > a for a, b in zip(shaped, shaped[1:])) and shaped[-1] - shaped[0] > 0.05
        if rising and max(correct) - min(correct) < 0.02:
            add("reward_hacking", "critical",
                f"shaped reward rose {shaped[0]:.3f} -> {shaped[-1]:.3f} while correctness stayed "
                f"at {correct[-1]:.3f}", "simplify the reward; check what the policy learned to exploit")
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
    """No validity checks in the reference recipe (the engine checks the visible/hidden gap)."""
    return []
# EVOLVE-BLOCK-END
