"""Structural crossover: the first parent with one factor (a knob or a hook) of the second.

No LLM is involved: the operator lists the factors where the parents differ and takes one,
preferring factors the health report's alerts mention, then at random (seeded). A factor whose
child would duplicate a known genome, or that cannot be carried over (a helper that differs
between the parents), is skipped in favour of the next one.
"""

from __future__ import annotations

import random

from evotrainer.operators.acceptance import make_intervention
from evotrainer.operators.base import OperatorError
from evotrainer.operators.evidence import Evidence
from evotrainer.operators.intervention import FITNESS_METRIC, ExpectedEffect, Intervention
from evotrainer.genome.edits import crossover, factors_changed
from evotrainer.genome.errors import GenomeError


class CrossoverOperator:
    name = "crossover"
    n_parents = 2

    def __init__(self, seed: int = 0, factor: str | None = None) -> None:
        self.rng = random.Random(seed)
        self.factor = factor    # always take this factor (when the parents differ in it)

    def _order(self, factors: list[str], evidence: Evidence) -> list[str]:
        if self.factor:
            return [f for f in factors if f == self.factor]
        text = " ".join(str(a) for a in evidence.alerts()).lower()
        shuffled = self.rng.sample(factors, len(factors))
        # Stable sort: mentioned factors first, the random order kept within each class.
        return sorted(shuffled, key=lambda f: f.partition(":")[2].lower() not in text)

    def propose(self, parents: list, evidence: Evidence) -> Intervention:

        if len(parents) < 2:
            raise OperatorError("crossover needs two parents", "input")
        a, b = parents[0], parents[1]
        try:
            factors = factors_changed(a, b)
        except GenomeError as err:
            raise OperatorError(f"cannot compare the parents: {err}", "input") from err
        candidates = self._order(factors, evidence)
        if not candidates:
            what = f"in {self.factor}" if self.factor else "in any factor"
            raise OperatorError(f"the parents do not differ {what}", "input")
        reasons = []
        for factor in candidates:
            try:
                child = crossover(a, b, factor)
                return make_intervention(
                    self.name, [a, b], child, evidence,
                    hypothesis=f"If parent {a.short_hash} takes {factor} from parent {b.short_hash}, held-out "
                               "score rises, because that factor is part of what makes the second parent fit.",
                    expected_effect=ExpectedEffect(FITNESS_METRIC, "delta>", 0.0),
                    details={"took": factor, "from": b.hash},
                )
            except GenomeError as err:
                reasons.append((f"{factor}: {err}", "edit"))
            except OperatorError as err:
                reasons.append((f"{factor}: {err.reason}", err.kind))
        kind = reasons[-1][1] if len({k for _, k in reasons}) == 1 else "edit"
        raise OperatorError("no factor of the second parent gives a valid new child: "
                            + "; ".join(r for r, _ in reasons), kind)
