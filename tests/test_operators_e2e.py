"""End to end with a real LLM: the local base model through transformers, llm_diff on the
reference harness. The models here cannot write a usable reply in the tokens allowed (a 135M model in
64 tokens, the tiny random one at all): greedy decoding makes the outcome fixed, a counted parse
rejection with its reason, never a crash; the tokens are spent and counted, and a spent budget stops
the next proposal. Accepted children are tested on recorded replies (test_operators_llm.py)."""

import pytest

from evotrainer.genome import HarnessProgram, reference_program
from evotrainer.operators import Evidence, OperatorError, get_operator, run_operator
from evotrainer.operators.llm_client import LocalClient, TokenBudget
from evotrainer.records.history import proposals

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
def test_local_llm_diff_reply_that_does_not_parse_is_a_counted_rejection():
    parent = reference_program()
    budget = TokenBudget(max_calls=1)
    op = get_operator("llm_diff", client=local_client(budget), max_tokens=64, temperature=0.0)
    stats = {}
    with pytest.raises(OperatorError) as err:
        run_operator(op, [parent], Evidence(health_report=REPORT), stats)
    assert err.value.kind == "parse" and err.value.reason.startswith("reply does not parse: ")
    assert stats["llm_diff"].rejections == {"parse": 1} and stats["llm_diff"].accepted == 0
    assert stats["llm_diff"].prompt_tokens > 1000 and 0 < stats["llm_diff"].completion_tokens <= 64
    assert budget.calls == 1 and budget.tokens == stats["llm_diff"].prompt_tokens + stats["llm_diff"].completion_tokens
    # The budget is spent: the next proposal stops cleanly before calling the model.
    with pytest.raises(OperatorError) as err:
        op.propose([parent], Evidence(health_report=REPORT))
    assert err.value.kind == "budget"


@pytest.mark.parametrize("name", ["llm_rewrite", "llm_crossover", "llm_repair"])
def test_every_free_form_llm_operator_runs_on_a_real_local_model(name):
    """The tiny random model through the real LocalClient (its replies are noise): each operator asks
    the model, spends and counts its tokens, and ends in a counted parse rejection."""
    parent = reference_program()
    budget = TokenBudget(max_calls=1)
    client = LocalClient("tiny-random", greedy=True, budget=budget, threads=1)
    op = get_operator(name, client=client, max_tokens=32, temperature=0.0)
    other = HarnessProgram(parent.source.replace('"temperature": {"value": 1.0', '"temperature": {"value": 0.7'))
    assert other.source != parent.source
    parents = [parent, other] if name == "llm_crossover" else [parent]
    evidence = Evidence(health_report=REPORT)
    if name == "llm_repair":
        evidence.failed_source = parent.source.replace("def reward(rollouts, tasks):", "def reward(rollouts, tasks)")
        evidence.failure = "syntax error at line 60: expected ':'"
    stats = {}
    with pytest.raises(OperatorError) as err:
        run_operator(op, parents, evidence, stats, name=name)
    assert err.value.kind == "parse" and err.value.reason.startswith("reply does not parse: ")
    assert stats[name].rejections == {"parse": 1} and stats[name].accepted == 0
    assert stats[name].prompt_tokens > 100 and 0 < stats[name].completion_tokens <= 32
    assert budget.calls == 1 and budget.tokens == stats[name].prompt_tokens + stats[name].completion_tokens


def test_a_loop_whose_every_proposal_is_rejected_says_so_at_the_end(tmp_path):
    import io

    from rich.console import Console

    from evotrainer.config import parse_config
    from evotrainer.loop.experiment import Experiment
    from tests.loop_runs import tiny_cfg

    cfg = tiny_cfg(tmp_path / "run", operators={"llm_diff": 1.0}, generations=2, children_per_generation=1,
                   llm={"model": "tiny-random", "max_tokens": 16})
    exp = Experiment(parse_config(cfg))
    try:
        exp.run()
        out = io.StringIO()
        exp.print_summary(Console(file=out, width=300))
    finally:
        exp.close()
    rejected = [h for h in proposals(exp.state.history) if h.outcome == "operator_rejected"]
    assert rejected and not any(exp.vdir(v).meta().operator for v in exp.versions())
    assert f"no child was made: all {len(rejected)} proposal(s) were rejected by their operators" in out.getvalue()
    assert sum("llm_diff proposal for v0000 rejected" in e for e in exp.state.events) >= 1
