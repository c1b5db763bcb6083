"""A knob that only the changed hook read is part of that change, not a second factor: an RLOO
``advantages`` that does not scale leaves ``scale_rewards`` read by nothing, and the child is accepted
whether it removes the knob or leaves it declared. Through the real operators and acceptance rules,
on children of the reference harness."""

import pytest

from evotrainer.genome import reference_program as reference
from evotrainer.genome.contract import check_contract
from evotrainer.genome.edits import check_single_factor, drop_knobs, factors_changed, orphaned_knobs, rewrite_hook
from evotrainer.genome.errors import SingleFactorError
from evotrainer.operators import Evidence, OperatorError, get_operator
from evotrainer.operators.acceptance import make_intervention
from evotrainer.operators.llm_client import Completion

RLOO = '''def advantages(groups, rewards):
    """RLOO: each rollout's baseline is the mean reward of the other rollouts of its group."""
    out = []
    for rs in rewards:
        n = len(rs)
        total = sum(rs)
        out.append([r - (total - r) / (n - 1) if n > 1 else 0.0 for r in rs])
    return out'''
HEADER = ("HYPOTHESIS: If the baseline leaves the rollout out, advantages are unbiased, because the mean "
          "no longer includes the rollout itself.\nEXPECT: dead_group_ratio < 0.9\nFACTOR: hook:advantages\n\n")
KNOB_LINE = '    "scale_rewards": {"value": "group", "choices": ["group", "batch", "none"]},\n'
EVIDENCE = Evidence(health_report={"metrics": {"dead_group_ratio": 0.95}, "alerts": []})


class Client:
    def __init__(self, text):
        self.text = text

    def complete(self, messages, max_tokens=1024, temperature=0.7):
        return Completion(self.text, prompt_tokens=10, completion_tokens=10)


def without_line(program, line):
    assert program.source.count(line) == 1
    return program.with_source(program.source.replace(line, ""))


def test_a_rewrite_that_leaves_the_orphaned_knob_declared_is_accepted_without_it():
    parent = reference()
    op = get_operator("llm_rewrite", client=Client(HEADER + "```python\n" + RLOO + "\n```\n"), hook="advantages")
    iv = op.propose([parent], EVIDENCE)
    child = iv.child()
    assert iv.factors == ["hook:advantages"] and "scale_rewards" not in child.knobs
    assert set(child.knobs) == set(parent.knobs) - {"scale_rewards"}
    assert '-    "scale_rewards"' in iv.diff
    check_contract(child)


def test_a_diff_that_removes_the_orphaned_knob_is_one_factor():
    parent = reference()
    old = parent.segment(parent.functions["advantages"])
    diff = (HEADER + "<<<<<<< SEARCH\n" + KNOB_LINE + "=======\n>>>>>>> REPLACE\n\n"
            + "<<<<<<< SEARCH\n" + old + "\n=======\n" + RLOO + "\n>>>>>>> REPLACE\n")
    iv = get_operator("llm_diff", client=Client(diff)).propose([parent], EVIDENCE)
    assert iv.factors == ["hook:advantages"] and "scale_rewards" not in iv.child().knobs
    assert check_single_factor(parent, iv.child()) == ["hook:advantages"]


def test_a_knob_the_changed_hook_did_not_read_still_counts():
    parent = reference()
    # The reward hook never read scale_rewards: removing it beside a reward change is two factors.
    reward = 'def reward(rollouts, tasks):\n    return [1.0 if r["visible"].get("correct") else 0.1 for r in rollouts]'
    child = without_line(rewrite_hook(parent, "reward", reward), KNOB_LINE)
    assert orphaned_knobs(parent, child) == []
    with pytest.raises(SingleFactorError):
        check_single_factor(parent, child)
    with pytest.raises(OperatorError) as err:
        make_intervention("t", [parent], child, Evidence(), hypothesis="h", expected_effect=None)
    assert err.value.kind == "single_factor"
    # An advantages hook that still reads the knob: removing it is a change of its own.
    still_reads = RLOO.replace('    out = []', '    scale = KNOBS["scale_rewards"]["value"]\n    out = []')
    child = without_line(rewrite_hook(parent, "advantages", still_reads), KNOB_LINE)
    assert factors_changed(parent, child) == ["knob:scale_rewards", "hook:advantages"]


def test_drop_knobs_keeps_the_rest_of_the_program():
    parent = reference()
    child = drop_knobs(parent, ["scale_rewards", "beta"])
    assert set(child.knobs) == set(parent.knobs) - {"scale_rewards", "beta"}
    assert child.hooks == parent.hooks and KNOB_LINE not in child.source
    extra = KNOB_LINE.rstrip("\n") + ' "x_": {"value": 1, "choices": [1, 2]},\n'
    inline = parent.with_source(parent.source.replace(KNOB_LINE, extra))
    assert drop_knobs(inline, ["x_"]).knobs == parent.knobs
