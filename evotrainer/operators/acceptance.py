"""The acceptance rules every child must pass, whichever operator made it.

The child must differ from its parent, must not duplicate a known genome, must change one factor
only (unless multi-factor children are allowed), and must pass the harness contract, including
loading in the sandbox (its module-level code runs there, never in the engine's process).

A knob that only the changed hook read (``scale_rewards`` under a new ``advantages`` that does not
scale) is part of that change: the child may remove it or leave it declared, and a declaration left
behind is removed here, since the contract refuses a knob nothing reads.
"""

from __future__ import annotations

from typing import Any

from evotrainer.genome.contract import check_contract
from evotrainer.genome.edits import drop_knobs, factors_changed, orphaned_knobs
from evotrainer.genome.errors import ContractError, EditError
from evotrainer.genome.program import HarnessProgram
from evotrainer.genome.sandbox import Sandbox, SandboxError
from evotrainer.operators.base import OperatorError
from evotrainer.operators.evidence import Evidence
from evotrainer.operators.intervention import ExpectedEffect, Intervention, unified_diff


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
    tokens = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    base = parents[0]
    try:
        if factors is None:
            child = _without_orphaned_knobs(base, child)
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


def _without_orphaned_knobs(parent: HarnessProgram, child: HarnessProgram) -> HarnessProgram:
    """The child without the declarations of knobs its hook change left unread."""
    left = [k for k in orphaned_knobs(parent, child) if k in child.knobs]
    if not left:
        return child
    try:
        return drop_knobs(child, left)
    except EditError:
        return child   # left as written: the contract check names the unread knob


def _check_contract_and_load(child: HarnessProgram, tokens: dict[str, int]) -> None:
    """The static contract check, then loading the child in the sandbox (its module-level code
    runs there, never here): what the engine requires before it accepts a genome."""
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
