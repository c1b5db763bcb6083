"""Evidence: what an operator may base a proposal on (health report, matching skills, history)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# How much likelier a no-LLM operator is to draw a change the report's alerts name (a knob written in an
# alert's message or suggestion): the diagnosis points at it, and a critical alert's pointer most of all,
# since a critical failure (every tool call malformed) blocks every other change from showing an effect.
NAMED_WEIGHT = {"critical": 9.0, "warning": 3.0, "info": 3.0}
# Alerts whose failure hides every other change's effect: training does not move the adapter, so a
# child whose change acts through training ties its control by construction (every child of the misfit
# suite setting tied at exactly 0.000). While one fires, the diagnosing operators offer only the
# changes it names (triage: fix what blocks the others first), moved the way it asks; the drawn-at-random
# baseline does not.
BLOCKING = {"adapter_stuck": "up"}   # alert -> the way it asks its knobs to move


@dataclass
class Evidence:
    """What an operator may base a proposal on."""

    health_report: dict[str, Any] = field(default_factory=dict)   # metrics, alerts (findings), validity
    skills: list[dict[str, Any]] = field(default_factory=list)    # skills whose trigger fires
    history: list[dict[str, Any]] = field(default_factory=list)   # earlier interventions and outcomes
    gaps: list[dict[str, Any]] = field(default_factory=list)      # invalid branches no validity check flagged
    known_hashes: set[str] = field(default_factory=set)           # genomes already tried (duplicates)
    # "<parent genome hash>:<library entry>" of interventions refuted on fitness from that parent harness
    # (a child that lost, tied with no gain, or was invalid): not proposed from that harness again
    refuted: set[str] = field(default_factory=set)
    allow_multi_factor: bool = False
    # Whether any step of the parent's lineage moved its adapter (None: not known). A LoRA adapter no
    # step moved equals the base model, so a KL term to the base has nothing to pull on.
    adapter_trained: bool | None = None
    failed_source: str | None = None    # llm_repair: the child that failed ...
    failure: str | None = None          # ... and the error text it failed with

    def alerts(self) -> list[dict[str, Any]]:
        alerts = self.health_report.get("alerts") or self.health_report.get("findings") or []
        return [a if isinstance(a, dict) else {"message": str(a)} for a in alerts]

    def named_weight(self, name: str) -> float:
        """The draw weight the alerts give ``name`` (a knob): ``NAMED_WEIGHT`` of the most severe alert
        whose text names it as a whole word, 1 when none does."""
        pattern = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(name.lower())}(?![A-Za-z0-9_])")
        weights = [NAMED_WEIGHT.get(str(a.get("severity")), NAMED_WEIGHT["info"]) for a in self.alerts()
                   if pattern.search(" ".join(str(v) for v in a.values()).lower())]
        return max(weights, default=1.0)

    def triage(self, names: list[str]) -> list[str] | None:
        """The ``names`` (knobs) that a firing ``BLOCKING`` alert names as whole words, in their order;
        None when no blocking alert fires (every name is open)."""
        blocking = [a for a in self.alerts() if (a.get("name") or a.get("rule")) in BLOCKING]
        if not blocking:
            return None
        text = " ".join(str(v) for a in blocking for v in a.values()).lower()
        return [n for n in names if re.search(rf"(?<![A-Za-z0-9_]){re.escape(n.lower())}(?![A-Za-z0-9_])", text)]

    def triage_direction(self) -> str | None:
        """The way ("up" or "down") a firing blocking alert asks its knobs to move; None when none fires."""
        return next((BLOCKING[n] for a in self.alerts() if (n := a.get("name") or a.get("rule")) in BLOCKING), None)

    def summary(self) -> dict[str, Any]:
        """What an intervention records as the evidence it used (small, JSON-able)."""
        return {
            "alerts": [a.get("rule") or a.get("name") or a.get("message", "") for a in self.alerts()],
            "skills": [s.get("id") or s.get("name") or s.get("trigger", "") for s in self.skills],
            "history": len(self.history),
            **({"gaps": [g.get("engine_checks") for g in self.gaps]} if self.gaps else {}),
            **({"failure": self.failure[:500]} if self.failure else {}),
        }

    def has_report(self) -> bool:
        """Whether there is a report to diagnose: metrics or alerts an operator can read."""
        r = self.health_report
        return bool(r.get("metrics") or r.get("engine") or r.get("harness_metrics") or self.alerts())

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Evidence:
        """Evidence from a JSON file: a bare health report (as ``health.json`` holds it) or the wrapper
        ``{"health_report": ..., "skills": ..., "history": ...}``; ``ValueError`` for anything else.

        The wrapper is told by its ``health_report`` field alone: a real report has fields of the same
        names as the wrapper's (its ``history`` is the per-step metrics), so those cannot tell them apart."""
        shape = evidence_shape(d)
        if shape is None:
            raise ValueError(f"neither a health report (no field of {', '.join(sorted(REPORT_FIELDS))}) nor "
                             "an evidence wrapper (no field 'health_report'); got fields "
                             f"{', '.join(sorted(d)) or 'none'}")
        if shape == "report":
            return cls(health_report=d)
        return cls(health_report=d.get("health_report") or {}, skills=list(d.get("skills") or []),
                   history=list(d.get("history") or []), known_hashes=set(d.get("known_hashes") or []),
                   refuted=set(d.get("refuted") or []),
                   gaps=list(d.get("gaps") or []),
                   allow_multi_factor=bool(d.get("allow_multi_factor", False)),
                   adapter_trained=d.get("adapter_trained"),
                   failed_source=d.get("failed_source"), failure=d.get("failure"))


# Fields only a health report has (``HealthReport.to_dict`` writes all of them but ``findings``, an
# older name of ``alerts``; a hand-written report has at least its metrics or alerts).
REPORT_FIELDS = frozenset({"metrics", "engine", "harness_metrics", "alerts", "findings", "validity", "genome_hash"})


def evidence_shape(d: dict[str, Any]) -> str | None:
    """``"wrapper"`` (it has ``health_report``), ``"report"`` (a report's own fields), or None."""
    if "health_report" in d:
        return "wrapper"
    return "report" if REPORT_FIELDS & d.keys() else None
