"""The racing gate's further rounds (``evolution.race_cap``): a child the gate draw cannot decide is
verified, with its control, on the next round of held-out tasks until the group-sequential test
(``fitness/race.py``) promotes it, finds it behind its control, or reaches the cap.

A 24-task gate sees effects of about 0.28; the best single changes are worth about 0.1. Reading more
tasks only where the first draw leaves the question open spends verification where it decides
something: a clear win or a child behind its control stops at the first look that shows it.

Each round's rollouts go to the version's ``rollouts/race.jsonl`` (written whole, atomically), so a
resumed run verifies only what is missing, and a control raced beside two children verifies each task
once. The race tasks are the held-out pool beyond ``train.eval_size`` (``Runtime.race_tasks``), never
in the gate or selection draw, verified as the version asks them (its harness's prompt hook, in the
sandbox), with the same sampling settings and seeds as the gate draw so both sides pair.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from evotrainer.fitness.gates import RACE, race_state
from evotrainer.fitness.gate_config import gate_config
from evotrainer.genome.harness import Harness
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.budgets import BudgetReached
from evotrainer.loop.crash import crash_point
from evotrainer.loop.run_versions import RunVersions
from evotrainer.loop.stages.gating import control_of
from evotrainer.loop.stages.training import HARNESS_FAILURES
from evotrainer.policy.collect import default_prompt, prompt_fn, verify_many
from evotrainer.records.version import Status

if TYPE_CHECKING:
    from evotrainer.loop.context import RunContext


def race_child(exp: RunContext, versions: RunVersions, vid: str) -> None:
    """Verifies ``vid`` and its control on further rounds until the race decides, the pool ends or a
    budget is spent (then the gate decides on what was read)."""
    cfg = gate_config(exp.cfg)
    meta = exp.vdir(vid).meta()
    if cfg.race_cap is None or meta.operator is None or meta.status != Status.VERIFIED:
        return
    control = control_of(versions, meta)
    if control is None or not exp.vdir(control).rollouts_path("heldout").is_file():
        return
    if control == meta.parents[0]:   # its sibling failed: gate_version judges it against its parent, unraced
        return
    while True:
        state = race_state(exp.vdir(vid).path, exp.vdir(control).path, cfg)
        if state.stopped != "continue":
            exp.say(f"gen {meta.generation}: race {vid} vs {control}: {state.stopped} at look {state.look} "
                    f"({state.n_tasks} tasks, z {state.z:+.2f}, boundary {state.boundary:.2f})")
            return
        need = state.schedule[state.look] - state.schedule[0]   # race tasks the next look reads
        tasks = exp.runtime.race_tasks[:need]
        if len(tasks) < need:
            exp.say(f"gen {meta.generation}: race {vid} vs {control}: the pool holds {len(tasks)} race tasks, "
                    f"look {state.look + 1} needs {need}; the gate decides on {state.n_tasks} tasks")
            return
        try:
            exp.budgets.guard()
        except BudgetReached as e:
            exp.say(f"gen {meta.generation}: race {vid} vs {control} stops at {state.n_tasks} tasks: {e}")
            return
        exp.say(f"gen {meta.generation}: race {vid} vs {control}: undecided at {state.n_tasks} tasks "
                f"(z {state.z:+.2f}, boundary {state.boundary:.2f}); verifying both on {state.schedule[state.look]}")
        before = [len(exp.vdir(v).rollouts(RACE)) for v in (vid, control)]
        if not verify_round(exp, [vid, control], tasks):
            return
        if [len(exp.vdir(v).rollouts(RACE)) for v in (vid, control)] == before:   # nothing new: never loop
            exp.say(f"gen {meta.generation}: race {vid}: no further rollouts were recorded; the race stops")
            return


def verify_round(exp: RunContext, vids: list[str], tasks: list) -> bool:
    """Each version verified on the tasks of ``tasks`` its race file lacks, in one call where the engine
    shares batches; False (said) when a harness fails to ask them."""
    rt, tc = exp.runtime, exp.cfg.train
    jobs, owners = [], []
    for vid in vids:   # every harness asks its tasks before any adapter is loaded: a failure leaves none loaded
        vd = exp.vdir(vid)
        have = {r.task_id for r in vd.rollouts(RACE)}
        missing = [t for t in tasks if t.id not in have]
        if not missing:
            continue
        try:
            with Harness(HarnessProgram(vd.genome_source(), name=f"{vid}/genome.py"), sandbox=exp.cfg.sandbox) as h:
                ask = prompt_fn(h)
                asked = {t.id: ask(t) for t in missing} if ask is not default_prompt else None
        except HARNESS_FAILURES as e:
            exp.say(f"race: {vid}'s harness failed to ask the race tasks ({e}); the gate decides on what was read")
            return False
        jobs.append((missing, vid, default_prompt if asked is None else (lambda t, a=asked: a[t.id])))
        owners.append(vid)
    if not jobs:
        return True
    t0 = time.perf_counter()
    try:
        for vid in owners:
            rt.load_adapter(vid, exp.vdir(vid).adapter_dir)
            rt.policy.check_adapter_applied(vid)
        results = verify_many(rt.engine, rt.domain, jobs, max_new_tokens=tc.eval_max_new_tokens,
                              temperature=tc.eval_temperature, seeds=tc.eval_seeds)
    finally:
        for vid in owners:   # (those never loaded are skipped)
            rt.unload_adapter(vid)
    seconds = time.perf_counter() - t0
    for vid, rollouts in zip(owners, results):
        vd = exp.vdir(vid)
        vd.save_rollouts(RACE, vd.rollouts(RACE) + rollouts)
        crash_point("race:round-saved")   # one side's round saved, the other's not: resume verifies what is missing
        exp.budgets.spend(rollout_tokens=sum(r.num_tokens for r in rollouts), race_seconds=seconds / len(owners))
    return True
