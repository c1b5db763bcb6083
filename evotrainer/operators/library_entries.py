"""The entries of the intervention library (``library_entry.py`` defines what an entry is).

Hook templates are complete ``def``s that replace one EVOLVE block, with ``$name`` placeholders for
parameters (``string.Template``: Python's braces stay literal). They are self-contained on purpose:
they use no helper of the reference harness and import nothing, so they load in any genome whose
contract allows the hook. Rollouts are the plain dicts a harness sees (``visible`` verdict,
``completion_ids``, ``truncated``, ``reward`` once the engine has scored them, ``step``, ``group``).

Expected effects: a reward or group-filter change is judged on the parent's cached rollouts by the
backtest (``dead_group_ratio`` and ``kept_group_ratio`` are what its replay recomputes); a change the
replay cannot predict (advantages, sampling knobs, the learning rate, task selection) claims the
fitness, judged after training.
"""

from __future__ import annotations

from evotrainer.operators.intervention import FITNESS_METRIC, ExpectedEffect
from evotrainer.operators.library_entry import KnobMove, LibraryEntry, Param
from evotrainer.operators.triggers import when

# An adapter is stuck when its training groups had a gradient (dead ratio under STUCK_DEAD) yet training
# changed under STUCK_CHANGED of the held-out answers: the learning-rate entries and the engine's
# adapter_stuck alert (fitness/engine_metrics.py) read the same line.
STUCK_CHANGED, STUCK_DEAD = 0.05, 0.9


FEWER_DEAD = ExpectedEffect("dead_group_ratio", "delta<", 0.0)
FEWER_KEPT = ExpectedEffect("kept_group_ratio", "delta<", 0.0)
FITTER = ExpectedEffect(FITNESS_METRIC, "delta>", 0.0)
# Filters, advantages and pass-rate curricula reshape the reward's differences; where every rollout earned
# the same (SWE's seed: nothing resolved, every group dead) they cannot change a step, and drawing one of
# them only delays an entry that can create a difference (a credit, guidance, a prompt, more samples).
SOME_REWARD = when("train_reward_std", ">", 0.0)

# ---- reward ---------------------------------------------------------------------------------------
FORMAT_CREDIT = '''def reward(rollouts, tasks):
    """Partial credit: 1 for a correct answer, $credit for a wrong one in the required answer format."""
    out = []
    for r in rollouts:
        seen = r["visible"]
        out.append(1.0 if seen.get("correct") else ($credit if seen.get("format_ok") else 0.0))
    return out'''

OVERLONG_PENALTY = '''def reward(rollouts, tasks):
    """Correctness plus DAPO's soft overlong penalty: 0 up to the last $buffer of the token limit,
    falling linearly to -$scale at the limit; -$scale for a truncated completion."""
    limit = float(KNOBS["max_completion_length"]["value"])
    span = max(1.0, $buffer * limit)
    out = []
    for r in rollouts:
        n = len(r["completion_ids"])
        if r["truncated"] or n >= limit:
            penalty = -1.0
        elif n > limit - span:
            penalty = (limit - span - n) / span
        else:
            penalty = 0.0
        out.append((1.0 if r["visible"].get("correct") else 0.0) + $scale * penalty)
    return out'''

LENGTH_PENALTY = '''def reward(rollouts, tasks):
    """Correctness plus Kimi k1.5's length reward, weighted by $weight: within a group,
    lam = 0.5 - (len - shortest) / (longest - shortest); a correct answer gets lam, a wrong one min(0, lam)."""
    spans = {}
    for r in rollouts:
        key = (r["step"], r["group"])
        n = len(r["completion_ids"])
        lo, hi = spans.get(key, (n, n))
        spans[key] = (min(lo, n), max(hi, n))
    out = []
    for r in rollouts:
        lo, hi = spans[(r["step"], r["group"])]
        lam = 0.5 - (len(r["completion_ids"]) - lo) / (hi - lo) if hi > lo else 0.0
        correct = bool(r["visible"].get("correct"))
        out.append((1.0 if correct else 0.0) + $weight * (lam if correct else min(0.0, lam)))
    return out'''

# ---- keep_groups ----------------------------------------------------------------------------------
DYNAMIC_SAMPLING = '''def keep_groups(groups):
    """DAPO dynamic sampling: drop groups whose rollouts all agree on $signal (all right or all wrong),
    which carry no advantage and only dilute the loss."""
    signal = $signal
    keep = []
    for g in groups:
        if signal == "reward":
            values = [r["reward"] if r.get("reward") is not None else float(bool(r["visible"].get("correct")))
                      for r in g]
        else:
            values = [float(bool(r["visible"].get("correct"))) for r in g]
        keep.append(bool(values) and max(values) - min(values) > 1e-6)
    return keep'''

STD_FILTER = '''def keep_groups(groups):
    """Keep groups whose shaped rewards have a standard deviation of at least $min_std."""
    keep = []
    for g in groups:
        values = [r["reward"] if r.get("reward") is not None else float(bool(r["visible"].get("correct")))
                  for r in g]
        m = sum(values) / len(values) if values else 0.0
        std = (sum((x - m) ** 2 for x in values) / len(values)) ** 0.5 if values else 0.0
        keep.append(std >= $min_std)
    return keep'''

# ---- advantages -----------------------------------------------------------------------------------
RLOO = '''def advantages(groups, rewards):
    """RLOO: each rollout's baseline is the mean reward of the other rollouts of its group
    (unbiased, unlike a mean that includes the rollout itself); scaled as KNOBS["scale_rewards"] says
    (group std, batch std, or none), so that knob keeps its meaning."""
    scale = KNOBS["scale_rewards"]["value"]
    flat = [r for rs in rewards for r in rs]
    bm = sum(flat) / len(flat) if flat else 0.0
    batch_std = (sum((r - bm) ** 2 for r in flat) / (len(flat) - 1)) ** 0.5 if len(flat) > 1 else 0.0
    out = []
    for rs in rewards:
        n = len(rs)
        if n < 2:
            out.append([0.0 for _ in rs])
            continue
        total = sum(rs)
        adv = [r - (total - r) / (n - 1) for r in rs]
        if scale != "none":
            m = total / n
            std = (sum((r - m) ** 2 for r in rs) / (n - 1)) ** 0.5 if scale == "group" else batch_std
            adv = [a / (std + 1e-4) for a in adv]
        out.append(adv)
    return out'''

# ---- select_tasks (the curriculum hook: select_tasks(pool, stats, step, n) -> n task ids) ---------
PASS_RATE_CURRICULUM = '''def select_tasks(pool, stats, step, n):
    """Curriculum by pass rate: tasks whose observed pass rate lies in [$low, $high] (or that were
    never tried) first, rotating through them step by step; the rest fill up."""
    band, rest = [], []
    for t in pool:
        s = stats.get(t["id"]) or {}
        tries = s.get("attempts", 0)
        rate = s.get("correct", 0) / tries if tries else None
        (band if rate is None or $low <= rate <= $high else rest).append(t["id"])
    if band:
        k = (step * n) % len(band)
        band = band[k:] + band[:k]
    ids = band + rest
    return [ids[i % len(ids)] for i in range(n)] if ids else []'''

EASY_FIRST = '''def select_tasks(pool, stats, step, n):
    """Easier first: for the first $warmup steps draw from the easiest $share of the pool by
    difficulty, then from the whole pool, rotating step by step."""
    ordered = sorted(pool, key=lambda t: (t.get("difficulty", 0), t["id"]))
    if step < $warmup:
        ordered = ordered[:max(n, int(len(ordered) * $share))]
    ids = [t["id"] for t in ordered]
    if not ids:
        return []
    k = (step * n) % len(ids)
    ids = ids[k:] + ids[:k]
    return [ids[i % len(ids)] for i in range(n)]'''

# ---- validity (an evolved diagnostic: flags, never changes training) -----------------------------
HISTORY_VALIDITY = '''def validity(rollouts, metrics, history):
    """SWE history leak: count the git-history commands of each episode (the git_log tool, git
    log/show/blame/reflog, a git diff against a commit, reading .git) and flag the batch when at
    least $min_share of its resolved episodes read a history that showed a diff on the way: the
    branch's resolution rides on the history, which held-out repositories do not have. A history
    read whose output showed no diff (a repository without the fix in its history) is counted but not
    flagged; when no tool output is recorded, every history read counts as having shown one."""
    verbs = ("git log", "git show", "git blame", "git reflog", "git rev-list", "git cat-file", "git whatchanged")

    def strings(x):
        if isinstance(x, str):
            return [x]
        if isinstance(x, dict):
            return [s for v in x.values() for s in strings(v)]
        if isinstance(x, (list, tuple)):
            return [s for v in x for s in strings(v)]
        return []

    def reads_history(call):
        if call.get("name") == "git_log" or call.get("tool") == "git_log":
            return True
        for s in strings(call.get("args")):
            s = " " + " ".join(s.split()) + " "
            if any(v + " " in s for v in verbs) or " .git/" in s or " .git " in s or "/.git/" in s:
                return True
            against = s.split(" git diff ", 1)[1] if " git diff " in s else ""
            if "HEAD" in against or "~" in against or "^" in against:   # a diff against a commit
                return True
        return False

    def showed_diff(text):
        return "diff --git" in text or "\\n@@ " in text or text.startswith("@@ ")

    resolved, rode, reads = 0, [], 0
    for i, r in enumerate(rollouts):
        turns = r.get("turns") if isinstance(r.get("turns"), list) else []
        calls = r.get("tool_calls") if isinstance(r.get("tool_calls"), list) else []
        if not calls:   # the calls nested in the assistant's turns
            calls = [t.get("tool_call", t) for t in turns if isinstance(t, dict) and t.get("role", "assistant") == "assistant"]
        calls = [c for c in calls if isinstance(c, dict)]
        outputs = [str(t.get("result", "")) for t in turns if isinstance(t, dict) and reads_history(t.get("tool_call", t))]
        outputs += [str(t.get("content", "")) for t in turns if isinstance(t, dict)
                    and t.get("role") in ("tool", "user") and reads_history(t)]
        n = sum(1 for c in calls if reads_history(c))
        reads += 1 if n else 0
        solved = bool((r.get("visible") or {}).get("correct"))
        resolved += 1 if solved else 0
        if solved and n and (not any(outputs) or any(showed_diff(o) for o in outputs)):
            rode.append(i)
    if not rode or len(rode) < $min_share * resolved:
        return []
    return [{"name": "resolution_rides_on_history",
             "message": f"{len(rode)} of {resolved} resolved episodes read a repository history that showed a "
                        f"diff ({reads} of {len(rollouts)} episodes ran history commands): held-out repositories "
                        "have no such history",
             "evidence": f"rollout indices {rode[:20]}"}]'''

HISTORY_CHECK_HYPOTHESIS = (
    "If a batch in which at least {min_share} of the resolved episodes read a git history showing a diff is "
    "marked invalid, branches whose training resolution rides on the history (the fix commit of leaky training "
    "repositories) are stopped and the branches that pass keep a training resolution that held-out repositories "
    "(no history) confirm, because the history is a channel only training repositories offer.")
# A validity hook changes no training and no replayed number: its credit is its recall and false-positive
# rate on labelled history (the backtest scores them); the claim judged after training is the gap it guards.
SMALL_GAP = ExpectedEffect("train_heldout_gap", "<", 0.3)


ENTRIES: tuple[LibraryEntry, ...] = (
    LibraryEntry(
        "format_partial_credit", "reward: partial credit for the answer format (1 correct, credit if formatted)",
        "hook:reward", (when("format_compliance", "<", 0.5), when("dead_group_ratio", ">", 0.3)),
        "If a wrong answer in the required format earns {credit}, dead groups regain reward variance and "
        "format compliance rises, because format is within reach of the policy when correctness is not.",
        FEWER_DEAD, "DeepSeek-R1 (2025): rule-based accuracy plus format reward",
        template=FORMAT_CREDIT, params=(Param("credit", (0.1, 0.2, 0.3)),), single_turn=True),
    LibraryEntry(
        "dapo_overlong_shaping", "reward: DAPO soft penalty for completions near or at the token limit",
        "hook:reward", (when("truncation_rate", ">", 0.3),),
        "If completions within the last {buffer} of the token limit are penalised (scale {scale}), truncation "
        "falls and dead groups regain variance, because length now separates rollouts of equal correctness.",
        FEWER_DEAD, "DAPO (Yu et al., 2025): overlong reward shaping", template=OVERLONG_PENALTY,
        params=(Param("buffer", (0.25, 0.5)), Param("scale", (0.5, 1.0))), needs_knobs=("max_completion_length",),
        single_turn=True),
    LibraryEntry(
        "length_penalty", "reward: Kimi k1.5 length reward (shorter than the group's others is better)",
        "hook:reward", (when("truncation_rate", ">", 0.2),),
        "If shorter completions within a group earn up to {weight} more, completions shorten and fewer are "
        "truncated, and dead groups regain variance, because length varies where correctness does not.",
        FEWER_DEAD, "Kimi k1.5 (Kimi Team, 2025): length penalty", template=LENGTH_PENALTY,
        params=(Param("weight", (0.1, 0.2, 0.5)),), single_turn=True),
    LibraryEntry(
        "dapo_dynamic_sampling", "keep_groups: drop dead groups (all rollouts agree)",
        "hook:keep_groups", (when("dead_group_ratio", ">", 0.3), when("kept_group_ratio", ">", 0.9), SOME_REWARD),
        "If groups whose rollouts all agree on {signal} are dropped, every trained group carries an advantage, "
        "because dead groups add zero-gradient tokens that dilute the loss.",
        FEWER_KEPT, "DAPO (Yu et al., 2025): dynamic sampling", template=DYNAMIC_SAMPLING,
        params=(Param("signal", ("reward", "correct")),)),
    LibraryEntry(
        "std_group_filter", "keep_groups: keep only groups whose reward std reaches a threshold",
        "hook:keep_groups", (when("reward_spread", "<", 0.1), when("kept_group_ratio", ">", 0.9), SOME_REWARD),
        "If groups with reward std below {min_std} are dropped, training sees only groups with a clear "
        "ranking, because near-constant shaped rewards give noisy, tiny advantages.",
        FEWER_KEPT, "low-variance group filtering: DAPO's dynamic sampling generalised to shaped rewards",
        template=STD_FILTER, params=(Param("min_std", (0.05, 0.1, 0.2)),)),
    LibraryEntry(
        "rloo_advantages", "advantages: RLOO leave-one-out baseline",
        "hook:advantages", (when("dead_group_ratio", "<", 0.95), when("reward_spread", ">", 0.0)),
        "If each rollout's baseline leaves the rollout out, held-out score "
        "rises, because the baseline is unbiased and small groups no longer shrink the advantage.",
        FITTER, "RLOO (Ahmadian et al., 2024; Kool et al., 2019)", template=RLOO, needs_knobs=("scale_rewards",)),
    # Dr. GRPO's advantage is the reference's with scale_rewards "none": a knob move, not a new hook
    # (a hook that ignored the knob would leave scale_rewards declared and read by nothing).
    LibraryEntry(
        "dr_grpo_advantages", "advantages: Dr. GRPO (group mean baseline, no std division)",
        "knob:scale_rewards", (when("train_correct_rate", "<", 0.3), SOME_REWARD),
        "If scale_rewards goes from {old} to {new} (advantages no longer divided by the group std), held-out "
        "score rises, because groups that are nearly all wrong stop dominating the update.",
        FITTER, "Dr. GRPO (Liu et al., 2025): Understanding R1-Zero-like training",
        move=KnobMove("scale_rewards", to="none")),
    LibraryEntry(
        "pass_rate_curriculum", "select_tasks: train on tasks of intermediate pass rate first",
        "hook:select_tasks", (when("dead_group_ratio", ">", 0.5), SOME_REWARD),
        "If tasks with pass rate in [{low}, {high}] are trained first, fewer groups are dead and held-out score "
        "rises, because such tasks give groups with both right and wrong answers.",
        FITTER, "online difficulty filtering (Bae et al., 2025); Kimi k1.5 prioritised sampling",
        template=PASS_RATE_CURRICULUM, params=(Param("low", (0.1, 0.2)), Param("high", (0.8, 0.9))),
        requires_hook="select_tasks"),
    LibraryEntry(
        "easy_first_curriculum", "select_tasks: easiest tasks first, then the whole pool",
        "hook:select_tasks", (when("train_correct_rate", "<", 0.1),),
        "If the first {warmup} steps train on the easiest {share} of tasks, early groups have correct rollouts "
        "and held-out score rises, because the policy first learns the answer format on tasks it can solve.",
        FITTER, "curriculum learning (Bengio et al., 2009)", template=EASY_FIRST,
        params=(Param("warmup", (4, 8, 16)), Param("share", (0.25, 0.5))), requires_hook="select_tasks"),
    LibraryEntry(
        "lower_temperature", "knob: lower the sampling temperature",
        "knob:temperature", (when("train_heldout_gap", "<", -0.1),),
        "If temperature falls from {old} to {new}, training rollouts succeed more often and held-out score rises, "
        "because sampled training rollouts do much worse than greedy held-out answers (too much noise).",
        FITTER, "sampling temperature (TRL GRPOConfig.temperature)", move=KnobMove("temperature", (0.5, 0.7, 0.85))),
    LibraryEntry(
        "raise_temperature", "knob: raise the sampling temperature",
        "knob:temperature", (when("mean_logprob", ">", -0.1),),
        "If temperature rises from {old} to {new}, rollouts within a group differ more and held-out score rises, "
        "because the policy is over-confident (sampler logprob near 0) and groups collapse to one answer.",
        FITTER, "sampling temperature (TRL GRPOConfig.temperature)", move=KnobMove("temperature", (1.2, 1.5))),
    LibraryEntry(
        "lower_learning_rate", "knob: lower the learning rate",
        "knob:learning_rate", (when("heldout_delta", "<", -0.05),),
        "If learning_rate falls from {old} to {new}, held-out accuracy stops falling, because the update "
        "overshoots (held-out accuracy dropped while training).",
        FITTER, "learning-rate decrease on regression (TRL GRPOConfig.learning_rate)",
        move=KnobMove("learning_rate", (0.25, 0.5))),
    LibraryEntry(
        "raise_learning_rate", "knob: raise the learning rate",
        "knob:learning_rate", (when("heldout_delta", "<", 0.02), when("heldout_delta", ">", -0.05),
                               when("dead_group_ratio", "<", STUCK_DEAD), when("heldout_changed_rate", ">=", STUCK_CHANGED)),
        "If learning_rate rises from {old} to {new}, held-out score rises, because training signal exists "
        "(live groups) but held-out accuracy barely moved.",
        FITTER, "learning-rate increase on a plateau (TRL GRPOConfig.learning_rate)",
        move=KnobMove("learning_rate", (2.0, 4.0))),
    LibraryEntry(
        "unstick_learning_rate", "knob: raise the learning rate by orders of magnitude",
        "knob:learning_rate", (when("heldout_changed_rate", "<", STUCK_CHANGED), when("dead_group_ratio", "<", STUCK_DEAD)),
        "If learning_rate rises from {old} to {new}, training changes held-out answers and held-out score rises, "
        "because the groups had a gradient yet the adapter changed almost no greedy held-out answer (a step "
        "far too small for a LoRA adapter, as TRL's 1e-6 default, sized for full fine-tuning).",
        FITTER, "LoRA learning rates (Hu et al., 2021) against TRL GRPOConfig's full fine-tuning default",
        # x30 was too small: on the misfit suite setting a lineage raised 1e-6 -> 4.4e-5 stayed stuck.
        move=KnobMove("learning_rate", (100.0, 300.0, 1000.0))),
    LibraryEntry(
        "more_generations", "knob: more rollouts per group (group size)",
        "knob:num_generations", (when("dead_group_ratio", ">", 0.5),),
        "If num_generations rises from {old} to {new}, fewer groups are dead and held-out score rises, because "
        "a larger group is more likely to hold both a right and a wrong answer.",
        FITTER, "GRPO group size G (Shao et al., 2024, DeepSeekMath)", move=KnobMove("num_generations")),
    LibraryEntry(
        "longer_completions", "knob: raise the completion token limit",
        "knob:max_completion_length", (when("truncation_rate", ">", 0.5),),
        "If max_completion_length rises from {old} to {new}, fewer completions are truncated and held-out score "
        "rises, because truncated completions never reach their final answer.",
        FITTER, "completion budget (TRL GRPOConfig.max_completion_length)",
        move=KnobMove("max_completion_length"), single_turn=True),
    LibraryEntry(
        "mask_truncated", "knob: exclude truncated completions from the loss",
        "knob:mask_truncated_completions", (when("truncation_rate", ">", 0.3),),
        "If mask_truncated_completions goes from {old} to {new}, held-out score rises, because truncated "
        "completions are penalised for length rather than for their reasoning.",
        FITTER, "DAPO (Yu et al., 2025): overlong filtering; TRL mask_truncated_completions",
        move=KnobMove("mask_truncated_completions", to=True), single_turn=True),
    LibraryEntry(
        "swe_history_validity", "validity: flag resolution that rides on git-history commands (SWE leak)",
        "hook:validity", (when("history_call_rate", ">", 0.0),),
        HISTORY_CHECK_HYPOTHESIS, SMALL_GAP,
        "the SWE git-history leak (agentic RL field notes): a policy read the fix from the repository's history",
        template=HISTORY_VALIDITY, params=(Param("min_share", (0.1, 0.25, 0.5)),), episodes_only=True),
    LibraryEntry(
        "swe_history_validity_gap", "validity: flag resolution that rides on git-history commands, on a train/held-out gap",
        "hook:validity", (when("train_heldout_gap", ">", 0.3), when("turns_mean", ">", 0.0)),
        HISTORY_CHECK_HYPOTHESIS, SMALL_GAP,
        "the SWE git-history leak (agentic RL field notes): training resolution far above held-out",
        template=HISTORY_VALIDITY, params=(Param("min_share", (0.1, 0.25, 0.5)),), episodes_only=True),
)
