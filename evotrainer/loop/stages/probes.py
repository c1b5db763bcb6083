"""Probes: how a small step budget still explores.

Exploring in generations of ``steps_per_generation`` steps, half of a 16- or 24-step budget holds 4-6
versions: the reference's first generation and one generation of a control and two children, so
``evolve`` tried 2 children at 16 steps, 3 at 24, and 1 with the quickstart at 24 (4 steps a
generation): issue 47's "under a small step budget, `evolve` searches nothing". Probing explores in short
generations instead (``evolution.probe_steps``, 1 step by default), each the elite's
continuation beside its children, while the steps spent beside that one lineage stay within a
quarter of the budget; then the exploit phase trains the elite in generations of
``steps_per_generation`` steps until the budget is spent. The pick's lineage keeps at least 75% of the
reference's depth, and the children are as many as a quarter of the budget holds: 4 at 16 steps,
6 at 24.

Probing is on by default where exploring at full generations cannot try two generations of children:
where the exploration share holds fewer than ``1 + 2 × (1 + children_per_generation)`` versions of
``steps_per_generation`` steps (7 with the defaults: 16 and 24 steps at 2 a generation; 32 steps and
up explore as before). A child and its control train the same steps from the same parent in one
generation, so the gate compares harnesses, not step counts; a probe is a shorter look than a full
generation, so it tells fewer harnesses apart (the racing gate, ``race_cap``, buys it more tasks).

Probing also stops early (``evolution.probe_patience``; ``probing_spent`` in ``loop/stages/exploit.py``):
after a probe generation that promoted no child beside an elite that moves, the rest of the side share
goes to the elite's lineage.
"""

from __future__ import annotations

from evotrainer.config import Config
from evotrainer.records.version import BranchVersion

SIDE_SHARE = 0.25   # of the step budget: what probing may spend beside the elite's lineage


def probe_steps(cfg: Config) -> int:
    """The steps of an exploring generation when the run probes, else 0."""
    ev = cfg.evolution
    if ev.budget.train_steps is None or ev.mode == "reference" or ev.children_per_generation == 0:
        return 0
    if ev.probe_steps is not None:
        return ev.probe_steps
    if ev.exploit <= 0:
        return 0
    room = (1 - ev.exploit) * ev.budget.train_steps / ev.steps_per_generation
    return 1 if room < 1 + 2 * (1 + ev.children_per_generation) else 0


def generation_steps(cfg: Config, exploit_from: int | None, generation: int) -> int:
    """The training steps of each version of ``generation``: a probe's while exploring, else
    ``steps_per_generation`` (the exploit phase starts after the selection of ``exploit_from``)."""
    p = probe_steps(cfg)
    exploring = exploit_from is None or generation <= exploit_from
    return p if p and exploring else cfg.evolution.steps_per_generation


def first_step(cfg: Config, exploit_from: int | None, generation: int) -> int:
    """The index of ``generation``'s first step in the run's task schedule (siblings share it: common
    random numbers); ``generation × steps_per_generation`` when the run does not probe."""
    return sum(generation_steps(cfg, exploit_from, g) for g in range(generation))


def side_steps(cfg: Config, steps_used: float, generation: int) -> float:
    """While probing, the steps spent beside the elite's lineage once ``generation`` has trained:
    every exploring generation trains one continuation of it (generation 0: the seed)."""
    return steps_used - (generation + 1) * probe_steps(cfg)


def probe_children_that_fit(cfg: Config, steps_used: float, generation: int) -> int:
    """While probing, how many children of the next generation the side share still holds."""
    p = probe_steps(cfg)
    room = SIDE_SHARE * cfg.evolution.budget.train_steps - side_steps(cfg, steps_used, generation)
    return max(0, min(cfg.evolution.children_per_generation, int(room // p)))


def version_steps(cfg: Config, meta: BranchVersion) -> int:
    """The steps ``meta``'s version trains: as recorded when it was made (a run from before probes
    records none: ``steps_per_generation``)."""
    return meta.steps or cfg.evolution.steps_per_generation
