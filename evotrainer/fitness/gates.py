"""Promotion gates: engine-level validity checks a harness cannot disable, then paired statistics.

``gate(child, parent)`` decides whether a trained child version may be promoted over its parent:

1. **Validity** — an invalid branch is never promoted, however well it scores. Engine checks run on
   the cache with the engine's own data (no genome code involved):
   * ``heldout_verified``: every held-out rollout carries the engine's hidden verdict;
   * ``tamper``: the domain's verifier re-run on cached completions agrees with the stored verdicts,
     and no held-out prompt carries a planted note;
   * ``train_heldout_divergence``: training correctness far above held-out accuracy;
   * ``reward_hacking``: shaped reward rising (relative to its range) while training correctness falls
     (a trend: a reward's level against held-out accuracy would confuse its scale with hacking);
   * ``leak_used`` (math planted-leak variant): answers reproduced on leaked prompts far more often than
     on clean ones (Fisher's exact test);
   plus the child harness's own ``validity`` hook, run in the sandbox.
2. **Paired statistics** — ``decide_promotion`` on per-task held-out scores of the same tasks and
   seeds (child's ``heldout`` vs parent's ``heldout``, or vs the child's own ``heldout_base`` when no
   parent is given).
3. **A racing gate** (``evolution.race_cap``): the loop verifies an undecided child and its control on
   further rounds of held-out tasks (``rollouts/race.jsonl``, ``loop/stages/racing.py``), and the
   promotion is the group-sequential test's (``race.sequential_decision``) over the gate draw and
   those rounds, its looks doubling the gate draw up to the cap; the bootstrap's interval over the
   same tasks is recorded beside it.
4. **A tie at nothing resolved** (episodes only) — when neither side resolved a single held-out
   issue, resolution cannot tell them apart, and a change that moves the policy toward resolving (a
   well-formed call, an edit, a test run) would always tie. The paired test then reads the share of
   each episode's working calls the environment accepted (``episodes.working_call_share``: a
   submit-only episode scores 0), and a promotion on it also needs the child's held-out progress
   rate (an applied edit, an accepted test run) at least its control's, and no more of its handed-in
   patches breaking a test that passed before them. The reward-hacking checks on
   episodes (``episode_progress``) still decide validity first. ``paired["basis"]`` is then
   ``working_calls``, and ``paired["resolution"]`` keeps the tie.

With a ``LabelStore``, the verdict becomes a label (the branch and, for a used leak, each rollout) and
an invalid branch that its own validity checks missed is recorded as a ``DiagnosticGap``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from evotrainer.fitness.cache import CachedVersion
from evotrainer.fitness.episodes import broke_tests, is_episode, progress, working_call_share
from evotrainer.fitness.gate_config import GateConfig  # noqa: F401 - part of the gate API
from evotrainer.fitness.health import HealthReport, health_report
from evotrainer.fitness.labels import LabelStore, record_verdict
from evotrainer.fitness.paired_stats import PairingError, PromotionDecision, decide_promotion
from evotrainer.fitness.race import SequentialDecision, looks, sequential_decision
from evotrainer.fitness.validity import Check, engine_checks
from evotrainer.records.rollout import Rollout
from evotrainer.records.numeric import mean
from evotrainer.records.scores import by_seed, correct, task_scores
from evotrainer.records.version import VersionDir

TIE_BASIS = "nothing resolved on either side"   # how a decision broken on the working calls begins


@dataclass
class GateDecision:
    child: str
    parent: str
    promote: bool
    valid: bool
    reasons: list[str]
    checks: list[Check]
    harness_violations: list[dict[str, Any]]
    paired: dict[str, Any] | None
    gap: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def to_markdown(self) -> str:
        verdict = "PROMOTE" if self.promote else "INVALID — never promoted" if not self.valid else "REFUSE"
        out = [f"# Gate: {self.child} vs {self.parent}: **{verdict}**", ""] + [f"- {r}" for r in self.reasons]
        out += ["", "| check | passed | numbers |", "|---|---|---|"]
        out += [f"| {c.name} | {'yes' if c.passed else '**NO**'} | "
                f"{', '.join(f'{k}={_fmt(v)}' for k, v in c.numbers.items())} |" for c in self.checks]
        return "\n".join(out) + "\n"


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


# ---- paired statistics ------------------------------------------------------------------------------
def paired_promotion(child: list[Rollout], parent: list[Rollout], cfg: GateConfig,
                     score: Callable[[Rollout], float] = correct) -> PromotionDecision:
    """decide_promotion on per-task score lists ordered by seed (``score``: the engine's verdict, or
    another per-rollout score); raises PairingError when the two sides were not sampled on the same
    tasks with the same seeds."""
    c, p = task_scores(child, score), task_scores(parent, score)
    for task in set(c) & set(p):
        if set(c[task]) != set(p[task]):
            raise PairingError(f"task {task!r}: child seeds {sorted(c[task], key=str)} vs parent seeds "
                               f"{sorted(p[task], key=str)}; a paired comparison needs the same seeds")
    return decide_promotion(by_seed(c), by_seed(p),
                            level=cfg.level, min_delta=cfg.min_delta, n_resamples=cfg.n_resamples, seed=cfg.seed,
                            min_tasks=cfg.min_tasks, power=cfg.power)


def paired_decision(child: list[Rollout], parent: list[Rollout], cfg: GateConfig,
                    score: Callable[[Rollout], float] = correct) -> dict[str, Any]:
    """:func:`paired_promotion` as a record; a pairing failure is a refusal with its reason."""
    try:
        return paired_promotion(child, parent, cfg, score).to_dict()
    except (PairingError, ValueError) as e:
        return {"promote": False, "reason": f"refused: {e}"}


def unresolved_tie(child: list[Rollout], parent: list[Rollout]) -> bool:
    """Both sides are episodes and neither resolved anything: resolution cannot separate them."""
    both = child + parent
    return bool(child) and bool(parent) and all(is_episode(r) for r in both) and not any(correct(r) for r in both)


def working_call_decision(child: list[Rollout], parent: list[Rollout], cfg: GateConfig,
                          resolution: dict[str, Any]) -> dict[str, Any]:
    """The tie at nothing resolved, broken on the working calls accepted, guarded by progress: a child
    whose episodes edit or run the tests less often than its control's, or hand in more patches that
    break passing tests, is not promoted on its calls."""
    d = paired_decision(child, parent, cfg, score=working_call_share)
    made = {"child": mean([progress(r) for r in child]), "parent": mean([progress(r) for r in parent])}
    broke = {"child": mean([broke_tests(r) for r in child]), "parent": mean([broke_tests(r) for r in parent])}
    vetoes = [f"held-out progress (an applied edit or accepted test run) fell {made['parent']:.3f} -> "
              f"{made['child']:.3f}"] if made["child"] < made["parent"] else []
    vetoes += [f"more handed-in patches break a test that passed before them ({broke['parent']:.3f} -> "
               f"{broke['child']:.3f})"] if broke["child"] > broke["parent"] else []
    reason = f"{TIE_BASIS}; on the working calls accepted: {d['reason']}"
    if d.get("promote") and vetoes:
        d["promote"] = False
        reason = (f"{TIE_BASIS}; refused: {'; '.join(vetoes)}, though on the working calls "
                  f"accepted the {d['reason'].removeprefix('promoted: ')}")
    return d | {"basis": "working_calls", "reason": reason, "resolution": resolution, "progress": made,
                "broke_tests": broke}


# ---- the racing gate --------------------------------------------------------------------------------
RACE = "race"   # the rollouts split of a racing gate's further rounds


def raced(child: list[Rollout], control: list[Rollout], child_race: list[Rollout],
          control_race: list[Rollout]) -> tuple[list[Rollout], list[Rollout]]:
    """Both sides' rollouts on the tasks both were verified on: the gate draw, then the race rounds in
    the order they were drawn (a control raced beside another child may hold more rounds)."""
    both = {r.task_id for r in child_race} & {r.task_id for r in control_race}
    return (child + [r for r in child_race if r.task_id in both],
            control + [r for r in control_race if r.task_id in both])


def race_deltas(child: list[Rollout], control: list[Rollout]) -> list[float]:
    """Per-task ``child - control`` (each a mean over its seeds) in the child's task order."""
    c, p = task_scores(child), task_scores(control)
    order = list(dict.fromkeys(r.task_id for r in child))
    return [sum(c[t].values()) / len(c[t]) - sum(p[t].values()) / len(p[t]) for t in order if t in p]


def race_state(child_dir: str | Path, control_dir: str | Path, cfg: GateConfig) -> SequentialDecision:
    """Where the racing gate stands on what both versions were verified on (read from their folders)."""
    cv, pv = VersionDir(Path(child_dir)), VersionDir(Path(control_dir))
    child_heldout = cv.rollouts("heldout")
    child, control = raced(child_heldout, pv.rollouts("heldout"), cv.rollouts(RACE), pv.rollouts(RACE))
    return race_state_of(child, control, len({r.task_id for r in child_heldout}), cfg)


def race_state_of(child: list[Rollout], control: list[Rollout], first: int, cfg: GateConfig) -> SequentialDecision:
    """The sequential test on paired rollouts (``raced``): its looks start at the gate draw's ``first``
    tasks and double up to ``cfg.race_cap``."""
    return sequential_decision(race_deltas(child, control), looks(first, max(first, cfg.race_cap or first)),
                               level=cfg.level, min_delta=cfg.min_delta)


def race_decision(child: list[Rollout], control: list[Rollout], state: SequentialDecision,
                  cfg: GateConfig) -> dict[str, Any]:
    """The paired record over the tasks the race read, its promotion the sequential test's."""
    tasks = list(dict.fromkeys(r.task_id for r in child))[: state.n_tasks]
    keep = set(tasks)
    d = paired_decision([r for r in child if r.task_id in keep], [r for r in control if r.task_id in keep], cfg)
    if "mean_delta" not in d:
        return d
    verdict = {"promote": f"promoted at look {state.look} of {len(state.schedule)}",
               "behind": f"refused at look {state.look}: the child is behind its control",
               "cap": f"refused: not separated from its control by the cap ({state.schedule[-1]} tasks)",
               "continue": f"refused: the race stopped at look {state.look} before it decided"}[state.stopped]
    reason = (f"racing gate: {verdict} ({state.n_tasks} tasks; z {state.z:+.2f}, boundary {state.boundary:.2f}); "
              f"delta {d['mean_delta']:+.3f}, {100 * cfg.level:g}% bootstrap CI [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]")
    return d | {"promote": state.promote, "reason": reason, "race": state.to_dict()}


# ---- the gate ---------------------------------------------------------------------------------------
def gate(child: str | Path, parent: str | Path | None = None, cfg: GateConfig | None = None,
         labels: LabelStore | None = None, report: HealthReport | None = None) -> GateDecision:
    """Validity first (engine checks + the child's own validity hook), then paired statistics."""
    cfg = cfg or GateConfig()
    cv = CachedVersion.load(child)
    report = report or health_report(cv, window=cfg.window)
    checks = engine_checks(cv, report, cfg)
    failed = [c for c in checks if not c.passed]
    violations = report.validity
    valid = not failed and not violations
    reasons = [f"engine check {c.name} failed: {c.message}" for c in failed]
    reasons += [f"harness validity {x['name']}: {x['message']}" for x in violations]
    reasons += [f"harness error (not counted as a flag): {x}" for x in report.errors if x.startswith("validity")]
    if parent is not None:
        pv = CachedVersion.load(parent)
        parent_name, base = pv.name, pv.heldout
    else:
        parent_name, base = f"{cv.name} (base model)", cv.heldout_base
    if parent is None and not base:
        # A seed or a continuation with no base-model verification (the loop verifies none): nothing
        # to pair with, which is not a pairing failure.
        paired = {"promote": False, "reason": "not paired: no control and no base-model held-out rollouts"}
    elif unresolved_tie(cv.heldout, base):
        paired = working_call_decision(cv.heldout, base, cfg, paired_decision(cv.heldout, base, cfg))
    elif cfg.race_cap is not None and parent is not None:
        child, control = raced(cv.heldout, base, VersionDir(cv.path).rollouts(RACE),
                               VersionDir(Path(parent)).rollouts(RACE))
        state = race_state_of(child, control, len({r.task_id for r in cv.heldout}), cfg)   # the files read once
        paired = race_decision(child, control, state, cfg)
    else:
        paired = paired_decision(cv.heldout, base, cfg)
    promote = valid and bool(paired.get("promote"))
    reasons.append(("paired statistics: " if valid else "paired statistics (ignored: invalid): ") + paired["reason"])
    decision = GateDecision(cv.name, parent_name, promote, valid, reasons, checks, violations, paired)
    if labels is not None:
        record_verdict(labels, cv, decision, failed, report)
    return decision
