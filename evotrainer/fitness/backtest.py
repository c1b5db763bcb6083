"""Backtest: replay a candidate harness on its parent's cached rollouts before any training.

The trainer's per-step pipeline (reward → keep_groups → advantages) is re-run with the candidate's
hooks, in the sandbox, on exactly the rollouts the parent produced. The prediction compares the
parent's numbers (``before``: the rewards and advantages stored in the cache) with the candidate's
(``after``): dead-group ratio, share of dead groups regaining variance, share of rollouts whose reward
changed, kept groups, share of rollouts carrying a gradient, and the Spearman correlation of the
shaped reward with the engine's outcome (train verdicts; held-out hidden verdicts, which the harness
never sees). The candidate's own ``metrics`` on the replayed batch are merged in, so an intervention
may state its expectation on any metric either the engine or the harness measures.

It cannot predict what training will do to the policy. An expectation is "untestable" here, and left
to the judgement after training (``fitness/hypothesis.py``), never rejected, when the replay does not
produce its metric (e.g. ``heldout_accuracy``), when the change acts only through sampling or training
(a knob no replayed hook reads, a curriculum, a prompt: the cached rollouts stay what they were), or
when the metric is one of the sampled rollouts' own (truncation, length, format) that replay leaves as
it was.

Accept/reject: reject when a candidate hook fails on the cache, when a testable expectation is not
met, or when its diagnostics do worse on labelled history than the parent's (they miss an invalid case
the parent's catch, or raise false alarms beyond ``max_fpr``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scipy.stats import spearmanr

from evotrainer.fitness.cache import CachedVersion
from evotrainer.records.numeric import finite_or_none, is_dead, mean, pstd
from evotrainer.records.scores import correct as outcome
from evotrainer.fitness.labels import DiagnosticsScore, LabelledCase, LabelStore, score_diagnostics
from evotrainer.genome.edits import factors_changed
from evotrainer.genome.errors import ContractError
from evotrainer.genome.harness import Harness
from evotrainer.genome.program import HarnessProgram
from evotrainer.genome.sandbox import SandboxLimits
from evotrainer.operators.intervention import EFFECT_OPS, ExpectedEffect
from evotrainer.records.rollout import Rollout, group_rollouts


# What replay recomputes: the hooks it runs on cached rollouts, and the numbers derived from rewards
# and advantages (the rest of a replayed batch is the parent's sampled rollouts, unchanged).
REPLAYED_HOOKS = ("reward", "keep_groups", "advantages", "metrics", "alerts", "validity")
REWARD_DERIVED = ("reward_mean", "reward_std", "reward_spread", "dead_group_ratio", "kept_group_ratio", "signal_share",
                  "spearman_reward_outcome", "heldout_spearman_reward_outcome", "revived_group_share",
                  "reward_changed_share")


def replay_reaches(parent: HarnessProgram, child: HarnessProgram) -> bool:
    """Whether the change acts through something replay recomputes: a replayed hook, or a knob that a
    replayed hook reads (``scale_rewards`` in ``advantages``). A sampling or optimiser knob, a
    curriculum or a prompt acts only through new rollouts and training."""
    try:
        factors = factors_changed(parent, child)
    except ContractError:
        return True   # the factors cannot be read: replay the candidate, which reports it broken
    for f in factors:
        kind, _, name = f.partition(":")
        if kind == "hook" and name in REPLAYED_HOOKS:
            return True
        if kind == "knob" and any(name in child.hooks.get(h, "") for h in REPLAYED_HOOKS):
            return True
    return False


def parse_expectation(text: str | dict | ExpectedEffect) -> ExpectedEffect:
    """``"dead_group_ratio < 0.3"``, ``{"metric", "op", "value"}`` or an ExpectedEffect."""
    if isinstance(text, ExpectedEffect):
        return text
    if isinstance(text, dict):
        return ExpectedEffect.from_dict(text)
    parts = text.split()
    if len(parts) != 3 or parts[1] not in EFFECT_OPS:
        raise ValueError(f"expected 'METRIC OP VALUE' with OP one of {' '.join(EFFECT_OPS)}, got {text!r}")
    try:
        value = float(parts[2])
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"expectation {text!r}: VALUE {parts[2]!r} is not a finite number")
    return ExpectedEffect(parts[0], parts[1], value)


def _spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """None when undefined (fewer than 3 points, or a constant side)."""
    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    return finite_or_none(spearmanr(x, y).statistic)


def replay(harness: Harness, v: CachedVersion, rollouts: list[Rollout]) -> list[Rollout]:
    """Copies of ``rollouts`` with reward/advantage recomputed by ``harness``, step by step as in training."""
    out = copy.deepcopy(rollouts)
    for step in sorted({r.step for r in out}):
        rs = [r for r in out if r.step == step]
        for r, rew in zip(rs, harness.reward(rs, [v.task_for(r) for r in rs])):
            r.reward, r.advantage = float(rew), None
        groups = group_rollouts(rs)
        kept = [g for g, k in zip(groups, harness.keep_groups(groups)) if k]
        if kept:
            for g, adv in zip(kept, harness.advantages(kept, [[r.reward for r in g.rollouts] for g in kept])):
                for r, a in zip(g.rollouts, adv):
                    r.advantage = float(a)
    return out


def signal_numbers(train: list[Rollout]) -> dict[str, float | None]:
    """Engine view of one scored batch: the numbers a prediction compares."""
    groups = [[r for r in g.rollouts] for g in group_rollouts(train)]
    rewards = [r.reward for r in train]
    return {
        "reward_mean": mean(rewards) if rewards else None,
        "reward_spread": mean([pstd([r.reward for r in g]) for g in groups]) if groups else None,
        "dead_group_ratio": mean([is_dead([r.reward for r in g]) for g in groups]) if groups else None,
        "kept_group_ratio": mean([any(r.advantage is not None for r in g) for g in groups]) if groups else None,
        "signal_share": mean([r.advantage is not None and abs(r.advantage) > 1e-8 for r in train]) if train else None,
        "spearman_reward_outcome": _spearman(rewards, [float(outcome(r)) for r in train]),
    }


@dataclass
class BacktestResult:
    candidate: str                      # genome hash (short)
    parent: str                         # version dir
    before: dict[str, float | None]
    after: dict[str, float | None]
    numbers: dict[str, Any]             # counts behind the ratios
    expectation: dict[str, Any] | None
    expectation_status: str             # met | missed | untestable | none
    diagnostics: dict[str, Any] | None  # candidate's scores on labelled history
    parent_diagnostics: dict[str, Any] | None
    accept: bool
    reasons: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def to_markdown(self) -> str:
        f = lambda x: "n/a" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)
        out = [f"# Backtest: genome {self.candidate} on {self.parent}: **{'ACCEPT' if self.accept else 'REJECT'}**",
               ""] + [f"- {r}" for r in self.reasons]
        out += ["", "## Predicted effect (cached rollouts)", "", "| metric | parent | candidate |", "|---|---|---|"]
        keys = list(self.after) + [k for k in self.before if k not in self.after]
        out += [f"| {k} | {f(self.before.get(k))} | {f(self.after.get(k))} |" for k in keys]
        out += ["", "| count | value |", "|---|---|"] + [f"| {k} | {f(v)} |" for k, v in self.numbers.items()]
        for title, d in (("candidate", self.diagnostics), ("parent", self.parent_diagnostics)):
            if d:
                out += ["", f"## Diagnostics on labelled history ({title})", "", "| hook | recall | FPR | missed |",
                        "|---|---|---|---|"]
                out += [f"| {h} | {f(d[h]['recall'])} ({d[h]['flagged_invalid']}/{d[h]['invalid']}) | "
                        f"{f(d[h]['fpr'])} ({d[h]['flagged_valid']}/{d[h]['valid']}) | {len(d[h]['missed'])} |"
                        for h in ("validity", "alerts")]
        if self.errors:
            out += ["", "## Errors", ""] + [f"- {e}" for e in self.errors]
        return "\n".join(out) + "\n"


def predict(candidate: Harness, parent_harness: Harness, v: CachedVersion) -> tuple[dict, dict, dict]:
    """(before, after, numbers) for the candidate replayed on the parent's cache."""
    old = [r for r in v.train]
    if any(r.reward is None for r in old):  # a cache without stored rewards: re-score with the parent
        old = replay(parent_harness, v, old)
    new = replay(candidate, v, old)
    before, after = signal_numbers(old), signal_numbers(new)
    groups_old, groups_new = group_rollouts(old), group_rollouts(new)
    dead_old = [is_dead([r.reward for r in g.rollouts]) for g in groups_old]
    dead_new = [is_dead([r.reward for r in g.rollouts]) for g in groups_new]
    revived = sum(1 for a, b in zip(dead_old, dead_new) if a and not b)
    killed = sum(1 for a, b in zip(dead_old, dead_new) if not a and b)
    changed = sum(1 for a, b in zip(old, new) if abs(a.reward - b.reward) > 1e-9)
    after["revived_group_share"] = revived / sum(dead_old) if sum(dead_old) else None
    after["reward_changed_share"] = changed / len(old) if old else None
    before["revived_group_share"] = before["reward_changed_share"] = 0.0
    # Held-out: the hidden verdict never reaches the harness; it only scores the reward here.
    if v.heldout:
        tasks = [v.task_for(r) for r in v.heldout]
        truth = [float(outcome(r)) for r in v.heldout]
        for side, h in ((before, parent_harness), (after, candidate)):
            side["heldout_spearman_reward_outcome"] = _spearman(h.reward(v.heldout, tasks), truth)
    # The harnesses' own metrics (engine numbers win a name clash: they cannot be gamed).
    before = {**_parent_metrics(parent_harness, old), **before}
    after = {**candidate.metrics(new, groups_new), **after}   # a candidate whose metrics hook fails is rejected
    numbers = {"groups": len(groups_old), "dead_groups_before": sum(dead_old), "dead_groups_after": sum(dead_new),
               "revived_groups": revived, "killed_groups": killed, "rollouts": len(old), "rewards_changed": changed,
               "heldout_rollouts": len(v.heldout)}
    return before, after, numbers


def _parent_metrics(h: Harness, rollouts: list[Rollout]) -> dict[str, float]:
    """The parent's own metrics; the parent trained under its harness already, so a metrics hook of
    its that fails here only loses its names from the comparison."""
    try:
        return h.metrics(rollouts, group_rollouts(rollouts))
    except Exception:  # noqa: BLE001 - see the docstring
        return {}


# Rollouts per hook call the sandbox's default limits are sized for: a training step's batch. A replay
# hands a hook the parent's whole cache (every step at once), so its limits grow with the cache.
STEP_ROLLOUTS = 64


def replay_limits(n_rollouts: int) -> SandboxLimits:
    """The sandbox limits of a replay over ``n_rollouts``: the per-call wall and CPU seconds scaled by
    how many training batches the cache holds (at most 60 times, within the worker's lifetime CPU)."""
    base = SandboxLimits()
    scale = min(60, max(1, math.ceil(n_rollouts / STEP_ROLLOUTS)))
    return dataclasses.replace(base, timeout_s=base.timeout_s * scale, cpu_s=base.cpu_s * scale)


def backtest(candidate: HarnessProgram | str | Path, parent: str | Path | CachedVersion,
             expect: str | dict | ExpectedEffect | None = None,
             labels: LabelStore | Sequence[LabelledCase] | None = None, max_fpr: float = 0.2) -> BacktestResult:
    """Replays ``candidate`` on ``parent``'s cache, checks ``expect`` and scores diagnostics on ``labels``."""
    program = candidate if isinstance(candidate, HarnessProgram) else HarnessProgram.from_file(candidate)
    v = parent if isinstance(parent, CachedVersion) else CachedVersion.load(parent)
    effect = parse_expectation(expect) if expect is not None else None
    cases = labels.cases() if isinstance(labels, LabelStore) else list(labels or [])
    reasons: list[str] = []
    errors: list[str] = []
    before: dict = {}
    after: dict = {}
    numbers: dict = {}
    diag = pdiag = None
    try:
        limits = replay_limits(len(v.train) + len(v.heldout))
        with Harness(program, sandbox=True, limits=limits) as cand, Harness(v.program, sandbox=True, limits=limits) as par:
            try:
                before, after, numbers = predict(cand, par, v)
            except Exception as e:  # noqa: BLE001 - the candidate's failure is the finding
                errors.append(f"replay: {type(e).__name__}: {e}")
            if cases:
                diag, pdiag = score_diagnostics(cand, cases), score_diagnostics(par, cases)
    except Exception as e:  # noqa: BLE001 - contract check or sandbox start failed
        errors.append(f"harness: {type(e).__name__}: {e}")
    if errors:
        reasons.append("rejected: the candidate fails on the parent's cached rollouts")
    status = "none"
    if effect is not None:
        measured = finite_or_none(after.get(effect.metric)) is not None
        same = measured and finite_or_none(before.get(effect.metric)) == finite_or_none(after.get(effect.metric))
        if not errors and not measured:
            status = "untestable"
            reasons.append(f"expectation {effect} is not measurable on cached rollouts: judged after training")
        elif not errors and not replay_reaches(v.program, program):
            status = "untestable"
            reasons.append(f"expectation {effect}: the change acts through sampling or training, which replaying "
                           "cached rollouts cannot reproduce: judged after training")
        elif not errors and same and effect.metric not in REWARD_DERIVED:
            status = "untestable"
            reasons.append(f"expectation {effect}: {effect.metric} is a property of the sampled rollouts, which "
                           "replay leaves as they were: judged after training")
        elif not errors:
            ok = effect.check(before, after)
            status = "met" if ok else "missed"
            was = finite_or_none(before.get(effect.metric))
            reasons.append(f"expectation {effect} {'met' if ok else 'MISSED'}: predicted {after[effect.metric]:.4g}"
                           + (f" (parent {was:.4g})" if was is not None else ""))
    reasons += _diagnostics_reasons(diag, pdiag, max_fpr)
    accept = not errors and status != "missed" and not any(r.startswith("rejected") for r in reasons)
    return BacktestResult(program.short_hash, str(v.path), _clean(before), _clean(after), numbers,
                          effect.to_dict() if effect else None, status,
                          diag.to_dict() if diag else None, pdiag.to_dict() if pdiag else None,
                          accept, reasons, errors)


def _diagnostics_reasons(d: DiagnosticsScore | None, p: DiagnosticsScore | None, max_fpr: float) -> list[str]:
    if d is None or p is None:
        return []
    out, cv, pv = [], d.validity, p.validity
    if cv.recall is not None:
        out.append(f"validity recall {cv.recall:.2f} ({cv.flagged_invalid}/{cv.invalid}) vs parent {pv.recall:.2f}")
        if cv.recall < pv.recall:
            out.append("rejected: validity misses known invalid cases the parent's diagnostics catch")
        elif cv.recall < 1.0 and pv.recall < 1.0:
            out.append(f"open diagnostic gap: {cv.invalid - cv.flagged_invalid} known invalid case(s) flagged by "
                       "neither candidate nor parent")
    if cv.fpr is not None:
        out.append(f"validity false-positive rate {cv.fpr:.2f} ({cv.flagged_valid}/{cv.valid}) vs parent "
                   f"{pv.fpr:.2f}")
        if cv.fpr > max_fpr and cv.fpr > (pv.fpr or 0.0):
            out.append(f"rejected: validity flags valid cases beyond max_fpr={max_fpr}")
    return out


def _clean(d: dict) -> dict:
    return {k: (None if isinstance(x, float) and not math.isfinite(x) else x) for k, x in d.items()}
