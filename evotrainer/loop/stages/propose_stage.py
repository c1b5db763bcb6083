"""The propose stage of a generation: how many children the budget allows, then who makes them.

A compound child first (two survivors' promoted factors put together), then a merge child when
``evolution.merge`` asks for one (``loop/stages/merging.py``), then one child per parent that selection
draws, each proposed, backtested and admitted by ``loop/stages/proposals.py``. Kept apart from that module
so that the merge, which builds on its ``admit``, is imported by neither in a circle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from evotrainer.loop.stages.merging import propose_merge_child
from evotrainer.loop.stages.proposals import children_the_budget_allows, compound, propose_child, propose_compound
from evotrainer.loop.stages.selection import parents as select_parents

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment


def propose_children(exp: Experiment, survivors: list[str], generation: int, wanted: int | None = None) -> None:
    """Operators propose single-factor interventions on selected parents (``wanted`` children, else
    ``children_per_generation``); each is backtested on the parent's cached rollouts before any
    training compute is spent on it."""
    ev, state = exp.cfg.evolution, exp.state
    wanted = 0 if ev.mode == "reference" else ev.children_per_generation if wanted is None else wanted
    todo = children_the_budget_allows(exp, wanted) - len([v for v in state.live
                                                          if exp.vdir(v).meta().operator is not None])
    if todo > 0 and ev.mode == "evolve" and (pair := compound(exp, survivors)):
        if propose_compound(exp, *pair, generation):
            todo -= 1
    if todo > 0 and propose_merge_child(exp, survivors, generation):   # evolution.merge decides whether and when
        todo -= 1
    picks = select_parents(exp.candidates(survivors), max(0, todo), ev.tournament_size,
                           seed=exp.cfg.seed * 7919 + generation, min_cells=ev.diversity.min_cells,
                           say=lambda msg: exp.say(f"gen {generation}: {msg}"))
    run = exp.proposal_inputs()
    cases = run.cases() if picks and run.backtest else []   # labelled history: read once per round
    for pid in picks:
        propose_child(run, pid, survivors, generation, cases)
