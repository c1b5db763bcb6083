"""The final pick and its test-split score: the one number of a run nothing in the loop has seen.

Selection ranks versions on the selection draw of the held-out pool and gates promote on the gate
draw, so both draws carry the loop's choices (a best-of-many score is biased upwards). After the last
generation the best survivor by selection score is verified once on the ``test`` split, which no
gate, selection, revert or operator ever read; that is the score a run reports for what it found.
A survivor the selection draw ranks below the untrained model is never the pick: the start is
(``loop/start.py``), and the untrained model's test score is reported beside the pick's either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from evotrainer.genome.errors import GenomeError
from evotrainer.genome.harness import Harness
from evotrainer.genome.program import HarnessProgram
from evotrainer.genome.sandbox import SandboxError
from evotrainer.loop.start import START, scored_start, start_test, start_wins_pick
from evotrainer.policy.collect import prompt_fn, verify
from evotrainer.records.scores import heldout_accuracy

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment

TEST = "test"   # the version's rollout file of its test-split verification


def final_pick(exp: Experiment) -> str | None:
    """The survivor with the best selection-draw score (then the lower cost, then the id); the start
    when that score is below the untrained model's (or no survivor has one); None without either."""
    metas = [exp.vdir(v).meta() for v in exp.state.survivors if exp.vdir(v).path.is_dir()]
    scored = [m for m in metas if not m.is_invalid and m.metrics.get("selection_accuracy") is not None]
    best = min(scored, key=lambda m: (-m.metrics["selection_accuracy"], m.metrics.get("cost", 0.0), m.id),
               default=None)
    if start_wins_pick(exp, best.metrics["selection_accuracy"] if best else None):
        return START
    return best.id if best else None


def report_test(exp: Experiment) -> dict | None:
    """Verifies the final pick on the test split (once: a resumed finish reuses the stored rollouts),
    records ``test_accuracy`` in its meta (and so in its MLflow run) and the pick in the run state."""
    vid = final_pick(exp)
    if vid is None:
        exp.say("no final pick: no valid survivor with a selection score; the test split is not reported")
        exp.state.final = None
        return None
    tasks = exp.runtime.test_tasks
    if not tasks:
        exp.say(f"final pick {vid}: the domain has no test tasks (domain.n_test / domain.files); no test score")
        exp.state.final = {"version": vid, "error": "no test tasks"}
        return exp.state.final
    base = start_test(exp) if scored_start(exp) else []
    base_acc = heldout_accuracy(base) if base else None
    if vid == START:
        final = {"version": START, "test_accuracy": base_acc, "test_tasks": len(tasks), "test_rollouts": len(base),
                 "selection_accuracy": exp.state.start["selection_accuracy"],
                 "gate_heldout_accuracy": exp.state.start["heldout_accuracy"], "start_test_accuracy": base_acc}
        exp.state.final = final
        exp.say(f"final pick: the untrained model (no trained version ranks above it on the selection draw), test "
                f"accuracy {base_acc:.3f} on {len(tasks)} test task(s): training made the policy worse")
        return final
    vd = exp.vdir(vid)
    rollouts = vd.rollouts(TEST)
    if not rollouts:
        tc = exp.cfg.train
        exp.runtime.load_adapter(vid, vd.adapter_dir)
        program = HarnessProgram(vd.genome_source(), name=f"{vid}/genome.py")
        try:
            with Harness(program, sandbox=exp.cfg.sandbox) as harness:   # asked as it was trained and verified
                # Greedy, whatever held-out verification samples: the test score is the figure users report.
                rollouts = verify(exp.runtime.engine, exp.runtime.domain, tasks, vid,
                                  max_new_tokens=tc.eval_max_new_tokens, prompt=prompt_fn(harness))
        except (SandboxError, GenomeError, ValueError) as e:
            exp.say(f"final pick {vid}: test-split verification failed ({e}); no test score reported")
            exp.state.final = {"version": vid, "error": str(e)}
            return exp.state.final
        finally:
            exp.runtime.unload_adapter(vid)
        exp.budgets.spend(rollout_tokens=sum(r.num_tokens for r in rollouts))   # timed by the caller as test
        vd.save_rollouts(TEST, rollouts)
    meta = vd.meta()
    meta.metrics["test_accuracy"] = heldout_accuracy(rollouts)
    vd.save_meta(meta)
    final = {"version": vid, "test_accuracy": meta.metrics["test_accuracy"], "test_tasks": len(tasks),
             "test_rollouts": len(rollouts), "selection_accuracy": meta.metrics.get("selection_accuracy"),
             "gate_heldout_accuracy": meta.metrics.get("heldout_accuracy"), "start_test_accuracy": base_acc}
    exp.state.final = final
    exp.say(f"final pick {vid}: test accuracy {final['test_accuracy']:.3f} on {len(tasks)} test task(s) "
            f"(selection draw {final['selection_accuracy']:.3f}, gate draw {final['gate_heldout_accuracy'] or 0:.3f})"
            + (f"; the untrained model scores {base_acc:.3f}" if base_acc is not None else ""))
    return final
