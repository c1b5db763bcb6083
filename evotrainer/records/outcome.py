"""What a gate decided about one child, as its listeners are told it.

The gate stage (``loop/stages/gating.py``) judges a child against its control, then tells every listener the
outcome: the operator mix credits the operator and library entry that proposed it and passes the
outcome on to that operator (the knobs operator's Optuna study is told the paired delta, as an Optuna
sampler is told a trial's result), and the skill library turns a promoted child whose hypothesis held
into a skill. The gate does not know who listens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from evotrainer.records.version import Status


@dataclass(frozen=True)
class GateOutcome:
    child: str                        # the gated version
    control: str | None               # what it was compared with (its sibling continuation, or its parent)
    operator: str | None              # the operator that proposed it
    entry: str | None                 # the library entry it came from, if any
    genome_hash: str
    status: Status                    # promoted | kept | rejected | invalid
    paired_delta: float | None        # child - control on the gate draw
    heldout_accuracy: float | None
    verdict: str | None               # its hypothesis: confirmed | refuted | untestable
    domain: str
    intervention: dict[str, Any] | None = None
    decision: dict[str, Any] = field(default_factory=dict)
    parent_report: Path | None = None   # the parent's health.json: the state it was proposed in

    @property
    def promoted(self) -> bool:
        return self.status == Status.PROMOTED


class GateListener(Protocol):
    def observe(self, outcome: GateOutcome) -> None: ...
