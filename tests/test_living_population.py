"""A living population: ties live on as branches of their own, TPE learns from the paired delta after a
few start-up trials, operator weights adapt to what the gates said (a bandit), user skills and
diagnostic gaps reach the operators."""

import optuna
import pytest

from evotrainer.config import parse_config
from evotrainer.fitness.labels import DiagnosticGap
from evotrainer.loop.experiment import Experiment
from evotrainer.loop.stages.gating import child_outcome, control_of, spend_of, spend_record
from evotrainer.loop.stages.proposals import evidence_for
from evotrainer.loop.knowledge.skills import SkillLibrary
from evotrainer.operators.prompts import diff_messages
from evotrainer.operators.registry import OperatorMix
from evotrainer.records.rollout import Rollout
from evotrainer.records.version import VersionDir

from tests.loop_runs import tiny_cfg


def test_a_tie_lives_on_and_a_clear_loss_is_rejected():
    tie = {"ci_low": -0.1, "ci_high": 0.1, "mean_delta": 0.0}
    assert child_outcome(tie, keep_ties=True) == "kept"
    assert child_outcome(tie, keep_ties=False) == "rejected"
    assert child_outcome({"ci_low": -0.3, "ci_high": -0.05}, keep_ties=True) == "rejected"
    assert child_outcome({"promote": False, "reason": "refused: not paired"}, keep_ties=True) == "rejected"


def test_the_bandit_draws_operators_that_succeed_more_often():
    mix = OperatorMix({"knobs": 1.0, "crossover": 1.0}, seed=0)
    for _ in range(12):
        mix.credit("knobs", True, entry="format_credit")
        mix.credit("crossover", False)
    draws = [mix.choose_name() for _ in range(400)]
    # Drawn by weight times a Thompson sample, Beta(13, 1) against Beta(1, 13): knobs ~93% of the draws;
    # were crossover's failures not counted (Beta(1, 1)), ~70%.
    assert draws.count("knobs") > 0.8 * len(draws)
    assert mix.entry_weights["format_credit"] == pytest.approx(13 / 14)
    mix.credit("knobs", False, entry="format_credit")
    assert mix.entry_weights["format_credit"] == pytest.approx(13 / 15)     # a failure weighs the entry down
    stats = mix.stats_dict()
    assert (stats["knobs"]["gated_successes"], stats["knobs"]["gated_failures"]) == (12, 1)
    assert (stats["crossover"]["gated_successes"], stats["crossover"]["gated_failures"]) == (0, 12)


def test_library_entry_weights_follow_their_gated_outcomes():
    mix = OperatorMix({"library": 1.0}, seed=0)
    lib = mix.operator("library")
    entry = lib.entries[0]
    base = lib.weights[entry.id]
    for _ in range(3):
        mix.credit("library", False, entry=entry.id)   # e.g. its children were invalid: a reward hack
    assert lib.weights[entry.id] < base
    for _ in range(10):
        mix.credit("library", True, entry=entry.id)
    assert lib.weights[entry.id] > base


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    mp = pytest.MonkeyPatch()
    mp.setenv("EVOTRAINER_HOME", str(home))
    run_dir = tmp_path_factory.mktemp("pop") / "run"
    cfg = tiny_cfg(run_dir, population_size=3, generations=3, children_per_generation=1, operators={"knobs": 1.0},
                   user_skills=True, knobs_startup_trials=1)
    exp = Experiment(parse_config(cfg))
    exp.run()
    yield exp
    mp.undo()


def test_tied_children_become_branches_of_their_own(run):
    metas = [run.vdir(v).meta() for v in run.versions()]
    children = {m.id for m in metas if m.operator}
    # A child that tied its control was kept and continued in the next generation as a branch.
    continued = [m for m in metas if m.operator is None and m.parents and m.parents[0] in children]
    assert continued, {m.id: (m.operator, m.parents, m.status) for m in metas}
    # Two lineages continue side by side in the last generation (plus its new child): not one lineage.
    last = [run.vdir(v).meta() for v in run.generation_versions(2)]
    assert len([m for m in last if m.operator is None]) >= 2, [(m.id, m.operator, m.parents) for m in last]


def test_tpe_is_told_the_paired_delta_against_the_control(run):
    knobs = run.mix.operator("knobs")
    assert knobs.n_startup_trials == 1      # evolution.knobs_startup_trials reached the operator
    study = optuna.load_study(study_name="evotrainer-knobs", storage=f"sqlite:///{run.run_dir.resolve()}/optuna.db")
    told = {t.user_attrs["child_hash"]: t.value for t in study.get_trials() if t.value is not None}
    deltas = {m.genome_hash: (m.decision.get("paired") or {}).get("mean_delta")
              for m in (run.vdir(v).meta() for v in run.versions()) if m.operator == "knobs" and m.decision}
    # Every trial told a value is a knob child of this run (matched by its genome hash), told its delta.
    assert told and set(told) <= set(deltas), (told, deltas)
    assert all(told[h] == pytest.approx(deltas[h]) for h in told)


def test_user_skills_and_diagnostic_gaps_reach_the_operators(run):
    user = SkillLibrary.user()
    user.record_confirmed({"factor": "knob:temperature", "diff": "-temperature 1.0\n+temperature 0.7",
                           "expected_effect": {"metric": "dead_group_ratio", "op": "<", "value": 2.0},
                           "hypothesis": "cooler sampling"},
                          {"promote": True, "valid": True, "paired": {"mean_delta": 0.1, "ci_low": 0.01,
                                                                     "ci_high": 0.2}}, "math",
                          {"dead_group_ratio": 1.0}, version="elsewhere/v0007")
    user.save()
    run.__dict__.pop("user_skills", None)   # a new run reads the user library at its start
    run.labels.record_gap(DiagnosticGap("runs/x/versions/v0003", "abc", ["reward_hacking"], {}, [],
                                        "flag shaped reward rising while correctness falls"))
    ev = evidence_for(run, "v0000")
    assert any("temperature" in str(s) for s in ev.skills), ev.skills
    assert ev.gaps and ev.gaps[-1]["engine_checks"] == ["reward_hacking"]
    prompt = diff_messages(run.vdir("v0000").genome_source(), ev)[-1]["content"]
    assert "DIAGNOSTIC GAPS" in prompt and "reward_hacking" in prompt


def test_the_gate_records_what_each_side_spent(run):
    """Same steps are not the same compute: a child with more rollouts per group spends more than its
    control, and the decision record says by how much (issue 14)."""
    ppt = run.cfg.train.prompts_per_step
    gated = [m for m in (run.vdir(v).meta() for v in run.versions())
             if m.operator and m.decision and "spend" in m.decision]
    assert gated
    for m in gated:
        spend = m.decision["spend"]
        child = spend["child"]
        assert child["train_steps"] == run.cfg.evolution.steps_per_generation
        assert child["train_rollouts"] == child["train_steps"] * ppt * m.knobs["num_generations"]
        assert child["train_tokens"] == sum(r.num_tokens for r in run.vdir(m.id).rollouts("train")) > 0
        held = run.vdir(m.id).rollouts("heldout") + run.vdir(m.id).rollouts("selection")   # both draws
        assert child["heldout_rollouts"] == len(held) == len(run.runtime.heldout_tasks) * len(run.cfg.train.eval_seeds)
        ctl = run.vdir(control_of(run.run_versions, m))
        assert spend["control"] == spend_of(ctl)
        assert spend["train_rollouts_ratio"] == pytest.approx(
            m.knobs["num_generations"] / ctl.meta().knobs["num_generations"])


def test_spend_record_shows_a_child_with_twice_the_group_size_spends_twice(tmp_path):
    """num_generations 8 against 4 at the same steps: the record says 2x rollouts and tokens."""
    def version(name, group):
        vd = VersionDir(tmp_path / name)
        vd.path.mkdir()
        vd.append_step({"step": 0})
        vd.save_rollouts("train", [Rollout("t", [], "x", completion_ids=[1, 2, 3]) for _ in range(2 * group)])
        vd.save_rollouts("heldout", [Rollout("h", [], "y", completion_ids=[1] * 6, split="heldout")] * 3)
        return vd
    rec = spend_record(version("child", 8), version("control", 4))
    assert rec["child"] == {"train_steps": 1, "train_rollouts": 16, "train_tokens": 48, "heldout_rollouts": 3,
                            "heldout_tokens": 18}
    assert rec["control"]["train_rollouts"] == 8 and rec["train_rollouts_ratio"] == rec["train_tokens_ratio"] == 2.0
    assert spend_record(version("orphan", 4), None)["control"] is None


def test_a_child_whose_control_failed_is_gated_against_the_parent(run, tmp_path):
    """A continuation whose harness or sandbox worker failed has no held-out scores: its siblings are
    paired with the parent (verified on the same tasks) instead of being refused as unpairable."""
    import shutil

    from evotrainer.fitness.gate_config import gate_config
    from evotrainer.fitness.gates import gate

    copy = tmp_path / "run"
    shutil.copytree(run.run_dir, copy, ignore=shutil.ignore_patterns(".evotrainer.lock"))
    exp = Experiment.resume(copy, readonly=True)
    child = next(m for m in (exp.vdir(v).meta() for v in exp.versions())
                 if m.operator and m.parents and control_of(exp.run_versions, m) != m.parents[0])
    sibling = control_of(exp.run_versions, child)
    assert gate(exp.vdir(child.id).path, exp.vdir(sibling).path, gate_config(exp.cfg)).paired   # paired as usual
    shutil.rmtree(exp.vdir(sibling).path / "rollouts")   # the continuation failed before it was verified
    assert control_of(exp.run_versions, child) == child.parents[0]
    decision = gate(exp.vdir(child.id).path, exp.vdir(child.parents[0]).path, gate_config(exp.cfg))
    assert decision.paired and not any("same tasks" in r for r in decision.reasons), decision.reasons
