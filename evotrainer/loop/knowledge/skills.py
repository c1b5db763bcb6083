"""Skills: intervention patterns that gates confirmed, kept per run and across experiments.

A skill says "when the health report looks like *trigger*, the change *intervention* moved *expected
outcome*, here is the evidence". The trigger is data (``{"metric", "op", "value"}`` conditions that must
all hold), never code, so a library read from disk cannot run anything. Skills are made only from
confirmed interventions (a gate promoted the child) and identified by factor + normalised diff: the same
change confirmed again, on another branch or in another experiment, adds evidence to the same skill.

* **validated** once it has ``validate_after`` confirmations (distinct versions; default 2);
* **scope** ``domain`` at first (it is retrieved only in the domains where it held), ``general`` once it
  held in two domains.

``SkillLibrary`` is one JSON file written atomically under a file lock (a run's ``skills.json``, or the
user-level ``$EVOTRAINER_HOME/skills.json`` that several experiments may merge into at once).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evotrainer.records.outcome import GateOutcome
from evotrainer.records.version import exclusive, write_atomic
from evotrainer.operators.triggers import holds, report_metrics
from evotrainer.records.numeric import finite_or_none as _finite

NEGATION = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}
DECREASING = {"<", "<=", "delta<"}        # expected effects that push their metric down
FORMAT = 1


class SkillLibraryError(ValueError):
    """A skill library file that is not one (the message names the file and says nothing changed)."""


def user_library_path() -> Path:
    return Path(os.environ.get("EVOTRAINER_HOME") or "~/.evotrainer").expanduser() / "skills.json"



def normalise_diff(diff: str) -> str:
    """Only the changed lines, whitespace collapsed: the same edit made on parents whose surrounding code
    or line numbers differ is the same skill."""
    lines = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---", "@@")) or not line.startswith(("+", "-")):
            continue
        body = " ".join(line[1:].split())
        if body:
            lines.append(line[0] + body)
    return "\n".join(lines)


def skill_id(factor: str, change: str) -> str:
    return "skill-" + hashlib.sha256(f"{factor}\n{normalise_diff(change) or change}".encode()).hexdigest()[:12]


def derive_trigger(expected: dict[str, Any] | None, metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """The parent's state that the intervention fixed.

    The claim "dead_group_ratio < 0.3" was worth making because it did not hold: the trigger is its
    negation ("dead_group_ratio >= 0.3"). For a delta claim, or a negation the parent did not meet, the
    trigger is the metric's value then (a decrease was wanted from >= that value, an increase from <=).
    Without an expected effect on a measured metric, the alerts that fired (``alert:<name>`` metrics,
    see ``report_metrics``) are the trigger. An empty trigger never fires: the skill is listed, not retrieved.
    """
    if expected and (then := _finite(metrics.get(expected.get("metric")))) is not None:
        metric, op = expected["metric"], expected["op"]
        if op in NEGATION:
            negated = {"metric": metric, "op": NEGATION[op], "value": float(expected["value"])}
            if holds(negated, metrics):
                return [negated]
        return [{"metric": metric, "op": ">=" if op in DECREASING else "<=", "value": then}]
    return [{"metric": k, "op": "==", "value": 1.0} for k, v in sorted(metrics.items())
            if k.startswith("alert:") and _finite(v) == 1.0]


def _evidence(decision: dict[str, Any]) -> tuple[float | None, list[float] | None]:
    """Effect size and CI from a gate decision (``GateDecision.to_dict()`` or a flat record)."""
    paired = decision.get("paired") if isinstance(decision.get("paired"), dict) else decision
    effect = next((x for k in ("mean_delta", "effect", "delta") if (x := _finite(paired.get(k))) is not None), None)
    ci = decision.get("ci") or paired.get("ci")
    if ci is None and "ci_low" in paired:
        ci = [paired["ci_low"], paired["ci_high"]]
    return effect, [float(c) for c in ci] if ci else None


def _fmt_cond(c: dict[str, Any]) -> str:
    return f"{c['metric']} {c['op']} {c['value']:g}"


@dataclass
class Skill:
    id: str
    factor: str
    trigger: list[dict[str, Any]]                  # all must hold: {"metric", "op", "value"}
    intervention: dict[str, Any]                   # {"factor", "diff"} or {"factor", "template"}
    expected_outcome: dict[str, Any] | None = None  # {"metric", "op", "value"}
    hypothesis: str = ""
    evidence: list[dict[str, Any]] = field(default_factory=list)  # {"run", "version", "parent", "effect", "ci", "domain"}
    domains: list[str] = field(default_factory=list)
    validated: bool = False
    scope: str = "domain"                          # "domain" until it held in two domains, then "general"
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)

    @property
    def confirmations(self) -> int:
        return len(self.evidence)

    @property
    def mean_effect(self) -> float | None:
        effects = [e["effect"] for e in self.evidence if e.get("effect") is not None]
        return sum(effects) / len(effects) if effects else None

    def fires(self, metrics: dict[str, Any]) -> bool:
        return bool(self.trigger) and all(holds(c, metrics) for c in self.trigger)

    def applies_to(self, domain: str | None) -> bool:
        return domain is None or self.scope == "general" or domain in self.domains

    def add_evidence(self, item: dict[str, Any], validate_after: int) -> bool:
        """Add one confirmation unless that version already confirmed it (a resumed run repeats calls)."""
        if any((e.get("run"), e.get("version")) == (item.get("run"), item.get("version")) for e in self.evidence):
            return False
        self.evidence.append(item)
        if item.get("domain") and item["domain"] not in self.domains:
            self.domains.append(item["domain"])
        self.updated = time.time()
        self.refresh(validate_after)
        return True

    def widen(self, trigger: list[dict[str, Any]]) -> None:
        """Another confirmation from a milder state: loosen matching thresholds to cover both."""
        for new in trigger:
            for c in self.trigger:
                if (c["metric"], c["op"]) == (new["metric"], new["op"]):
                    pick = min if c["op"] in (">", ">=") else max if c["op"] in ("<", "<=") else None
                    c["value"] = pick(c["value"], new["value"]) if pick else c["value"]

    def refresh(self, validate_after: int) -> None:
        self.validated = self.confirmations >= validate_after
        self.scope = "general" if len(self.domains) >= 2 else "domain"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "confirmations": self.confirmations}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Skill:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def prompt_dict(self) -> dict[str, Any]:
        """What an operator prompt shows (the keys ``operators.prompts.skills_text`` reads)."""
        change = self.intervention.get("diff") or self.intervention.get("template") or ""
        effect = self.mean_effect
        cis = ", ".join(f"[{e['ci'][0]:+.3f}, {e['ci'][1]:+.3f}]" for e in self.evidence if e.get("ci"))
        return {"id": self.id, "trigger": " and ".join(map(_fmt_cond, self.trigger)) or "(none)",
                "intervention": f"{self.factor}: {change[:800]}",
                "expected_outcome": _fmt_cond(self.expected_outcome) if self.expected_outcome else "(not stated)",
                "evidence": (f"{self.confirmations} confirmation(s) in {', '.join(self.domains) or '?'}"
                             + (f"; mean held-out effect {effect:+.3f}" if effect is not None else "")
                             + (f"; CIs {cis}" if cis else "")
                             + ("; validated" if self.validated else "; not yet validated")),
                "scope": self.scope, "confirmations": self.confirmations,
                **({"entry": self.intervention["entry"]} if self.intervention.get("entry") else {})}


class SkillLibrary:
    def __init__(self, path: str | Path, validate_after: int = 2, run: str | None = None):
        self.path = Path(path)
        self.validate_after = validate_after
        self.run = run if run is not None else str(self.path.resolve().parent)   # names evidence across runs
        self.skills: dict[str, Skill] = {}
        self.load()

    @classmethod
    def user(cls, validate_after: int = 2) -> SkillLibrary:
        return cls(user_library_path(), validate_after=validate_after)

    def load(self) -> None:
        if not self.path.is_file():
            self.skills = {}
            return
        # Never drop a library others wrote into: anything but the shape save() writes is refused
        # before a line of it is overwritten.
        fix = "nothing was changed; fix the file or move it aside"
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SkillLibraryError(f"skill library {self.path} is not valid JSON ({e}); {fix}") from None
        if not isinstance(data, dict) or not isinstance(data.get("skills", []), list):
            got = type(data).__name__ if not isinstance(data, dict) else "skills that are not a list"
            raise SkillLibraryError(f"skill library {self.path}: expected {{\"format\": {FORMAT}, \"skills\": [...]}}, "
                                    f"got {got}; {fix}")
        unknown = sorted(set(data) - {"format", "validate_after", "skills"})
        if unknown or not isinstance(data.get("format", FORMAT), int) or data.get("format", FORMAT) > FORMAT:
            raise SkillLibraryError(f"skill library {self.path}: format {data.get('format')!r}"
                                    + (f" with unknown fields {unknown}" if unknown else "")
                                    + f" is not one this version of evotrainer writes (format {FORMAT}); {fix}")
        skills = {}
        for i, d in enumerate(data.get("skills", [])):
            try:
                skills[d["id"]] = Skill.from_dict(d)
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise SkillLibraryError(f"skill library {self.path}: skill {i} is not a skill record "
                                        f"({type(e).__name__}: {e}); {fix}") from None
        self.skills = skills
        for s in self.skills.values():
            s.refresh(self.validate_after)

    def save(self) -> None:
        data = {"format": FORMAT, "validate_after": self.validate_after,
                "skills": [s.to_dict() for s in sorted(self.skills.values(), key=lambda s: s.created)]}
        write_atomic(self.path, json.dumps(data, indent=2, default=str))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Read-modify-write under an exclusive lock, reloading first: several runs share the user library."""
        with exclusive(self.path):
            self.load()
            yield
            self.save()

    def __len__(self) -> int:
        return len(self.skills)

    def __iter__(self) -> Iterator[Skill]:
        return iter(sorted(self.skills.values(), key=lambda s: (not s.validated, -s.confirmations, s.created)))

    def get(self, skill_id_: str) -> Skill | None:
        return self.skills.get(skill_id_)

    def observe(self, outcome: GateOutcome) -> None:
        """A gate's outcome: a promoted child whose hypothesis held becomes (or confirms) a skill."""
        if outcome.promoted and outcome.intervention and outcome.verdict == "confirmed":
            report = outcome.parent_report
            trigger = report_metrics(json.loads(report.read_text())) if report and report.is_file() else {}
            self.record_confirmed(outcome.intervention, outcome.decision, outcome.domain, trigger,
                                  version=outcome.child, parent=outcome.control)

    def record_confirmed(self, intervention: dict[str, Any], decision: dict[str, Any], domain: str,
                         trigger_metrics: dict[str, Any], version: str | None = None,
                         parent: str | None = None) -> Skill:
        """A gate confirmed ``intervention``: create its skill or add the confirmation to it.

        ``trigger_metrics`` are the parent's health-report metrics when the intervention was proposed
        (``report_metrics(report)`` adds its alerts). Repeating a call for the same version is a no-op.
        """
        if decision.get("promote") is False or decision.get("valid") is False:
            raise ValueError("only an intervention a gate confirmed (promoted and valid) becomes a skill")
        factor = intervention.get("factor") or "unknown"
        change = intervention.get("diff") or intervention.get("template") or ""
        if not change.strip():
            raise ValueError("an intervention without a diff or template cannot become a skill")
        expected = intervention.get("expected_effect") or intervention.get("expected_outcome")
        trigger = derive_trigger(expected, trigger_metrics)
        effect, ci = _evidence(decision)
        item = {"run": self.run, "version": version or decision.get("child") or decision.get("version"),
                "parent": parent or decision.get("parent"), "effect": effect, "ci": ci, "domain": domain}
        if item["version"] is None:
            raise ValueError("a confirmation needs the confirming version (decision['child'] or version=)")
        sid = skill_id(factor, change)
        with self._locked():
            skill = self.skills.get(sid)
            fresh = skill is None
            if fresh:
                kind = "diff" if intervention.get("diff") else "template"
                # The library entry it came from, so that later runs' library operators can prefer it.
                entry = (intervention.get("details") or {}).get("entry")
                skill = self.skills[sid] = Skill(
                    id=sid, factor=factor, trigger=trigger,
                    intervention={"factor": factor, kind: change, **({"entry": entry} if entry else {})},
                    expected_outcome=dict(expected) if expected else None,
                    hypothesis=str(intervention.get("hypothesis") or ""))
            if skill.add_evidence(item, self.validate_after) and not fresh:
                skill.widen(trigger)
        return skill

    def matching(self, metrics: dict[str, Any], domain: str | None = None) -> list[Skill]:
        """Skills whose trigger fires on ``metrics`` and that apply in ``domain``: validated first,
        then the most confirmed, then the largest mean effect."""
        found = [s for s in self.skills.values() if s.applies_to(domain) and s.fires(metrics)]
        return sorted(found, key=lambda s: (not s.validated, s.scope != "general", -s.confirmations,
                                            -(s.mean_effect or 0.0)))

    def merge_into(self, other: SkillLibrary) -> int:
        """Add this library's skills and evidence to ``other`` (e.g. the user library); returns how many
        skills were created or gained evidence there. Merging twice adds nothing the second time."""
        changed = 0
        with other._locked():
            for s in self.skills.values():
                target = other.skills.get(s.id)
                if target is None:
                    target = other.skills[s.id] = Skill.from_dict(
                        {**copy.deepcopy(s.to_dict()), "evidence": [], "domains": []})
                if sum(target.add_evidence(dict(e), other.validate_after) for e in s.evidence):
                    target.widen(s.trigger)
                    changed += 1
                target.refresh(other.validate_after)
        return changed
