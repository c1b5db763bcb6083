"""Parsing of LLM replies (recorded under tests/fixtures/llm_replies/), and ExpectedEffect checks."""

from pathlib import Path

import pytest

from evotrainer.operators.intervention import ExpectedEffect, Intervention
from evotrainer.operators.parsing import (
    ReplyParseError,
    extract_function,
    parse_blocks,
    parse_crossover_reply,
    parse_diff_reply,
    parse_expected_effect,
    parse_header,
    parse_rewrite_reply,
)

REPLIES = Path(__file__).parent / "fixtures" / "llm_replies"


def reply(name: str) -> str:
    return (REPLIES / name).read_text()


def test_diff_reply_parses_header_and_blocks():
    r = parse_diff_reply(reply("diff_keep_groups.txt"))
    assert r.hypothesis.startswith("If groups whose rollouts")
    assert r.expected_effect == ExpectedEffect("dead_group_ratio", "<", 0.3)
    assert r.factor == "hook:keep_groups"
    assert r.blocks == [("    return [True for _ in groups]\n",
                         '    return [len({bool(r["visible"].get("correct")) for r in g}) > 1 for g in groups]\n')]
    assert r.diff_text.startswith("<<<<<<< SEARCH\n    return [True") and r.diff_text.endswith(">>>>>>> REPLACE\n")


def test_markdown_decoration_and_fences_are_tolerated():
    r = parse_diff_reply(reply("diff_markdown_fenced.txt"))
    assert r.expected_effect == ExpectedEffect("dead_group_ratio", "delta<", -0.1)
    assert r.factor == "hook:reward"
    assert len(r.blocks) == 1 and "0.1 if" in r.blocks[0][1]


@pytest.mark.parametrize("name, reason", [
    ("diff_no_expect.txt", "no 'EXPECT"),
    ("diff_no_factor.txt", "no 'FACTOR:"),
    ("diff_vague_expect.txt", "is not '<metric> <op> <value>'"),
    ("diff_unterminated.txt", "no '>>>>>>> REPLACE' end"),
    ("smollm_ramble.txt", "no 'HYPOTHESIS:' line"),
    ("crossover_take_knob.txt", "no SEARCH/REPLACE blocks"),
])
def test_malformed_diff_replies_are_rejected_with_a_reason(name, reason):
    with pytest.raises(ReplyParseError) as err:
        parse_diff_reply(reply(name))
    assert reason in err.value.reason


def test_empty_reply():
    with pytest.raises(ReplyParseError, match="empty reply"):
        parse_header("  \n")


@pytest.mark.parametrize("text, expected", [
    ("dead_group_ratio < 0.3", ("dead_group_ratio", "<", 0.3)),
    ("reward_spread >= 5e-2", ("reward_spread", ">=", 0.05)),
    ("`correct_rate` delta > 0.02.", ("correct_rate", "delta>", 0.02)),
    ("mean_logprob ≤ -0.1", ("mean_logprob", "<=", -0.1)),
])
def test_expected_effect_forms(text, expected):
    assert parse_expected_effect(text) == ExpectedEffect(*expected)


@pytest.mark.parametrize("text", ["dead groups go down", "dead_group_ratio == 0.3", "x < high", "< 0.3"])
def test_expected_effect_rejects(text):
    with pytest.raises(ReplyParseError):
        parse_expected_effect(text)


def test_block_structure_errors():
    with pytest.raises(ReplyParseError, match="outside a SEARCH block"):
        parse_blocks("=======\nfoo\n>>>>>>> REPLACE\n")
    with pytest.raises(ReplyParseError, match="empty SEARCH"):
        parse_blocks("<<<<<<< SEARCH\n=======\nx = 1\n>>>>>>> REPLACE\n")
    with pytest.raises(ReplyParseError, match="with itself"):
        parse_blocks("<<<<<<< SEARCH\nx = 1\n=======\nx = 1\n>>>>>>> REPLACE\n")


def test_rewrite_reply_extracts_one_function():
    r = parse_rewrite_reply(reply("rewrite_reward.txt"), "reward")
    assert r.code.startswith("def reward(rollouts, tasks):") and r.code.rstrip().endswith("return out")
    assert r.factor == "hook:reward"


@pytest.mark.parametrize("name, hook, reason", [
    ("rewrite_with_helper.txt", "reward", "more than the function reward()"),
    ("rewrite_syntax_error.txt", "reward", "syntax error"),
    ("rewrite_reward.txt", "keep_groups", "reply says FACTOR: hook:reward"),
    ("diff_keep_groups.txt", "keep_groups", "no ```python code block"),
])
def test_rewrite_rejections(name, hook, reason):
    with pytest.raises(ReplyParseError) as err:
        parse_rewrite_reply(reply(name), hook)
    assert reason in err.value.reason


def test_extract_function_reports_missing_function():
    with pytest.raises(ReplyParseError, match="does not define keep_groups"):
        extract_function("```python\ndef reward(rollouts, tasks):\n    return []\n```", "keep_groups")


def test_crossover_reply():
    r = parse_crossover_reply(reply("crossover_take_knob.txt"), ["knob:temperature", "hook:reward"])
    assert r.take == "knob:temperature"
    with pytest.raises(ReplyParseError, match="not one of the differing factors"):
        parse_crossover_reply(reply("crossover_take_unknown.txt"), ["knob:temperature"])


def test_expected_effect_check():
    before, after = {"dead_group_ratio": 0.8}, {"dead_group_ratio": 0.25}
    assert ExpectedEffect("dead_group_ratio", "<", 0.3).check(before, after)
    assert not ExpectedEffect("dead_group_ratio", ">", 0.3).check(before, after)
    assert ExpectedEffect("dead_group_ratio", "delta<", -0.5).check(before, after)
    assert not ExpectedEffect("dead_group_ratio", "delta>", 0.0).check(before, after)
    assert ExpectedEffect("dead_group_ratio", "<=", 0.25).check(before, after)
    # Missing or non-finite metrics cannot confirm a claim.
    assert not ExpectedEffect("reward_spread", ">", 0.0).check(before, after)
    assert not ExpectedEffect("dead_group_ratio", "delta<", 0.0).check({}, after)
    assert not ExpectedEffect("x", "<", 1.0).check({}, {"x": float("nan")})
    with pytest.raises(ValueError, match="unknown effect operator"):
        ExpectedEffect("x", "==", 1.0)


def test_intervention_json_round_trip():
    import json

    iv = Intervention(operator="llm_diff", parent_hashes=["a" * 64], child_source="x = 1\n", child_hash="b" * 64,
                      diff="--- a\n+++ b\n", factor="hook:reward", hypothesis="if x then y because z",
                      expected_effect=ExpectedEffect("dead_group_ratio", "<", 0.3), prompt_tokens=10,
                      completion_tokens=5, evidence={"alerts": ["insufficient_signal"]}, factors=["hook:reward"])
    back = Intervention.from_dict(json.loads(json.dumps(iv.to_dict())))
    assert back == iv
    assert back.to_dict()["expected_effect"] == {"metric": "dead_group_ratio", "op": "<", "value": 0.3}
    assert back.check({"dead_group_ratio": 0.9}, {"dead_group_ratio": 0.1}) and back.total_tokens == 15


def test_a_recorded_smollm2_reply_is_rejected_with_a_reason():
    """SmolLM2-135M-Instruct's greedy answer to the llm_diff prompt on the reference harness (256
    tokens): code without the required header. It must be a clean rejection, not a crash."""
    with pytest.raises(ReplyParseError, match="no 'HYPOTHESIS:' line"):
        parse_diff_reply(reply("smollm2_real_diff_reply.txt"))


def test_a_code_block_nested_past_the_parsers_limit_is_a_reason_not_a_crash():
    reply_text = "```python\ndef reward(rollouts, tasks):\n    return [" + "-" * 20000 + "1]\n```"
    with pytest.raises(ReplyParseError, match="does not parse"):
        extract_function(reply_text, "reward")
