"""Intervention: one proposed single-factor change of a harness, with the claim it must meet.

An intervention is the unit the engine backtests, trains, gates and records. It carries the child
genome's source (the change itself), a unified diff for people and MLflow, the factor it touches, a
falsifiable hypothesis and an ``ExpectedEffect``: a statement about one metric that can be checked
mechanically against metrics measured before and after (on cached rollouts in a backtest, or after
training). It is plain data: ``to_dict``/``from_dict`` round-trip through JSON.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, field
from typing import Any
from evotrainer.records.numeric import finite_or_none as _finite
from evotrainer.genome.program import HarnessProgram

# "<", ">", "<=", ">=" compare the metric after the change with ``value``;
# "delta<", "delta>" compare the change (after - before) with ``value``.
EFFECT_OPS = ("<", ">", "<=", ">=", "delta<", "delta>")

# The metric non-LLM operators (knobs, crossover) claim to improve: the fitness, held-out accuracy.
FITNESS_METRIC = "heldout_accuracy"
_OLD_NAMES = {"heldout_score": FITNESS_METRIC}   # what earlier records and skills called it


@dataclass(frozen=True)
class ExpectedEffect:
    """A checkable claim about one metric, e.g. ``dead_group_ratio < 0.3``."""
    metric: str
    op: str
    value: float

    def __post_init__(self) -> None:
        if self.op not in EFFECT_OPS:
            raise ValueError(f"unknown effect operator {self.op!r}; use one of {', '.join(EFFECT_OPS)}")
        if not self.metric:
            raise ValueError("an expected effect needs a metric name")
        object.__setattr__(self, "metric", _OLD_NAMES.get(self.metric, self.metric))
        object.__setattr__(self, "value", float(self.value))

    def check(self, before: dict[str, float], after: dict[str, float]) -> bool:
        """True when ``after`` (and ``before`` for deltas) meets the claim.

        A metric that is missing or not a finite number cannot confirm a claim, so it fails it:
        an intervention is only credited with effects that were actually measured.
        """
        now = _finite(after.get(self.metric))
        if now is None:
            return False
        if self.op.startswith("delta"):
            then = _finite(before.get(self.metric))
            if then is None:
                return False
            delta = now - then
            return delta < self.value if self.op == "delta<" else delta > self.value
        return {
            "<": now < self.value, ">": now > self.value, "<=": now <= self.value, ">=": now >= self.value,
        }[self.op]

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "op": self.op, "value": self.value}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExpectedEffect:
        return cls(metric=str(d["metric"]), op=str(d["op"]), value=float(d["value"]))



def unified_diff(parent_source: str, child_source: str, parent_name: str = "parent", child_name: str = "child") -> str:
    """The change as unified diff text (what reviewers and MLflow artifacts show)."""
    return "".join(difflib.unified_diff(
        parent_source.splitlines(keepends=True), child_source.splitlines(keepends=True),
        fromfile=f"a/{parent_name}.py", tofile=f"b/{child_name}.py",
    ))


@dataclass
class Intervention:
    operator: str                       # registered name of the operator that proposed it
    parent_hashes: list[str]            # one parent, or two for a crossover (first is the base)
    child_source: str
    child_hash: str
    diff: str                           # unified diff from the first parent to the child
    factor: str                         # e.g. "knob:learning_rate", "hook:reward"
    hypothesis: str                     # "if X changes, Y moves, because Z"
    expected_effect: ExpectedEffect | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    evidence: dict[str, Any] = field(default_factory=dict)   # what the operator was shown (summary)
    factors: list[str] = field(default_factory=list)         # all factors touched (more than one only if allowed)
    details: dict[str, Any] = field(default_factory=dict)    # operator-specific (knob value, trial number, ...)

    def check(self, before: dict[str, float], after: dict[str, float]) -> bool:
        """Whether the measured metrics meet the expected effect (False when none was stated)."""
        return self.expected_effect is not None and self.expected_effect.check(before, after)

    def child(self):
        """The child genome as a ``HarnessProgram``."""

        return HarnessProgram(self.child_source)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["expected_effect"] = self.expected_effect.to_dict() if self.expected_effect else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Intervention:
        d = dict(d)
        effect = d.get("expected_effect")
        d["expected_effect"] = ExpectedEffect.from_dict(effect) if effect else None
        return cls(**d)
