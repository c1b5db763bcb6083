"""The Operator protocol and the error an operator raises when it cannot make a valid child.

An operator turns parent genome(s) plus evidence (``operators/evidence.py``) into an
``Intervention``, or raises ``OperatorError`` with a reason and a kind (used for per-operator
rejection counts). Every operator ends with ``make_intervention`` (``operators/acceptance.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from evotrainer.operators.evidence import Evidence
from evotrainer.operators.intervention import Intervention

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


@runtime_checkable
class Operator(Protocol):
    name: str   # the registered name; an operator may also set ``n_parents = 2`` (crossovers)

    def propose(self, parents: list[HarnessProgram], evidence: Evidence) -> Intervention: ...
