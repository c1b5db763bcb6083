"""Triage: while a blocking alert fires (``adapter_stuck``: live groups, yet training changed no held-out
answer), the diagnosing operators offer only the changes it names. On the misfit suite setting every
child tied its control at exactly 0.000 while the learning-rate entry went undrawn: a change that acts
through training cannot show while training moves nothing."""

from __future__ import annotations

import logging

from evotrainer.fitness.engine_metrics import engine_alerts
from evotrainer.genome import reference_program
from evotrainer.operators.evidence import Evidence
from evotrainer.operators.knobs import KnobOperator, raising_rungs
from evotrainer.operators.library import LibraryOperator, RandomLibraryOperator
from evotrainer.operators.llm_choice import LLMChoiceOperator

# The report of a misfit-recipe child (dev run, domain seed 0): a quarter of the groups had a gradient,
# no held-out answer changed, and the dead groups raise insufficient_signal beside adapter_stuck.
METRICS = {"heldout_changed_rate": 0.0, "dead_group_ratio": 0.75, "reward_std": 0.29, "train_correct_rate": 0.06,
           "heldout_accuracy": 0.167, "truncation_rate": 0.4, "kept_group_ratio": 1.0}


def report(metrics: dict) -> dict:
    return {"metrics": metrics, "alerts": engine_alerts(metrics)}


STUCK = Evidence(health_report=report(METRICS))
MOVING = Evidence(health_report=report(METRICS | {"heldout_changed_rate": 0.3}))   # the same, adapter moving


def test_triage_names_the_knobs_a_blocking_alert_names_and_is_silent_otherwise():
    assert any(a["name"] == "adapter_stuck" for a in STUCK.alerts())
    assert STUCK.triage(["temperature", "learning_rate", "num_generations"]) == ["learning_rate"]
    assert STUCK.triage(["temperature"]) == []
    assert MOVING.triage(["learning_rate"]) is None and Evidence().triage(["learning_rate"]) is None


def test_the_library_offers_only_the_learning_rate_entries_while_the_adapter_is_stuck():
    parent = reference_program()
    found, skipped = LibraryOperator(seed=0).applicable(parent, STUCK)
    assert found and {a.entry.move.knob for a in found if a.entry.move} == {"learning_rate"}
    assert all(max(a.entry.move.factors or (2,)) > 1 for a in found)    # no entry that lowers it
    assert all(a.entry.move is not None for a in found)
    assert "unstick_learning_rate" in {a.entry.id for a in found}
    assert any("blocking alert" in why for why in skipped.values())
    moving, _ = LibraryOperator(seed=0).applicable(parent, MOVING)      # no blocking alert: the usual draw
    assert len(moving) > len(found) and any(a.entry.move is None for a in moving)
    for seed in range(5):
        assert LibraryOperator(seed=seed).propose([parent], STUCK).factors == ["knob:learning_rate"]


def test_the_baseline_draws_at_random_whatever_the_report_says():
    found, _ = RandomLibraryOperator(seed=0).applicable(reference_program(), STUCK)
    assert len({a.entry.factor for a in found}) > 3


def test_when_no_named_change_is_left_the_library_offers_every_fired_entry_and_says_so(caplog):
    parent = reference_program()
    lr_entries = [e.id for e in LibraryOperator(seed=0).entries if e.move and e.move.knob == "learning_rate"]
    tried = Evidence(health_report=STUCK.health_report, refuted={f"{parent.hash}:{e}" for e in lr_entries})
    with caplog.at_level(logging.INFO, logger="evotrainer.operators.library"):
        found, _ = LibraryOperator(seed=0).applicable(parent, tried)
    assert found and all(a.entry.id not in lr_entries for a in found)
    assert "no untried entry moves a knob it names" in caplog.text


def test_the_knobs_operator_moves_only_the_learning_rate_while_the_adapter_is_stuck(tmp_path):
    op = KnobOperator(seed=0, storage=f"sqlite:///{tmp_path}/optuna.db", study_name="t")
    parent = reference_program()
    stuck = [op.propose([parent], STUCK) for _ in range(4)]
    assert {iv.factors[0] for iv in stuck} == {"knob:learning_rate"}
    assert all(iv.details["new"] > iv.details["old"] for iv in stuck)     # raised, as the alert asks
    assert len({op.propose([parent], MOVING).factors[0] for _ in range(12)}) > 1


def test_llm_choice_is_offered_the_learning_rate_alone(tmp_path):
    fired, knobs = LLMChoiceOperator(seed=0).options(reference_program(), STUCK)
    assert list(knobs) == ["learning_rate"] and knobs["learning_rate"]
    assert all(v > reference_program().knobs["learning_rate"]["value"] for v in knobs["learning_rate"])
    assert {a.entry.move.knob for a in fired} == {"learning_rate"}
    _, open_knobs = LLMChoiceOperator(seed=0).options(reference_program(), MOVING)
    assert len(open_knobs) > 1


def test_a_learning_rate_at_the_top_of_its_range_falls_back_to_the_other_changes(tmp_path, caplog):
    """Nothing can raise it further: the operators say so and propose something else, not nothing."""
    top = reference_program().with_knobs(learning_rate=reference_program().knobs["learning_rate"]["range"][1])
    with caplog.at_level(logging.INFO):
        iv = LibraryOperator(seed=0).propose([top], STUCK)
        knob = KnobOperator(seed=0, storage=f"sqlite:///{tmp_path}/optuna.db", study_name="t").propose([top], STUCK)
    assert iv.factors != ["knob:learning_rate"] and knob.factors != ["knob:learning_rate"]
    assert "every knob offered" in caplog.text


def test_a_stuck_adapter_is_offered_the_top_of_the_learning_rate_range_first(tmp_path):
    """TPE's log-uniform draws raised TRL's 1e-6 to 4.4e-5 on the misfit setting and the lineage stayed
    stuck: the rungs (the range's top, then half-decades below it) come first, each once per parent,
    and a study reopened from its storage goes on down the ladder instead of starting it again."""
    parent = reference_program().with_knobs(learning_rate=1e-6)
    storage = f"sqlite:///{tmp_path}/optuna.db"
    op = KnobOperator(seed=0, storage=storage, study_name="t")
    first = [op.propose([parent], STUCK) for _ in range(2)]
    assert [iv.details["new"] for iv in first] == [1e-3, 3.16228e-4]
    assert "largest untried step" in first[0].hypothesis
    again = KnobOperator(seed=0, storage=storage, study_name="t")      # a resumed run
    assert again.propose([parent], STUCK).details["new"] == 1e-4
    after = again.propose([parent], STUCK).details["new"]              # no rung left: TPE draws, still raising
    assert 1e-6 < after and after not in (1e-3, 3.16228e-4, 1e-4)
    again.tell(first[0].child_hash, 0.25)                              # TPE learns from a rung's trial
    assert again.study.best_trial.params["learning_rate"] == 1e-3
    # The library's unstick entry: a hundredfold at least from 1e-6.
    assert min(raising_rungs(parent.knobs["learning_rate"])) == 1e-4
    assert raising_rungs(reference_program().with_knobs(learning_rate=1e-3).knobs["learning_rate"]) == []


def test_every_diagnosing_operator_takes_the_largest_raise_first_and_the_baseline_does_not(tmp_path):
    """Draw 50's histories: at 2 steps a stuck adapter's learning rate raised to 1e-4 changed 4% of the
    held-out answers, to 1.8e-4 8-21%, to 1e-3 79%. The library's unstick entry takes its largest factor
    first, llm_choice is offered the rungs `knobs` takes; `random-library` still draws at random."""
    parent = reference_program().with_knobs(learning_rate=1e-6)
    lib = LibraryOperator(seed=0)
    firsts = {LibraryOperator(seed=s).propose([parent], STUCK).details["params"]["value"] for s in range(4)}
    assert firsts == {1e-3}
    _, knobs = LLMChoiceOperator(seed=0).options(parent, STUCK)
    assert knobs == {"learning_rate": [1e-3, 3.16228e-4, 1e-4]}
    top = parent.with_knobs(learning_rate=1e-3).hash
    _, after = LLMChoiceOperator(seed=0).options(parent, Evidence(health_report=STUCK.health_report, known_hashes={top}))
    assert after == {"learning_rate": [3.16228e-4, 1e-4]}
    entry = next(a for a in lib.applicable(parent, STUCK)[0] if a.entry.id == "unstick_learning_rate")
    drawn = {RandomLibraryOperator(seed=s)._params(entry, STUCK)["value"] for s in range(12)}
    assert len(drawn) > 1
