"""The operator mix as a gate listener: it credits the operator and entry that proposed a child, and
passes the outcome to that operator when its class observes outcomes (the knobs operator's study is
told the paired delta, or a failed trial for an invalid child); an operator that does not observe is
left alone."""

from optuna.trial import TrialState

from evotrainer.genome.program import reference_program
from evotrainer.operators.evidence import Evidence
from evotrainer.operators.registry import OperatorMix
from evotrainer.records.outcome import GateOutcome
from evotrainer.records.version import Status


def outcome(iv, status, delta, operator="knobs"):
    return GateOutcome(child="v0002", control="v0001", operator=operator, entry=iv.details.get("entry"),
                       genome_hash=iv.child_hash, status=status, paired_delta=delta, heldout_accuracy=0.5,
                       verdict="confirmed", domain="math", intervention=iv.to_dict())


def test_the_mix_credits_and_tells_the_knob_study(tmp_path):
    mix = OperatorMix({"knobs": 1.0, "library": 1.0}, seed=0,
                      kwargs_by_name={"knobs": {"storage": f"sqlite:///{tmp_path}/optuna.db"}})
    knobs = mix.operator("knobs")
    good = knobs.propose([reference_program()], Evidence())
    bad = knobs.propose([reference_program()], Evidence())
    mix.observe(outcome(good, Status.PROMOTED, 0.125))
    mix.observe(outcome(bad, Status.INVALID, 0.5))
    trials = {t.number: t for t in knobs.study.trials}
    assert trials[good.details["trial"]].state == TrialState.COMPLETE and trials[good.details["trial"]].value == 0.125
    assert trials[bad.details["trial"]].state == TrialState.FAIL         # invalid: whatever it scored
    assert mix.outcomes["knobs"] == [1, 1]


def test_an_operator_that_does_not_observe_is_only_credited(tmp_path):
    mix = OperatorMix({"knobs": 1.0, "library": 1.0}, seed=0)
    lib = mix.operator("library")
    iv = lib.propose([reference_program()], Evidence(health_report={"metrics": {"dead_group_ratio": 0.9,
                                                                                 "reward_spread": 0.01}}))
    mix.observe(outcome(iv, Status.REJECTED, -0.1, operator="library"))
    assert mix.outcomes["library"] == [0, 1] and mix.entry_outcomes[iv.details["entry"]] == [0, 1]
    assert "knobs" not in mix._instances          # nothing built that the outcome did not concern
