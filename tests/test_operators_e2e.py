"""End to end with a real LLM: the local base model through transformers, llm_diff on the
reference harness. A 135M model mostly writes unusable edits; what must hold is that the result is
an applied Intervention or a rejection with a reason (counted), never a crash."""

import pytest

from evotrainer.genome import check_contract, factors_changed, reference_program
from evotrainer.operators import REJECTION_KINDS, Evidence, OperatorError, get_operator, run_operator
from evotrainer.operators.llm_client import LocalClient, TokenBudget

REPORT = {
    "metrics": {"dead_group_ratio": 0.92, "reward_spread": 0.02, "correct_rate": 0.02},
    "alerts": [{"name": "insufficient_signal", "severity": "critical", "message": "92% of groups are dead",
                "suggestion": "filter dead groups in keep_groups or make the reward more continuous"}],
}


def local_client(budget):
    # One thread: on a shared 2-core CI box, multi-threaded decoding is several times slower.
    from evotrainer.policy.base_model import ModelNotFoundError

    try:
        client = LocalClient("smollm2-135m", greedy=True, budget=budget, threads=1)
        client._load()
    except ModelNotFoundError:   # the embedded model is preferred; the tiny one keeps the test meaningful
        client = LocalClient("tiny-random", greedy=True, budget=budget, threads=1)
    return client


@pytest.mark.slow
def test_local_llm_diff_is_applied_or_rejected_with_a_reason():
    parent = reference_program()
    budget = TokenBudget(max_calls=1)
    op = get_operator("llm_diff", client=local_client(budget), max_tokens=64, temperature=0.0)
    stats = {}
    try:
        iv = run_operator(op, [parent], Evidence(health_report=REPORT), stats)
    except OperatorError as err:
        assert err.kind in REJECTION_KINDS and err.reason
        assert stats["llm_diff"].rejections == {err.kind: 1}
    else:
        check_contract(iv.child())
        assert factors_changed(parent, iv.child()) == [iv.factor] and iv.expected_effect is not None
        assert stats["llm_diff"].accepted == 1
    assert stats["llm_diff"].prompt_tokens > 1000 and 0 < stats["llm_diff"].completion_tokens <= 64
    assert budget.calls == 1 and budget.tokens == stats["llm_diff"].prompt_tokens + stats["llm_diff"].completion_tokens
    # The budget is spent: the next proposal stops cleanly before calling the model.
    with pytest.raises(OperatorError) as err:
        op.propose([parent], Evidence(health_report=REPORT))
    assert err.value.kind == "budget"
