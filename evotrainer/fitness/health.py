"""Health report of a branch version: its harness's diagnostics plus engine metrics it cannot change.

Two sources, kept apart on purpose:

* **harness** — the version's own genome (``genome.py``) runs ``metrics``/``alerts``/``validity`` in the
  sandbox on the cached train rollouts, exactly as it would during training (per-step metrics are the
  ``history``; the last ``window`` steps pooled are the current ``metrics``). These evolve, and a
  cheating harness can make them say anything.
* **engine** — computed here from the cache with the engine's own verdicts: held-out accuracy from
  hidden verification, train-vs-held-out gaps, dead groups on the rewards actually used, truncation,
  sampler logprob, length, leak usage, and the per-task outcome flow between two versions. No genome
  code runs for these, so the gates and the people reading the report can trust them.

``HealthReport.to_json()`` is what operators and backtests read (``metrics`` holds both sources, the
engine's value winning a name clash); ``to_markdown()`` is for people, alerts most severe first.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evotrainer.fitness.cache import CachedVersion
from evotrainer.fitness.engine_metrics import engine_alerts, engine_metrics, outcome_flow
from evotrainer.genome.harness import Harness
from evotrainer.records.rollout import group_rollouts

SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}


@dataclass
class HealthReport:
    version: str
    path: str
    genome_hash: str
    engine: dict[str, float | None]
    harness_metrics: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)      # harness + engine, most severe first
    validity: list[dict[str, Any]] = field(default_factory=list)    # the harness's own violations
    flow: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)                 # hooks that failed in the sandbox

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HealthReport:
        """A report as ``to_dict`` wrote it (``metrics`` is derived, so it is not read back)."""
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    @property
    def metrics(self) -> dict[str, float | None]:
        return {**self.harness_metrics, **self.engine}

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "metrics": self.metrics}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def to_markdown(self) -> str:
        e = self.engine
        out = [f"# Health report: {self.version}", "",
               f"`{self.path}` · genome `{self.genome_hash[:12]}`", "", "## Score (engine)", "",
               "| metric | value |", "|---|---|"]
        out += [f"| {k} | {_fmt(e.get(k))} |" for k in SCORE_KEYS if k in e]
        out += ["", f"## Alerts ({len(self.alerts)})", ""]
        out += [f"- **{a['severity'].upper()}** `{a['name']}` ({a.get('source', 'harness')}): {a['message']}"
                + (f"\n  - suggested intervention: {a['suggestion']}" if a.get("suggestion") else "")
                for a in self.alerts] or ["- none"]
        out += ["", f"## Validity (harness checks: {len(self.validity)} violation(s))", ""]
        out += [f"- `{v['name']}`: {v['message']}" + (f" (evidence: {v['evidence']})" if v.get("evidence") else "")
                for v in self.validity] or ["- none"]
        if self.flow:
            f = self.flow
            out += ["", f"## Outcome flow: {f['before']} → {f['after']}", "",
                    "| fixed | broken | kept correct | kept wrong | unpaired |", "|---|---|---|---|---|",
                    f"| {f['fixed']} | {f['broken']} | {f['kept_correct']} | {f['kept_wrong']} | {f['unpaired']} |"]
        out += ["", "## Signal, behaviour, efficiency, model state (engine)", "", "| metric | value |", "|---|---|"]
        out += [f"| {k} | {_fmt(v)} |" for k, v in e.items() if k not in SCORE_KEYS]
        out += ["", "## Harness metrics (last window)", "", "| metric | value |", "|---|---|"]
        out += [f"| {k} | {_fmt(v)} |" for k, v in self.harness_metrics.items()] or ["| (none) | |"]
        if self.errors:
            out += ["", "## Harness errors", ""] + [f"- {x}" for x in self.errors]
        return "\n".join(out) + "\n"


SCORE_KEYS = ("heldout_accuracy", "heldout_accuracy_base", "heldout_delta", "train_reward_mean_last",
              "train_correct_rate_last", "train_heldout_gap", "reward_heldout_gap")


def _fmt(v: Any) -> str:
    return "n/a" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


# ---- the report ------------------------------------------------------------------------------------
def harness_diagnostics(v: CachedVersion, harness: Harness, window: int = 3) -> tuple[dict, list, list, list, list]:
    """(metrics, history, alerts, violations, errors) from the genome's hooks on the train cache."""
    errors: list[str] = []

    def safe(hook: str, fn, default):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - a broken genome gets a report that says so
            errors.append(f"{hook}: {type(e).__name__}: {e}")
            return default

    steps = sorted({r.step for r in v.train})
    recent = set(steps[-window:]) if window > 0 else set(steps)
    history = []
    for s in steps:
        if s in recent:
            continue
        rs = [r for r in v.train if r.step == s]
        history.append(safe("metrics", lambda rs=rs: harness.metrics(rs, group_rollouts(rs)), {}))
    late = [r for r in v.train if r.step in recent]
    metrics = safe("metrics", lambda: harness.metrics(late, group_rollouts(late)), {})
    alerts = [{**a, "source": "harness"} for a in safe("alerts", lambda: harness.alerts(metrics, history), [])]
    violations = safe("validity", lambda: harness.validity(v.train, metrics, history + [metrics]), [])
    return metrics, history, alerts, violations, errors


def health_report(version: str | Path | CachedVersion, compare: str | Path | CachedVersion | None = None,
                  window: int = 3, harness: Harness | None = None) -> HealthReport:
    """The health report of a version dir. ``compare``: an earlier version whose held-out outcomes
    flow into this one's (default: this version's own base-model held-out outcomes)."""
    v = version if isinstance(version, CachedVersion) else CachedVersion.load(version)
    other = None
    if compare is not None:
        other = compare if isinstance(compare, CachedVersion) else CachedVersion.load(compare)
    # The held-out delta and changed rate read against the compared version when there is one (the
    # loop's parent: same tasks, same seeds), else against this version's own base-model outcomes.
    engine = engine_metrics(v, window, base=other.heldout if other is not None else None)
    own = harness is None
    harness = harness or Harness(v.program, sandbox=True)
    try:
        metrics, history, alerts, violations, errors = harness_diagnostics(v, harness, window)
    finally:
        if own:
            harness.close()
    if other is not None:
        flow = outcome_flow(other.heldout, v.heldout, other.name, v.name)
    elif v.heldout_base:
        flow = outcome_flow(v.heldout_base, v.heldout, "base", v.name)
    else:
        flow = None
    alerts = sorted(alerts + engine_alerts(engine), key=lambda a: SEVERITY_RANK.get(a["severity"], 9))
    genome_hash = v.meta.genome_hash if v.meta else v.program.hash
    return HealthReport(version=(v.meta.id if v.meta else v.name) + f" ({v.name})", path=str(v.path),
                        genome_hash=genome_hash, engine=engine, harness_metrics=metrics, history=history,
                        alerts=alerts, validity=violations, flow=flow, errors=errors)

