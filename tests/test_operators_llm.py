"""LLM operators on recorded replies (a scripted client): accepted children and every rejection kind."""

from pathlib import Path

import pytest

from evotrainer.genome import reference_program as reference
from evotrainer.genome.edits import factors_changed, rewrite_hook
from evotrainer.operators import Evidence, OperatorError, OperatorMix, get_operator
from evotrainer.operators.llm_client import BudgetExhausted, Completion, LLMError

REPLIES = Path(__file__).parent / "fixtures" / "llm_replies"
REPORT = {
    "metrics": {"dead_group_ratio": 0.92, "reward_spread": 0.02, "reward_mean": 0.03, "correct_rate": 0.03},
    "alerts": [
        {"name": "weak_reward_spread", "severity": "warning", "message": "spread 0.02",
         "suggestion": "add a denser auxiliary signal"},
        {"name": "insufficient_signal", "severity": "critical", "message": "92% of groups are dead",
         "suggestion": "make the reward more continuous"},
    ],
}




class ScriptedClient:
    """An LLMClient that answers with recorded replies (file names) in order, and records prompts."""

    def __init__(self, *replies):
        self.replies = list(replies)
        self.prompts = []

    def complete(self, messages, max_tokens=1024, temperature=0.7):
        self.prompts.append(messages)
        item = self.replies.pop(0)
        if isinstance(item, Exception):
            raise item
        return Completion((REPLIES / item).read_text(), prompt_tokens=1000, completion_tokens=80)


def propose(op_name, reply, parents=None, evidence=None, **kwargs):
    client = ScriptedClient(reply)
    op = get_operator(op_name, client=client, **kwargs)
    return op.propose(parents or [reference()], evidence or Evidence(health_report=REPORT)), client


def rejection(op_name, reply, **kw) -> OperatorError:
    with pytest.raises(OperatorError) as err:
        propose(op_name, reply, **kw)
    return err.value


def test_llm_diff_accepts_a_single_factor_edit():
    parent = reference()
    iv, client = propose("llm_diff", "diff_keep_groups.txt", parents=[parent])
    assert iv.operator == "llm_diff" and iv.factor == "hook:keep_groups" and iv.factors == ["hook:keep_groups"]
    assert iv.parent_hashes == [parent.hash] and iv.child_hash == iv.child().hash != parent.hash
    assert "-    return [True for _ in groups]" in iv.diff and iv.diff.startswith("--- a/")
    assert iv.expected_effect.to_dict() == {"metric": "dead_group_ratio", "op": "<", "value": 0.3}
    assert iv.hypothesis.startswith("If groups") and (iv.prompt_tokens, iv.completion_tokens) == (1000, 80)
    assert iv.evidence["alerts"] == ["weak_reward_spread", "insufficient_signal"]
    # The prompt carries the contract, the parent, the alerts (most severe first) and the reply format.
    prompt = client.prompts[0][-1]["content"]
    assert "def keep_groups(groups)" in prompt and "Only these imports are allowed" in prompt
    assert prompt.index("insufficient_signal") < prompt.index("weak_reward_spread")
    assert "REQUIRED REPLY FORMAT" in prompt and "EXPECT:" in prompt and parent.source.strip() in prompt


def test_llm_diff_tolerates_markdown():
    iv, _ = propose("llm_diff", "diff_markdown_fenced.txt")
    assert iv.factor == "hook:reward" and iv.expected_effect.op == "delta<"


@pytest.mark.parametrize("reply, kind, reason", [
    ("smollm_ramble.txt", "parse", "no 'HYPOTHESIS:' line"),
    ("diff_vague_expect.txt", "parse", "EXPECT line"),
    ("diff_unknown_metric.txt", "parse", "does not measure"),
    ("diff_search_not_found.txt", "edit", "SEARCH text not found"),
    ("diff_outside_evolve.txt", "edit", "outside the EVOLVE blocks"),
    ("diff_two_factors.txt", "single_factor", "changes 2 factors"),
    ("diff_factor_mismatch.txt", "single_factor", "FACTOR knob:temperature"),
    ("diff_forbidden_import.txt", "contract", "import of 'os' is not allowed"),
    ("diff_crashes_on_load.txt", "contract", "ZeroDivisionError"),
])
def test_llm_diff_rejections(reply, kind, reason):
    err = rejection("llm_diff", reply)
    assert err.kind == kind and reason in err.reason, err.reason
    assert err.prompt_tokens == 1000   # tokens spent on a rejected reply still count


def test_contract_failure_keeps_the_child_for_repair():
    err = rejection("llm_diff", "diff_forbidden_import.txt")
    assert "import os" in err.child_source


def test_duplicate_child_is_rejected():
    first, _ = propose("llm_diff", "diff_keep_groups.txt")
    err = rejection("llm_diff", "diff_keep_groups.txt",
                    evidence=Evidence(health_report=REPORT, known_hashes={first.child_hash}))
    assert err.kind == "duplicate" and first.child_hash[:12] in err.reason


def test_multi_factor_allowed_when_evidence_says_so():
    iv, _ = propose("llm_diff", "diff_two_factors.txt", evidence=Evidence(health_report=REPORT, allow_multi_factor=True))
    assert iv.factors == ["knob:temperature", "hook:keep_groups"] and iv.factor == "knob:temperature"


def test_llm_errors_become_rejections():
    for exc, kind in [(BudgetExhausted("LLM call budget spent"), "budget"), (LLMError("server down"), "llm")]:
        op = get_operator("llm_diff", client=ScriptedClient(exc))
        with pytest.raises(OperatorError) as err:
            op.propose([reference()], Evidence())
        assert err.value.kind == kind


def test_llm_rewrite_targets_the_hook_the_alerts_name():
    parent = reference()
    iv, client = propose("llm_rewrite", "rewrite_reward.txt", parents=[parent])
    assert iv.factor == "hook:reward" and iv.details["hook"] == "reward"
    assert "elif r[\"visible\"].get(\"format_ok\")" in iv.child().hooks["reward"]
    assert "Rewrite the hook `reward`" in client.prompts[0][-1]["content"]


def test_llm_rewrite_rejections():
    assert rejection("llm_rewrite", "rewrite_with_helper.txt").kind == "parse"
    assert rejection("llm_rewrite", "rewrite_syntax_error.txt").kind == "parse"
    err = rejection("llm_rewrite", "rewrite_reward.txt", hook="keep_groups")
    assert err.kind == "parse" and "hook:keep_groups" in err.reason


def second_parent(parent):
    """A parent that differs from the reference in two factors: temperature and the reward hook."""
    reward = '''def reward(rollouts, tasks):
    return [1.0 if r["visible"].get("correct") else 0.2 for r in rollouts]'''
    return rewrite_hook(parent.with_knobs(temperature=1.3), "reward", reward)


def test_llm_crossover_takes_the_chosen_factor_from_parent_b():
    a = reference()
    b = second_parent(a)
    iv, client = propose("llm_crossover", "crossover_take_knob.txt", parents=[a, b])
    assert iv.factor == "knob:temperature" and iv.parent_hashes == [a.hash, b.hash]
    assert iv.child().knobs["temperature"]["value"] == 1.3 and iv.child().hooks["reward"] == a.hooks["reward"]
    prompt = client.prompts[0][-1]["content"]
    assert "### knob:temperature" in prompt and "### hook:reward" in prompt and "TAKE:" in prompt


def test_llm_crossover_rejections():
    a = reference()
    err = rejection("llm_crossover", "crossover_take_unknown.txt", parents=[a, second_parent(a)])
    assert err.kind == "parse" and "not one of the differing factors" in err.reason
    assert rejection("llm_crossover", "crossover_take_knob.txt", parents=[a]).kind == "input"
    assert rejection("llm_crossover", "crossover_take_knob.txt", parents=[a, a]).kind == "input"


BROKEN_LINE = ('    return [1.0 if r["visible"].get("correct") else 0.1 if r["visible"].get("format_ok") else 0.0 '
               'for r in rollouts')


def broken_child(parent):
    return parent.source.replace(
        '    return [1.0 if r["visible"].get("correct") else 0.0 for r in rollouts]', BROKEN_LINE)


def test_llm_repair_fixes_a_broken_child():
    parent = reference()
    failed = broken_child(parent)
    ev = Evidence(health_report=REPORT, failed_source=failed, failure="contract: syntax error at line 70: '[' was never closed")
    iv, client = propose("llm_repair", "repair_syntax.txt", parents=[parent], evidence=ev)
    assert iv.factor == "hook:reward" and factors_changed(parent, iv.child()) == ["hook:reward"]
    prompt = client.prompts[0][-1]["content"]
    assert "was never closed" in prompt and BROKEN_LINE in prompt
    assert rejection("llm_repair", "repair_syntax.txt").kind == "input"   # nothing to repair


def test_mix_counts_rejections_and_repairs_contract_failures():
    parent = reference()
    client = ScriptedClient("smollm_ramble.txt", "diff_search_not_found.txt", "diff_keep_groups.txt")
    mix = OperatorMix({"llm_diff": 1.0}, seed=0, shared={"client": client, "seed": 0})
    with pytest.raises(OperatorError):
        mix.propose([parent], Evidence(health_report=REPORT), attempts=2)
    iv = mix.propose([parent], Evidence(health_report=REPORT))
    stats = mix.stats_dict()["llm_diff"]
    assert stats["proposals"] == 3 and stats["accepted"] == 1 and stats["rejections"] == {"parse": 1, "edit": 1}
    assert stats["prompt_tokens"] == 3000 and iv.factor == "hook:keep_groups"

    # A child that failed the contract goes to llm_repair once, with the error text.
    client = ScriptedClient("diff_forbidden_import.txt", "repair_remove_import.txt")
    mix = OperatorMix({"llm_diff": 1.0}, shared={"client": client}, repair=True)
    iv = mix.propose([parent], Evidence(health_report=REPORT))
    assert iv.operator == "llm_repair" and "import of 'os'" in client.prompts[1][-1]["content"]
    assert mix.stats_dict()["llm_diff"]["rejections"] == {"contract": 1}
    assert mix.stats_dict()["llm_repair"]["accepted"] == 1

    # A repair that fails too is in the event log beside the rejection it tried to mend.
    client = ScriptedClient("diff_forbidden_import.txt", "smollm_ramble.txt")
    mix = OperatorMix({"llm_diff": 1.0}, shared={"client": client}, repair=True)
    said = []
    with pytest.raises(OperatorError):
        mix.propose([parent], Evidence(health_report=REPORT), on_reject=lambda name, err: said.append((name, err.kind)))
    assert said == [("llm_diff", "contract"), ("llm_repair", "parse")], said


def test_mix_drops_an_operator_whose_budget_is_spent():
    client = ScriptedClient(BudgetExhausted("LLM token budget would be exceeded"))
    mix = OperatorMix({"llm_diff": 1.0, "knobs": 1.0}, seed=1, shared={"client": client, "seed": 0})
    names = [mix.propose([reference()], Evidence(), attempts=3).operator for _ in range(6)]
    assert set(names) == {"knobs"} and mix.weights["llm_diff"] == 0.0
    assert mix.stats_dict()["llm_diff"]["rejections"] == {"budget": 1}


def test_llm_rewrite_hook_choice():
    op = get_operator("llm_rewrite", client=ScriptedClient())
    parent = reference()
    alerts = [{"name": "info_only", "severity": "info", "message": "reward looks fine"},
              {"name": "dead", "severity": "critical", "message": "dead groups", "suggestion": "filter them"}]
    assert op.choose_hook(parent, Evidence(health_report={"alerts": alerts})) == "keep_groups"  # most severe first
    assert {op.choose_hook(parent, Evidence()) for _ in range(30)} == {"reward", "keep_groups", "advantages"}
    assert get_operator("llm_rewrite", hook="metrics").choose_hook(parent, Evidence(health_report=REPORT)) == "metrics"


def test_the_fitness_metric_is_always_a_checkable_expectation():
    iv, _ = propose("llm_diff", "diff_expects_heldout_accuracy.txt")
    assert iv.expected_effect.metric == "heldout_accuracy" and iv.expected_effect.op == "delta>"
