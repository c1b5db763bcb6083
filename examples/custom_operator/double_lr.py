"""double_lr: a user operator that doubles or halves one numeric knob (learning_rate by default).

Installed with ``pip install -e examples/custom_operator``, it is available by name:
``get_operator("double_lr")``, ``evotrainer mutate harness.py --operator double_lr``, or a weight
in an ``OperatorMix``. ``make_intervention`` applies the engine's acceptance rules (one factor,
no duplicate, contract) so a user operator only has to say what it changes and why.
"""

import random

from evotrainer.operators import (
    FITNESS_METRIC,
    Evidence,
    ExpectedEffect,
    Intervention,
    OperatorError,
    make_intervention,
)


class DoubleLR:
    name = "double_lr"

    def __init__(self, knob: str = "learning_rate", seed: int = 0) -> None:
        self.knob = knob
        self.rng = random.Random(seed)

    def propose(self, parents: list, evidence: Evidence) -> Intervention:
        parent = parents[0]
        spec = parent.knobs.get(self.knob)
        if spec is None or "range" not in spec:
            raise OperatorError(f"the parent has no numeric knob {self.knob!r}", "input")
        lo, hi = spec["range"]
        last = OperatorError(f"{self.knob} is at both ends of its range", "no_change")
        for factor in self.rng.sample([2.0, 0.5], 2):          # try one direction, then the other
            value = type(spec["value"])(min(max(spec["value"] * factor, lo), hi))
            try:
                return make_intervention(
                    self.name, [parent], parent.with_knobs(**{self.knob: value}), evidence,
                    hypothesis=f"If {self.knob} goes from {spec['value']} to {value}, held-out score rises, "
                               "because the current value is off by about a factor of two.",
                    expected_effect=ExpectedEffect(FITNESS_METRIC, "delta>", 0.0),
                    details={"knob": self.knob, "old": spec["value"], "new": value},
                )
            except OperatorError as err:    # e.g. that child is already known: try the other way
                last = err
        raise last
