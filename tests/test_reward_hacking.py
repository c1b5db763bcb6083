"""Shaped rewards that cannot fool the engine: a format credit the policy games is caught by its trend
(reward rising while correctness falls), whatever the reward's scale, and the math verifier's format
rule does not pay for "Answer: Answer: ..."."""

import pytest

from evotrainer.domains.math.verifier import verify_math
from evotrainer.fitness.cache import write_version
from evotrainer.fitness.gates import gate
from evotrainer.records.rollout import Rollout

N = 8   # rollouts per step (2 groups of 4)


def steps(correct_per_step, format_per_step, correct_pay=1.0, format_pay=0.5):
    """Train rollouts whose shaped reward pays ``format_pay`` for the answer form alone."""
    out = []
    for step, (nc, nf) in enumerate(zip(correct_per_step, format_per_step)):
        for i in range(N):
            ok, fmt = i < nc, i < max(nc, nf)
            out.append(Rollout(task_id=f"s{step}t{i // 4}", messages=[{"role": "user", "content": "q"}],
                               completion="Answer: Answer:" if fmt and not ok else "7", step=step, group=i // 4,
                               visible={"correct": ok, "format_ok": fmt},
                               reward=correct_pay if ok else format_pay if fmt else 0.0, advantage=0.0))
    return out


def heldout(n_correct, n=48):
    return [Rollout(task_id=f"h{i}", messages=[{"role": "user", "content": "q"}], completion="c", seed=0,
                    split="heldout", hidden={"correct": i < n_correct}) for i in range(n)]


def verdict(tmp_path, name, train, before, after):
    d = gate(write_version(tmp_path / name, train, heldout(after), heldout(before)))
    return next(c for c in d.checks if c.name == "reward_hacking"), d


@pytest.mark.parametrize("scale", [1.0, 1.5])
def test_format_credit_gamed_by_the_policy_is_invalid_at_any_scale(tmp_path, scale):
    """The field case: training reward 0.01 -> 0.35 while held-out 0.271 -> 0.021."""
    hacked = steps([1, 1, 0, 0], [1, 4, 7, 8], correct_pay=scale, format_pay=0.5 * scale)
    check, d = verdict(tmp_path, f"hacked{scale}", hacked, before=13, after=1)
    assert not check.passed and not d.valid and not d.promote, check.message
    assert check.numbers["reward_rise"] > 0.2 and check.numbers["heldout_change"] < -0.2
    assert "reward_hacking" in " ".join(d.reasons)


@pytest.mark.parametrize("scale", [1.0, 1.5])
def test_an_honest_partial_credit_reward_is_valid_at_any_scale(tmp_path, scale):
    """Reward and correctness rising together is learning, not hacking (the old level rule marked a
    partial-credit reward on [0, 1] invalid and did not judge the same shaping on [0, 1.5] at all)."""
    honest = steps([1, 2, 3, 4], [2, 3, 4, 5], correct_pay=scale, format_pay=0.5 * scale)
    check, _ = verdict(tmp_path, f"honest{scale}", honest, before=13, after=15)
    assert check.passed, check.message


def test_a_reward_that_rises_while_only_held_out_falls_is_caught(tmp_path):
    flat = steps([1, 1, 1, 1], [1, 4, 7, 8])
    check, _ = verdict(tmp_path, "flat", flat, before=13, after=2)
    assert not check.passed


@pytest.mark.parametrize("completion, ok", [
    ("Answer: 7", True), ("Answer:\n7", True), (r"so \boxed{7}", True), ("Answer: 3 + 4 = 7", True),
    ("Answer: Answer: Answer: 7", False), ("Answer: Answer: Answer:", False), ("Answer:", False),
    ("Answer: banana", False), ("Answer: Answer: 8 Answer: Answer:", False), ("7", False),
])
def test_format_means_one_parseable_answer_in_the_required_form(completion, ok):
    assert verify_math(completion, "7")["format_ok"] is ok
