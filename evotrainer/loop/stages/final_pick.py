"""The final pick and its test-split score: the one number of a run nothing in the loop has seen.

Selection ranks versions on the selection draw of the held-out pool and gates promote on the gate
draw, so both draws carry the loop's choices (a best-of-many score is biased upwards). After the last
generation the survivor first in the elite's order (a moving lineage, then the gate's evidence for its
harness, then the selection score) is verified once on the ``test`` split, which no
gate, selection, revert or operator ever read; that is the score a run reports for what it found.
A survivor below the untrained model on both held-out draws pooled (``evolution.start_bar``) is never
the pick: the start is (``loop/stages/start.py``), and the untrained model's test score is reported
beside the pick's either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from evotrainer.domains.task import Task
from evotrainer.genome.errors import GenomeError
from evotrainer.genome.harness import Harness
from evotrainer.genome.program import HarnessProgram
from evotrainer.genome.sandbox import SandboxError
from evotrainer.loop.run_versions import RunVersions
from evotrainer.loop.stages.selection import (Candidate, below_start, elite_key, harness_evidence, rank_score,
                                               lineage_stuck)
from evotrainer.loop.stages.start import START, scored_start, start_test
from evotrainer.policy.collect import prompt_fn, verify
from evotrainer.records.rollout import Rollout
from evotrainer.records.scores import heldout_accuracy
from evotrainer.records.version import VersionDir

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment
    from evotrainer.loop.compute.runtime import Runtime

TEST = "test"   # the version's rollout file of its test-split verification


def final_pick(versions: RunVersions, survivors: list[str], start: dict | None, bar: str = "both_draws") -> str | None:
    """Among the survivors at or above the untrained model's record ``start`` (``selection.below_start``
    under ``bar``), the first in the elite's order (``selection.elite_key``): a lineage that
    moves before one whose report raised ``adapter_stuck``, then the harness the gate vouches for most
    (``harness_evidence``: a promoted one, then the recipe's own, then one it did not promote), then
    the best selection-draw score, the lower cost and the id. The start when no survivor reaches it;
    None when no survivor is scored and the start has no selection score either.

    The untrained model's bar comes first so that a promoted lineage scoring below it does not
    hand the pick to the start while the recipe's own continuation stands above it."""
    metas = [versions.vdir(v).meta() for v in survivors if versions.vdir(v).path.is_dir()]
    scored = [m for m in metas if not m.is_invalid and m.metrics.get("selection_accuracy") is not None]
    if start is not None and start.get("selection_accuracy") is not None:
        scored = [m for m in scored if not below_start(m.metrics, start, bar)]
        if not scored:
            return START
    cands = [Candidate(m.id, rank_score(m.metrics), m.metrics.get("cost", 0.0),
                       stuck=lineage_stuck(m.id, versions.vdir, versions.meta_or_none),
                       evidence=harness_evidence(m.id, versions.meta_or_none)) for m in scored]
    best = min(cands, key=elite_key, default=None)
    return best.version_id if best else None


def report_test(exp: Experiment) -> dict | None:
    """Verifies the final pick on the test split (once: a resumed finish reuses the stored rollouts),
    records ``test_accuracy`` in its meta (and so in its MLflow run) and the pick in the run state."""
    final, line = _test_report(exp)
    exp.state.final = final
    exp.say(line)
    return final


def _test_report(exp: Experiment) -> tuple[dict | None, str]:
    """(the run state's ``final`` record, the line that tells it)."""
    start = exp.state.start if scored_start(exp) else None
    vid = final_pick(exp.run_versions, exp.state.survivors, start, exp.cfg.evolution.start_bar)
    bar = _bar_words(exp)
    if start and exp.cfg.evolution.start_bar == "both_draws" and bar != "both held-out draws":
        exp.say("the untrained model's bar is the selection draw alone in this run: its start was scored before "
                "both draws were pooled (evolution.start_bar)")
    if vid is None:
        return None, "no final pick: no valid survivor with a selection score; the test split is not reported"
    tasks = exp.runtime.test_tasks
    if not tasks:
        return ({"version": vid, "error": "no test tasks"},
                f"final pick {vid}: the domain has no test tasks (domain.n_test / domain.files); no test score")
    base = start_test(exp) if start else []
    base_acc = heldout_accuracy(base) if base else None
    if vid == START:
        return ({"version": START, "test_accuracy": base_acc, "test_tasks": len(tasks), "test_rollouts": len(base),
                 "selection_accuracy": start["selection_accuracy"], "gate_heldout_accuracy": start["heldout_accuracy"],
                 "start_test_accuracy": base_acc, "bar": bar},
                f"final pick: the untrained model (no trained version reaches it on {bar}), test "
                f"accuracy {base_acc:.3f} on {len(tasks)} test task(s): training made the policy worse")
    vd = exp.vdir(vid)
    rollouts = vd.rollouts(TEST)
    if not rollouts:
        rollouts, error = rollouts_on_test(exp.runtime, vd, vid, tasks, exp.cfg.sandbox, exp.cfg.train.eval_max_new_tokens)
        if error is not None:
            return ({"version": vid, "error": error},
                    f"final pick {vid}: test-split verification failed ({error}); no test score reported")
        exp.budgets.spend(rollout_tokens=sum(r.num_tokens for r in rollouts))   # timed by the caller as test
        vd.save_rollouts(TEST, rollouts)
    meta = vd.meta()
    meta.metrics["test_accuracy"] = heldout_accuracy(rollouts)
    vd.save_meta(meta)
    final = {"version": vid, "test_accuracy": meta.metrics["test_accuracy"], "test_tasks": len(tasks),
             "test_rollouts": len(rollouts), "selection_accuracy": meta.metrics.get("selection_accuracy"), "bar": bar,
             "gate_heldout_accuracy": meta.metrics.get("heldout_accuracy"), "start_test_accuracy": base_acc}
    return final, (f"final pick {vid}: test accuracy {final['test_accuracy']:.3f} on {len(tasks)} test task(s) "
                   f"(selection draw {final['selection_accuracy']:.3f}, gate draw {final['gate_heldout_accuracy'] or 0:.3f})"
                   + (f"; the untrained model scores {base_acc:.3f}" if base_acc is not None else ""))


def _bar_words(exp: Experiment) -> str:
    pooled = exp.cfg.evolution.start_bar == "both_draws" and "both_draws_accuracy" in (exp.state.start or {})
    return "both held-out draws" if pooled else "the selection draw"


def rollouts_on_test(runtime: Runtime, vd: VersionDir, vid: str, tasks: list[Task], sandbox: bool,
                  max_new_tokens: int) -> tuple[list[Rollout], str | None]:
    """(the version's rollouts on the test tasks, None), asked through its own harness as it was
    trained and verified; ([], why) when its harness could not ask them."""
    runtime.load_adapter(vid, vd.adapter_dir)
    program = HarnessProgram(vd.genome_source(), name=f"{vid}/genome.py")
    try:
        with Harness(program, sandbox=sandbox) as harness:
            # Greedy, whatever held-out verification samples: the test score is the figure users report.
            return verify(runtime.engine, runtime.domain, tasks, vid, max_new_tokens=max_new_tokens,
                          prompt=prompt_fn(harness)), None
    except (SandboxError, GenomeError, ValueError) as e:
        return [], str(e)
    finally:
        runtime.unload_adapter(vid)
