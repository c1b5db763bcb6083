"""The start: the untrained model, scored like any version, so a run knows when training made the
policy worse than what it began with.

Before the first generation trains, the base model (no adapter) is verified on the held-out pool as
every version is (both draws, the seed harness's prompt, the same decoding) and kept in
``<run>/start/``; at the end it is verified on the test split beside the final pick. Two things read
it:

- **selection**: when no survivor reaches the start's bar (``evolution.start_bar``: both held-out
  draws pooled by default) and the start beats the best survivor by the rule a revert uses (it ranks
  higher on the selection draw, and the paired bootstrap on the gate draw says so at the gate's
  level), every lineage has regressed below the start. Once that holds at two selections in a row, and
  ``evolution.stop_below_start`` is on, the run stops: more of the same training would go on
  degrading the policy, and the final pick falls back to the start.
- **the final pick**: never a version below the start's bar; the start is the pick then, and the
  summary says plainly that training made the policy worse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from evotrainer.fitness.gate_config import gate_config
from evotrainer.genome.errors import GenomeError
from evotrainer.genome.harness import Harness
from evotrainer.genome.sandbox import SandboxError
from evotrainer.loop.stages.revert import Side, choose_revert
from evotrainer.loop.stages.selection import below_start
from evotrainer.policy.collect import prompt_fn, verify
from evotrainer.records.scores import heldout_accuracy
from evotrainer.records.version import VersionDir

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment

START = "start"   # its id wherever a version id could stand (the final pick, events) and its directory


def start_dir(exp: Experiment) -> VersionDir:
    return VersionDir(exp.run_dir / START)


def _verify(exp: Experiment, tasks, temperature: float, seeds) -> list:
    with Harness(exp.seed_program(), sandbox=exp.cfg.sandbox) as harness:   # asked as the seed asks
        return verify(exp.runtime.engine, exp.runtime.domain, tasks, None,
                      max_new_tokens=exp.cfg.train.eval_max_new_tokens, temperature=temperature, seeds=seeds,
                      prompt=prompt_fn(harness))


def verify_start(exp: Experiment) -> dict:
    """The untrained model's held-out scores (once per run; a resume reuses them)."""
    if exp.state.start is not None:
        return exp.state.start
    tc, rt = exp.cfg.train, exp.runtime
    try:
        with exp.budgets.timed("verify"):
            rollouts = _verify(exp, rt.heldout_tasks, tc.eval_temperature, tc.eval_seeds)
    except (SandboxError, GenomeError, ValueError) as e:   # the seed harness's prompt hook failed
        exp.state.start = {"error": str(e)[:300], "below": []}
        exp.say(f"the start (the untrained model) could not be scored under the seed harness: {e}; the run goes on "
                "without it (no fallback to the untrained model)")
        exp.save()
        return exp.state.start
    exp.budgets.spend(rollout_tokens=sum(r.num_tokens for r in rollouts))
    in_gate = {t.id for t in rt.gate_tasks}
    gate = [r for r in rollouts if r.task_id in in_gate]
    selection = [r for r in rollouts if r.task_id not in in_gate]
    vd = start_dir(exp)
    vd.path.mkdir(parents=True, exist_ok=True)
    vd.save_rollouts("heldout", gate)
    vd.save_rollouts("selection", selection)
    exp.state.start = {"heldout_accuracy": heldout_accuracy(gate), "selection_accuracy": heldout_accuracy(selection),
                       "both_draws_accuracy": heldout_accuracy(gate + selection),
                       "below": []}
    exp.say(f"the start (the untrained model): gate draw {exp.state.start['heldout_accuracy']:.3f}, "
            f"selection draw {exp.state.start['selection_accuracy']:.3f}")
    exp.save()
    return exp.state.start


def regressed_below_start(exp: Experiment, survivors: list[str]) -> str | None:
    """The reason, when the start beats the best of ``survivors`` (selection draw to choose, paired
    gate-draw test at the gate's level to confirm); else None."""
    start = exp.state.start
    metrics = {v: exp.vdir(v).meta().metrics for v in survivors}
    if any(not below_start(m, start, exp.cfg.evolution.start_bar) for m in metrics.values()
           if m.get("selection_accuracy") is not None):
        return None    # a survivor at or above the bar: the final pick would take it, so no lineage regressed
    scored = [(metrics[v].get("selection_accuracy"), v) for v in survivors]
    scored = [(s, v) for s, v in scored if s is not None]
    if not scored_start(exp) or not scored:
        return None
    score, best = max(scored)
    gcfg = gate_config(exp.cfg)
    rollouts = {START: start_dir(exp).rollouts("heldout")}
    found = choose_revert(Side(best, score), [Side(START, start["selection_accuracy"])],
                          lambda v: rollouts[v] if v == START else exp.vdir(v).rollouts("heldout"), gcfg, exp.say)
    if found is None:
        return None
    d = found[1]
    return (f"the untrained model beats the best survivor {best} (selection draw {start['selection_accuracy']:.3f} "
            f"vs {score:.3f}; paired on the gate draw: {d.mean_delta:+.3f}, {100 * d.level:g}% CI "
            f"[{d.ci_low:+.3f}, {d.ci_high:+.3f}] over {d.n_tasks} task(s))")


def scored_start(exp: Experiment) -> bool:
    """Whether the run has the start's held-out scores (not when the seed harness could not ask it)."""
    return exp.state.start is not None and "selection_accuracy" in exp.state.start


def note_selection(exp: Experiment, generation: int, survivors: list[str]) -> None:
    """After a selection: whether every lineage is below the start, and the run's answer."""
    start = exp.state.start
    if not scored_start(exp):
        return
    why = regressed_below_start(exp, survivors)
    below = [g for g in start.get("below", []) if g != generation] + ([generation] if why else [])
    start["below"] = below
    if not why:
        return
    exp.say(f"gen {generation}: every lineage is below the start: {why}")
    if exp.cfg.evolution.stop_below_start and generation - 1 in below and not exp.state.stop_reason:
        exp.state.stop_reason = (f"every lineage regressed below the untrained model at two selections in a row "
                                 f"(generations {generation - 1} and {generation}): more of this training would go "
                                 "on making the policy worse (evolution.stop_below_start)")


def start_test(exp: Experiment) -> list:
    """The untrained model on the test split, greedy (verified once; stored in ``start/test.jsonl``)."""
    vd = start_dir(exp)
    rollouts = vd.rollouts("test")
    if not rollouts and exp.runtime.test_tasks:
        rollouts = _verify(exp, exp.runtime.test_tasks, 0.0, (0,))
        exp.budgets.spend(rollout_tokens=sum(r.num_tokens for r in rollouts))
        vd.path.mkdir(parents=True, exist_ok=True)
        vd.save_rollouts("test", rollouts)
    return rollouts
