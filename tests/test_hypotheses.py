"""Hypotheses that are checked: what replay cannot predict passes the backtest as untestable, and
every intervention's expected effect is judged after training (confirmed / refuted / untestable)."""

import pytest

from evotrainer.fitness.backtest import backtest, replay_reaches
from evotrainer.fitness.cache import write_version
from evotrainer.fitness.hypothesis import judge_effect
from evotrainer.genome.edits import rewrite_hook
from evotrainer.genome.program import reference_program
from evotrainer.operators.intervention import FITNESS_METRIC, ExpectedEffect
from evotrainer.records.rollout import Rollout

REF = reference_program()
FORMAT_CREDIT = '''def reward(rollouts, tasks):
    """Format credit: 0.2 for an answer in the required form, 1 for a correct one."""
    return [1.0 if r["visible"].get("correct") else 0.2 if r["visible"].get("format_ok") else 0.0 for r in rollouts]
'''


def rollout(task, step, group, correct, fmt, truncated):
    return Rollout(task_id=task, messages=[{"role": "user", "content": "q"}], completion="x", completion_ids=[1, 2],
                   logprobs=[-1.0, -1.0], step=step, group=group, truncated=truncated,
                   visible={"correct": correct, "format_ok": fmt}, reward=float(correct), advantage=0.0)


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """Eight dead groups (all wrong), formats vary in half of them; most completions truncated."""
    train = [rollout(f"t{g}", g // 4, g % 4, False, fmt=(g % 2 == 0 and i < 2), truncated=i > 0)
             for g in range(8) for i in range(4)]
    heldout = [Rollout(task_id=f"h{i}", messages=[{"role": "user", "content": "q"}], completion="c", seed=0,
                       split="heldout", hidden={"correct": i % 3 == 0}) for i in range(12)]
    return write_version(tmp_path_factory.mktemp("parent"), train, heldout)


def test_a_sampling_knob_cannot_be_predicted_by_replay_and_is_not_rejected(parent):
    """The demo's case: max_completion_length 32 -> 64 expecting fewer truncations was rejected as
    'MISSED: predicted 0.578 (parent 0.578)'. Replay cannot resample; that is untestable, not a miss."""
    child = REF.with_knobs(max_completion_length=128)
    assert not replay_reaches(REF, child)
    bt = backtest(child, parent, expect="truncation_rate < 0.4")
    assert bt.expectation_status == "untestable" and bt.accept, bt.reasons
    assert "sampling or training" in " ".join(bt.reasons)


def test_a_knob_a_replayed_hook_reads_is_testable(parent):
    child = REF.with_knobs(scale_rewards="none")          # advantages() reads it
    assert replay_reaches(REF, child)


def test_a_reward_change_is_judged_on_what_replay_recomputes_only(parent):
    child = rewrite_hook(REF, "reward", FORMAT_CREDIT)
    met = backtest(child, parent, expect="dead_group_ratio < 0.75")     # format varies in 4 of 8 dead groups
    assert met.expectation_status == "met" and met.accept
    missed = backtest(child, parent, expect="dead_group_ratio < 0.1")
    assert missed.expectation_status == "missed" and not missed.accept
    # Truncation is a property of the sampled rollouts: a reward cannot change it in replay.
    later = backtest(child, parent, expect="truncation_rate < 0.4")
    assert later.expectation_status == "untestable" and later.accept


def test_judged_against_the_control_after_training():
    expected = ExpectedEffect("dead_group_ratio", "<", 0.5).to_dict()
    assert judge_effect(expected, {"dead_group_ratio": 0.9}, {"dead_group_ratio": 0.3})["verdict"] == "confirmed"
    refuted = judge_effect(expected, {"dead_group_ratio": 0.9}, {"dead_group_ratio": 0.8})
    assert refuted["verdict"] == "refuted" and "0.8" in refuted["reason"]
    delta = ExpectedEffect("truncation_rate", "delta<", -0.1).to_dict()
    assert judge_effect(delta, {"truncation_rate": 0.6}, {"truncation_rate": 0.3})["verdict"] == "confirmed"
    assert judge_effect(delta, {}, {"truncation_rate": 0.3})["verdict"] == "untestable"
    assert judge_effect(None, {}, {})["verdict"] == "untestable"


def test_a_fitness_claim_needs_the_paired_ci_not_the_means():
    claim = ExpectedEffect(FITNESS_METRIC, "delta>", 0.0).to_dict()
    noisy = {"mean_delta": 0.083, "ci_low": -0.02, "ci_high": 0.19, "level": 0.9}
    clear = {"mean_delta": 0.15, "ci_low": 0.04, "ci_high": 0.26, "level": 0.9}
    v = judge_effect(claim, {FITNESS_METRIC: 0.25}, {FITNESS_METRIC: 0.333}, noisy)
    assert v["verdict"] == "refuted" and v["ci"] == [-0.02, 0.19]     # +8 points of noise confirm nothing
    assert judge_effect(claim, {}, {}, clear)["verdict"] == "confirmed"


def test_the_old_name_of_the_fitness_is_read_as_the_new_one():
    assert ExpectedEffect("heldout_score", "delta>", 0).metric == FITNESS_METRIC == "heldout_accuracy"
