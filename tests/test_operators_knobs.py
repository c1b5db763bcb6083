"""The knob operator: single-knob children within ranges, TPE learning from told fitness, storage."""

import math

import pytest

from evotrainer.genome import reference_program as reference
from evotrainer.genome.edits import factors_changed
from evotrainer.genome.program import HarnessProgram
from evotrainer.operators import Evidence, OperatorError, get_operator
from evotrainer.operators.knobs import KnobOperator

SMALL = '''
KNOBS = {
    "learning_rate": {"value": 2e-05, "range": [1e-06, 1e-03], "log": True},
    "num_generations": {"value": 4, "choices": [2, 4, 8]},
    "max_steps": {"value": 10, "range": [1, 100]},
    "fixed": {"value": 1.0, "range": [1.0, 1.0]},
}


def reward(rollouts, tasks):
    return [1.0 if r["visible"].get("correct") else 0.0 for r in rollouts]
'''


def test_children_change_one_knob_within_its_range():
    parent = reference()
    op = get_operator("knobs", seed=3)
    seen_knobs = set()
    for _ in range(25):
        iv = op.propose([parent], Evidence())
        child = iv.child()
        assert iv.factors == [iv.factor] and iv.factor.startswith("knob:")
        if len(seen_knobs) < 2:  # the slow AST comparison agrees with the factor known by construction
            assert factors_changed(parent, child) == [iv.factor]
        knob = iv.details["knob"]
        spec = child.knobs[knob]
        if "range" in spec:
            assert spec["range"][0] <= spec["value"] <= spec["range"][1]
        else:
            assert spec["value"] in spec["choices"]
        assert spec["value"] != parent.knobs[knob]["value"]
        assert iv.parent_hashes == [parent.hash] and iv.expected_effect.metric == "heldout_accuracy"
        seen_knobs.add(knob)
    assert len(seen_knobs) >= 6   # the knob is chosen among all of them


def test_int_knob_stays_int_and_degenerate_knob_is_never_chosen():
    parent = HarnessProgram(SMALL)
    op = KnobOperator(seed=0)
    for _ in range(20):
        iv = op.propose([parent], Evidence())
        assert iv.details["knob"] != "fixed"
        if iv.details["knob"] == "max_steps":
            assert isinstance(iv.details["new"], int)


def test_clip_knobs_are_never_tuned_while_training_is_on_policy():
    """With one pass per batch the ratio is 1, so epsilon/epsilon_high/delta cannot change a step:
    children that only change them would repeat their control. With several passes they matter."""
    parent = reference()
    clip = {"epsilon", "epsilon_high", "delta"}
    on_policy = KnobOperator(seed=0, fixed={"num_iterations": 1})
    assert not clip & {on_policy.propose([parent], Evidence()).details["knob"] for _ in range(30)}
    off_policy = KnobOperator(seed=0, fixed={"num_iterations": 2})
    assert clip & {off_policy.propose([parent], Evidence()).details["knob"] for _ in range(30)}
    # A genome that declares num_iterations as a knob decides for itself, over the run's config.
    knobbed = HarnessProgram(parent.source.replace('"beta": {', '"num_iterations": {"value": 2, "choices": [1, 2]},\n'
                                                                '    "beta": {'))
    assert knobbed.knobs["num_iterations"]["value"] == 2
    op = KnobOperator(seed=0, fixed={"num_iterations": 1})
    assert clip & {op.propose([knobbed], Evidence()).details["knob"] for _ in range(30)}


def test_guided_edit_is_inert_until_some_episode_is_guided():
    """``guided_edit`` shapes guided edits only: on the SWE seed (no guided share) a child moving it
    would train as its control, so the knobs operator leaves it out; on a plan child it is a move."""
    from evotrainer.loop.seed import DOMAIN_HARNESSES
    from evotrainer.operators.knobs import inert_knobs

    swe = HarnessProgram.from_file(DOMAIN_HARNESSES["swe"])
    assert "guided_edit" in inert_knobs({n: k["value"] for n, k in swe.knobs.items()})
    op = KnobOperator(seed=0, fixed={"num_iterations": 1})
    assert "guided_edit" not in {op.propose([swe], Evidence()).details["knob"] for _ in range(40)}
    plan = HarnessProgram(swe.source.replace('"guided_plan_share": {"value": 0.0', '"guided_plan_share": {"value": 0.5'))
    assert "guided_edit" not in inert_knobs({n: k["value"] for n, k in plan.knobs.items()})
    assert "guided_edit" in KnobOperator(seed=0)._candidates(plan, Evidence())


def test_a_parent_whose_every_step_was_skipped_gets_no_knob_that_acts_only_inside_a_step():
    """SWE's seed: every group dead, no KL, no step trained. A learning-rate, loss or scale_rewards child would
    train exactly as its control; the knob operator proposes sampling knobs only, and all of them again
    once a group carries signal or a KL term makes steps run."""
    from evotrainer.loop.seed import DOMAIN_HARNESSES

    swe = HarnessProgram.from_file(DOMAIN_HARNESSES["swe"])
    dead = Evidence(health_report={"engine": {"dead_group_ratio": 1.0}})
    op = KnobOperator(seed=0, fixed={"num_iterations": 1})
    proposed = {op.propose([swe], dead).details["knob"] for _ in range(40)}
    assert proposed and proposed <= {"num_generations", "temperature", "max_completion_length", "guided_call_share",
                                     "guided_plan_share", "beta"}, proposed   # beta > 0: every step runs
    step_only = {"learning_rate", "loss_type", "scale_rewards", "mask_truncated_completions"}
    assert not step_only & set(op._candidates(swe, dead))
    assert step_only <= set(op._candidates(swe, Evidence(health_report={"engine": {"dead_group_ratio": 0.9}})))
    with_kl = swe.with_knobs(beta=0.05)
    assert step_only <= set(op._candidates(with_kl, dead))


def test_beta_is_left_out_when_no_step_of_the_lineage_moved_the_adapter():
    """A never-trained LoRA adapter equals the base model: with every group dead, a KL term to the base
    is 0 with a 0 gradient, so a beta child trains as its control. Once the lineage trained (or its
    adapter is unknown, or a guided call is imitated), beta is proposed again."""
    from evotrainer.loop.seed import DOMAIN_HARNESSES

    swe = HarnessProgram.from_file(DOMAIN_HARNESSES["swe"])
    report = {"engine": {"dead_group_ratio": 1.0}}
    op = KnobOperator(seed=0, fixed={"num_iterations": 1})
    assert "beta" not in op._candidates(swe, Evidence(health_report=report, adapter_trained=False))
    assert "beta" in op._candidates(swe, Evidence(health_report=report, adapter_trained=True))
    assert "beta" in op._candidates(swe, Evidence(health_report=report))
    assert "beta" in op._candidates(swe, Evidence(health_report={"engine": {"dead_group_ratio": 0.5}},
                                                  adapter_trained=False))
    imitating = swe.with_knobs(guided_call_share=0.5, guided_imitation=1.0)
    assert "beta" in op._candidates(imitating, Evidence(health_report=report, adapter_trained=False))
    assert Evidence.from_dict({"health_report": report, "adapter_trained": False}).adapter_trained is False


def test_restricted_knobs_and_alert_preference():
    parent = reference()
    op = KnobOperator(seed=0, knobs=["temperature"])
    assert {op.propose([parent], Evidence()).details["knob"] for _ in range(5)} == {"temperature"}
    op = KnobOperator(seed=0)
    ev = Evidence(health_report={"alerts": [{"name": "exploration_collapse", "message": "raise the temperature"}]})
    picks = [op.propose([parent], ev).details["knob"] for _ in range(30)]
    assert picks.count("temperature") > 30 / 10 * 1.5   # 3x weight among 10 knobs: ~25% vs 10%


def test_tpe_learns_from_told_fitness():
    """Fitness peaks at learning_rate = 3e-6 (range 1e-6..1e-3, log scale). After being told the
    fitness of each child, TPE's later proposals sit much closer to the peak than random search's."""
    parent = HarnessProgram(SMALL)
    best = math.log10(3e-6)

    def late_distance(sampler):
        op = KnobOperator(seed=0, knobs=["learning_rate"], n_startup_trials=10, sampler=sampler)
        distances = []
        for _ in range(40):
            iv = op.propose([parent], Evidence())
            distance = abs(math.log10(iv.details["new"]) - best)
            distances.append(distance)
            op.tell(iv.child_hash, -distance ** 2)
        assert op.pending() == []
        return sum(distances[-20:]) / 20

    tpe, random_search = late_distance("tpe"), late_distance("random")
    assert tpe < 0.5 and tpe < 0.6 * random_search, (tpe, random_search)


def test_duplicates_of_known_genomes_are_not_proposed():
    parent = HarnessProgram(SMALL)
    op = KnobOperator(seed=0, knobs=["num_generations"])
    first = op.propose([parent], Evidence())
    known = {first.child_hash}
    second = op.propose([parent], Evidence(known_hashes=known))
    assert second.child_hash not in known and second.details["new"] != first.details["new"]
    # Both alternatives known: every attempt is a duplicate, and the operator says so.
    with pytest.raises(OperatorError) as err:
        op.propose([parent], Evidence(known_hashes=known | {second.child_hash}))
    assert err.value.kind == "duplicate" and "attempts" in err.value.reason


def test_study_persists_in_storage(tmp_path):
    url = f"sqlite:///{tmp_path / 'knobs.db'}"
    parent = reference()
    op = KnobOperator(seed=0, storage=url, study_name="s1")
    iv = op.propose([parent], Evidence())
    reloaded = KnobOperator(seed=1, storage=url, study_name="s1")
    reloaded.tell(iv.child_hash, 0.5)        # a restarted process can still report the child
    trial = reloaded.study.trials[iv.details["trial"]]
    assert trial.value == 0.5 and trial.user_attrs["child_hash"] == iv.child_hash
    with pytest.raises(KeyError):
        reloaded.tell("0" * 64, 1.0)


def test_no_tunable_knob():
    parent = HarnessProgram(SMALL.replace('"learning_rate"', '"lr"'))
    with pytest.raises(OperatorError, match="no tunable knob") as err:
        KnobOperator(knobs=["fixed"]).propose([parent], Evidence())
    assert err.value.kind == "input"


def test_an_evolved_knob_range_gets_its_own_parameter():
    """Optuna refuses one parameter name with two distributions; a changed range must not break the study."""
    a = HarnessProgram(SMALL)
    b = HarnessProgram(SMALL.replace('"range": [1, 100]', '"range": [1, 500]'))
    op = KnobOperator(seed=0, knobs=["max_steps"])
    first, second = op.propose([a], Evidence()), op.propose([b], Evidence())
    assert 1 <= second.details["new"] <= 500 and first.details["knob"] == second.details["knob"] == "max_steps"
    params = {p for t in op.study.trials for p in t.params}
    assert "max_steps" in params and any(p.startswith("max_steps@") for p in params)
