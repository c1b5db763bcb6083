"""The run's history: one typed record for each proposal, revert and human decision, in the order they
happened.

A :class:`ProposalRecord` is written when an operator proposes a child (or fails to), and its outcome is
updated as the child moves on: ``accepted`` when the child is made, then the gate's verdict. A
:class:`RevertRecord` is written when selection sends a regressed survivor back to an ancestor, and a
:class:`HumanRecord` when a person decides at a human gate. The run state (``records/run_state.py``) keeps
the list; on disk each record is the flat JSON object earlier runs wrote (``to_dict``/``from_dict``), so a
run from before these types loads unchanged, and the operators' evidence (``operators/evidence.py``) is
that same JSON: an operator a user wrote reads dicts, whatever the loop keeps.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from typing import Any, Union


class Outcome(StrEnum):
    """What became of a proposal (the last five are a version's status, ``records/version.py``)."""
    ACCEPTED = "accepted"                     # made into a pending child, not judged yet
    OPERATOR_REJECTED = "operator_rejected"   # no valid child came out of the operators
    BACKTEST_REJECTED = "backtest_rejected"   # refused on the parent's cached rollouts, before training
    MERGE_REFUSED = "merge_refused"           # two adapters that cannot be merged
    ABORTED = "aborted"                       # a person stopped it before it trained
    REVERTED = "reverted"                     # (RevertRecord only)
    PROMOTED = "promoted"
    KEPT = "kept"
    REJECTED = "rejected"
    INVALID = "invalid"
    PRUNED = "pruned"


GATED = frozenset({Outcome.PROMOTED, Outcome.KEPT, Outcome.REJECTED, Outcome.INVALID})   # a gate decided
LOST = frozenset({Outcome.REJECTED, Outcome.INVALID})


@dataclass
class ProposalRecord:
    """One proposed change: who proposed what on which parent, and what became of it."""
    generation: int
    parent: str
    parent_hash: str | None = None
    outcome: Outcome = Outcome.ACCEPTED
    operator: str | None = None
    factor: str | None = None
    entry: str | None = None                 # the library entry it came from
    hypothesis: str | None = None
    expected: dict[str, Any] | None = None   # the intervention's expected effect
    child: str | None = None                 # the version it made (accepted and after)
    merge: list[str] | None = None           # a merge child's two parents
    combination: str | None = None           # ... and how their adapters were combined
    compound: str | None = None              # a compound child: the factor it took from another lineage
    kind: str | None = None                  # operator_rejected: the kind of error
    reason: str | None = None
    reasons: list[str] | None = None         # backtest_rejected: the backtest's reasons
    heldout_accuracy: float | None = None    # the gate's numbers, once it judged the child
    paired_delta: float | None = None
    hypothesis_verdict: str | None = None    # confirmed | refuted | untestable
    revised: bool = False                    # a person replaced the proposal at a human gate
    extra: dict[str, Any] = field(default_factory=dict)   # fields no reader here knows: kept, never dropped

    @property
    def lost(self) -> bool:
        """Whether the child lost on fitness: rejected or invalid, or kept or pruned without beating its control."""
        return self.outcome in LOST or (self.outcome in (Outcome.KEPT, Outcome.PRUNED)
                                        and self.paired_delta is not None and self.paired_delta <= 0)


@dataclass
class RevertRecord:
    """Selection sent a survivor that regressed (``parent``) back to an ancestor (``to``)."""
    generation: int
    parent: str
    to: str
    reason: str
    outcome: Outcome = Outcome.REVERTED
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class HumanRecord:
    """A person's decision on ``version`` at a human gate (``loop/human/``)."""
    generation: int
    point: str            # diagnosis | design | backtest | completion
    version: str
    action: str           # approve | abort | revise
    by: str
    at: str
    reason: str = ""
    note: str | None = None   # revise at diagnosis: the hint operators see
    extra: dict[str, Any] = field(default_factory=dict)   # what a revision changed (outcome, previous, ...)


HistoryRecord = Union[ProposalRecord, RevertRecord, HumanRecord]


def to_dict(record: HistoryRecord) -> dict[str, Any]:
    """The record as the flat JSON object the run state stores and operators read (unset fields left out)."""
    out: dict[str, Any] = {}
    for f in fields(record):
        value = getattr(record, f.name)
        if f.name == "extra" or value is None or value is False:
            continue
        out["human_gate" if isinstance(record, HumanRecord) and f.name == "point" else f.name] = \
            str(value) if isinstance(value, Outcome) else value
    if isinstance(record, RevertRecord):   # a revert is named like a proposal: operator and factor "revert"
        out.update(operator="revert", factor="revert")
    return {**out, **record.extra}


def from_dict(data: dict[str, Any]) -> HistoryRecord:
    """The record a stored JSON object holds; ``ValueError`` naming what is wrong with a damaged one."""
    if not isinstance(data, dict):
        raise ValueError(f"a history record must be a JSON object, not {type(data).__name__}")
    data = dict(data)
    if "human_gate" in data:
        data["point"] = data.pop("human_gate")
        kind: type = HumanRecord
    elif data.get("outcome") == Outcome.REVERTED:
        for name in ("operator", "factor"):   # written for readers that take a revert for a proposal
            data.pop(name, None)
        kind = RevertRecord
    else:
        kind = ProposalRecord
    known = {f.name for f in fields(kind)} - {"extra"}
    missing = [f.name for f in fields(kind) if f.name in known and f.name not in data
               and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ValueError(f"a {kind.__name__} lacks {', '.join(missing)}: {str(data)[:120]}")
    if "outcome" in data and "outcome" in known:   # (a human record's "outcome" is what a revision changed)
        try:
            data["outcome"] = Outcome(data["outcome"])
        except ValueError:
            raise ValueError(f"unknown outcome {data['outcome']!r}; one of {', '.join(o.value for o in Outcome)}") from None
    if not isinstance(data["generation"], int) or isinstance(data["generation"], bool):
        raise ValueError(f"a history record's generation must be an integer, not {data['generation']!r:.40}")
    record = kind(**{k: v for k, v in data.items() if k in known})
    record.extra = {k: v for k, v in data.items() if k not in known}
    return record


def proposals(history: list[HistoryRecord]) -> list[ProposalRecord]:
    return [h for h in history if isinstance(h, ProposalRecord)]


def proposal_of(history: list[HistoryRecord], child: str) -> ProposalRecord | None:
    """The record of the proposal that made ``child`` (None for a seed, a continuation, or a child the
    history lost in a crash before the state was saved)."""
    return next((h for h in history if isinstance(h, ProposalRecord) and h.child == child), None)


def human_records(history: list[HistoryRecord]) -> list[HumanRecord]:
    return [h for h in history if isinstance(h, HumanRecord)]
