"""The Operator protocol, the Evidence it reads, and the checks every child must pass.

An operator turns parent genome(s) plus evidence into an ``Intervention``, or raises
``OperatorError`` with a reason and a kind (used for per-operator rejection counts). Every
operator ends with ``make_intervention``, which applies the same acceptance rules to all of
them: the child must differ from its parent, must not duplicate a known genome, must change one
factor only (unless multi-factor children are allowed), and must pass the harness contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from evotrainer.operators.intervention import ExpectedEffect, Intervention, unified_diff

if TYPE_CHECKING:
    from evotrainer.genome.program import HarnessProgram

# Why a proposal was rejected; the registry counts rejections per operator by these kinds.
REJECTION_KINDS = (
    "parse",          # the LLM reply did not follow the reply format
    "edit",           # SEARCH/REPLACE or hook rewrite could not be applied
    "contract",       # the child breaks the harness contract
    "sandbox",        # the child fails when run
    "single_factor",  # the child changes more than one factor
    "no_change",      # the child is its parent
    "duplicate",      # the child is a genome already known
    "budget",         # the LLM budget is spent
    "llm",            # the LLM call failed
    "input",          # the operator cannot work on these parents/evidence
)


class OperatorError(Exception):
    """An operator could not produce a valid child. ``reason`` says why, for logs and counters.

    ``child_source`` is set when a child was built but failed a check (contract, sandbox), so that
    ``llm_repair`` can be asked to fix it.
    """

    def __init__(self, reason: str, kind: str = "input", child_source: str | None = None,
                 prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        super().__init__(f"[{kind}] {reason}")
        self.reason = reason
        self.kind = kind   # one of REJECTION_KINDS for built-ins; a user operator may add its own
        self.child_source = child_source
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens


@dataclass
class Evidence:
    """What an operator may base a proposal on."""

    health_report: dict[str, Any] = field(default_factory=dict)   # metrics, alerts (findings), validity
    skills: list[dict[str, Any]] = field(default_factory=list)    # skills whose trigger fires
    history: list[dict[str, Any]] = field(default_factory=list)   # earlier interventions and outcomes
    known_hashes: set[str] = field(default_factory=set)           # genomes already tried (duplicates)
    allow_multi_factor: bool = False
    failed_source: str | None = None    # llm_repair: the child that failed ...
    failure: str | None = None          # ... and the error text it failed with

    def alerts(self) -> list[dict[str, Any]]:
        alerts = self.health_report.get("alerts") or self.health_report.get("findings") or []
        return [a if isinstance(a, dict) else {"message": str(a)} for a in alerts]

    def summary(self) -> dict[str, Any]:
        """What an intervention records as the evidence it used (small, JSON-able)."""
        return {
            "alerts": [a.get("rule") or a.get("name") or a.get("message", "") for a in self.alerts()],
            "skills": [s.get("id") or s.get("name") or s.get("trigger", "") for s in self.skills],
            "history": len(self.history),
            **({"failure": self.failure[:500]} if self.failure else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Evidence:
        """Evidence from a JSON file: either a bare health report or ``{"health_report": ...}``."""
        if "health_report" not in d and not {"skills", "history", "known_hashes"} & d.keys():
            return cls(health_report=d)
        return cls(health_report=d.get("health_report") or {}, skills=list(d.get("skills") or []),
                   history=list(d.get("history") or []), known_hashes=set(d.get("known_hashes") or []),
                   allow_multi_factor=bool(d.get("allow_multi_factor", False)),
                   failed_source=d.get("failed_source"), failure=d.get("failure"))


@runtime_checkable
class Operator(Protocol):
    name: str   # the registered name; an operator may also set ``n_parents = 2`` (crossovers)

    def propose(self, parents: list[HarnessProgram], evidence: Evidence) -> Intervention: ...


def make_intervention(
    operator: str, parents: list[HarnessProgram], child: HarnessProgram, evidence: Evidence, *,
    hypothesis: str, expected_effect: ExpectedEffect | None, prompt_tokens: int = 0, completion_tokens: int = 0,
    details: dict[str, Any] | None = None, check_contract: bool = True, factors: list[str] | None = None,
) -> Intervention:
    """Checks ``child`` against the acceptance rules and wraps it as an Intervention.

    The single-factor rule is judged against the first parent: a crossover child is its first
    parent with one factor taken from the second. ``factors`` may be passed by an operator that
    knows them by construction (``with_knobs`` changes one value literal), which skips the AST
    comparison of every hook.
    """
    from evotrainer.genome.edits import factors_changed
    from evotrainer.genome.errors import ContractError

    tokens = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    base = parents[0]
    try:
        # Both need the child's syntax tree: a child that does not parse fails the contract here.
        child_hash = child.hash
        factors = list(factors) if factors is not None else list(factors_changed(base, child))
    except ContractError as err:
        raise OperatorError(f"contract check failed: {err}", "contract", child_source=child.source,
                            **tokens) from err
    if child_hash == base.hash:
        raise OperatorError("the child is identical to its parent", "no_change", **tokens)
    if child_hash in evidence.known_hashes or any(child_hash == p.hash for p in parents):
        raise OperatorError(f"the child duplicates known genome {child_hash[:12]}", "duplicate", **tokens)
    if not factors:
        # Hash differs but no declared factor does: a change outside knobs/hooks (comments, helpers).
        raise OperatorError("the child changes no knob or hook", "no_change", **tokens)
    if len(factors) > 1 and not evidence.allow_multi_factor:
        raise OperatorError(f"the child changes {len(factors)} factors ({', '.join(factors)}); "
                            "one per child", "single_factor", child_source=child.source, **tokens)
    if check_contract:
        _check_contract_and_load(child, tokens)
    return Intervention(
        operator=operator, parent_hashes=[p.hash for p in parents], child_source=child.source,
        child_hash=child.hash, diff=unified_diff(base.source, child.source, base.hash[:12], child.hash[:12]),
        factor=factors[0], factors=factors, hypothesis=hypothesis, expected_effect=expected_effect,
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, evidence=evidence.summary(),
        details=dict(details or {}),
    )


def _check_contract_and_load(child: HarnessProgram, tokens: dict[str, int]) -> None:
    """The static contract check, then loading the child in the sandbox (its module-level code
    runs there, never here): what the engine requires before it accepts a genome."""
    from evotrainer.genome.contract import check_contract
    from evotrainer.genome.errors import ContractError
    from evotrainer.genome.sandbox import Sandbox, SandboxError

    try:
        check_contract(child)
    except ContractError as err:
        raise OperatorError(f"contract check failed: {err}", "contract", child_source=child.source,
                            **tokens) from err
    try:
        with Sandbox(child, check=False):   # entering starts the worker, which loads the harness
            pass
    except SandboxError as err:
        kind = "contract" if err.failure.kind == "contract" else "sandbox"
        raise OperatorError(f"the child does not load in the sandbox: {err.failure}", kind,
                            child_source=child.source, **tokens) from err
