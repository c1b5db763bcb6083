"""Guided tool calls (policy/guided_decoding.py, the SWE call grammar, the guided_call_share knob):
a random model decodes well-formed calls under the grammar on both decoders, records the unguided
log-probability the trainer recomputes, leaves free rows untouched, and training episodes split
into guided and free members while held-out episodes stay free."""

import pytest
import torch

from evotrainer.domains.swe.environment import call_grammar, parse_call, tool_prompt
from evotrainer.policy.base_model import load_base_model
from evotrainer.policy.episodes import guided_members
from evotrainer.policy.guided_decoding import GuidedRows, compile_grammar
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.policy.rollout_engine import SamplingParams, TransformersEngine

FILES = ["pkg/__init__.py", "pkg/mod.py", "tests/test_mod.py"]
ASK = [{"role": "system", "content": tool_prompt()}, {"role": "user", "content": "Fix the bug in pkg/mod.py."}]


@pytest.fixture(scope="module")
def policy():
    model, tok = load_base_model("tiny-random", seed=0, initializer_range=0.5)
    pol = Policy(model, tok, LoraSettings(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    pol.create("br")
    with torch.no_grad():   # a trained-looking adapter (a fresh one equals the base model)
        torch.manual_seed(1)
        for p in pol.parameters("br"):
            p.add_(torch.randn_like(p) * 0.3)
    return pol


def _hf_logps(policy, prompt, ids, temperature):
    """log p of each of ``ids`` after ``prompt`` under the adapter, as the trainer computes it."""
    x = torch.tensor([prompt + ids])
    with torch.no_grad(), policy.adapter("br") as m:
        logits = m(input_ids=x).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None]).squeeze(1)


@pytest.mark.parametrize("decoder", ["kv", "generate"])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_guided_rows_decode_calls_the_environment_accepts_and_free_rows_do_not(policy, decoder, temperature):
    engine = TransformersEngine(policy, decoder=decoder)
    grammar = call_grammar(FILES)
    params = SamplingParams(temperature=temperature, max_new_tokens=200, seed=3)
    out = engine.generate_ids(engine.encode([ASK] * 4), params, "br", grammars=[grammar, None, grammar, grammar])
    for i in (0, 2, 3):
        name, args = parse_call(out[i].text)          # raises ToolError on a malformed call
        assert out[i].stop_reason == "eos"
        for key in ("path", "tests"):
            value = args.get(key)
            assert value is None or set([value] if isinstance(value, str) else value) <= set(FILES)
    with pytest.raises(Exception, match="tool"):       # a random model's own text is no call
        parse_call(out[1].text)


def test_a_guided_row_leaves_the_free_rows_of_its_batch_as_they_were(policy):
    engine = TransformersEngine(policy, decoder="kv")
    params = SamplingParams(temperature=1.0, max_new_tokens=40, seed=5)
    free = engine.generate_ids(engine.encode([ASK] * 3), params, "br")
    mixed = engine.generate_ids(engine.encode([ASK] * 3), params, "br", grammars=[None, call_grammar(FILES), None])
    assert [c.completion_ids for c in (free[0], free[2])] == [c.completion_ids for c in (mixed[0], mixed[2])]
    assert mixed[1].completion_ids != free[1].completion_ids


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_a_guided_token_records_the_policys_unguided_logprob(policy, temperature):
    """The importance ratio against the trainer's recomputation is 1 on the first pass: the sampler
    records log p under the unmasked distribution, not the renormalised masked one."""
    engine = TransformersEngine(policy, decoder="kv")
    prompt = engine.encode([ASK])[0]
    (c,) = engine.generate_ids([prompt], SamplingParams(temperature=temperature, max_new_tokens=60, seed=2), "br",
                               grammars=[call_grammar(FILES)])
    want = _hf_logps(policy, prompt, c.completion_ids, temperature)
    assert torch.allclose(torch.tensor(c.logprobs), want, atol=2e-3)
    # and the mask mattered: some forced token is one the free policy would rarely draw
    assert min(c.logprobs) < -3.0


def test_a_grammar_llguidance_cannot_read_is_a_clear_error(policy):
    with pytest.raises(ValueError, match="not valid llguidance Lark"):
        compile_grammar('start: "a" undefined_rule')
    with pytest.raises(ValueError, match="one per sequence"):
        TransformersEngine(policy).generate_ids([[1, 2]], SamplingParams(), grammars=["start: \"a\"", None])


def test_the_mask_allows_only_what_the_grammar_allows_next(policy):
    tok = policy.tokenizer
    vocab = policy.base_model.get_output_embeddings().weight.shape[0]
    rows = GuidedRows(tok, [call_grammar(FILES), None], vocab)
    masked = rows.mask_(torch.zeros(2, vocab), [0, 1])
    allowed = torch.isfinite(masked[0]).nonzero().squeeze(1).tolist()
    assert allowed and all("```tool".startswith(tok.decode([t])) for t in allowed)
    assert torch.isfinite(masked[1]).all()          # a free row is untouched


def test_guided_members_split_each_group_and_refuse_a_share_outside_0_1():
    assert guided_members(2, 4, 0.5) == [True, True, False, False] * 2
    assert guided_members(1, 4, 0.0) == [False] * 4
    assert guided_members(1, 4, 0.25) == [True, False, False, False]
    with pytest.raises(ValueError, match="within"):
        guided_members(1, 4, 1.5)


def test_training_episodes_split_into_guided_and_free_members_and_heldout_stays_free(tiny):
    from evotrainer.domains.code.executor import ExecLimits
    from evotrainer.domains.swe.domain import SWEDomain
    from evotrainer.domains.swe.environment import EnvLimits
    from evotrainer.policy.collect import collect_groups, verify

    model, tok = tiny
    pol = Policy(model, tok, LoraSettings(r=4, lora_alpha=8))
    pol.create("g0")
    limits = EnvLimits(max_turns=2, max_turn_tokens=120, max_context_tokens=4000)
    domain = SWEDomain(n_train=2, n_heldout=1, n_test=1, difficulty=1, seed=0, workers=1,
                       limits=ExecLimits(timeout_s=2.0), episode_limits=limits)
    try:
        engine = TransformersEngine(pol)
        params = SamplingParams(max_new_tokens=120, seed=3, guided_call_share=0.5)
        rollouts = collect_groups(engine, domain, domain.tasks("train"), 2, params, "g0", step=0)
        assert [r.episode["guided"] for r in rollouts] == [True, False, True, False]
        for r in rollouts:
            cut = [t["tokens"] >= limits.max_turn_tokens for t in r.turn_log]
            parsed = [c.get("name") is not None for c in r.tool_calls]
            if r.episode["guided"]:   # every guided turn is a call the environment parsed, unless cut short
                assert all(p or c for p, c in zip(parsed, cut)), r.tool_calls
                assert any(parsed), r.turn_log
            else:                     # a random model's own turns are no calls
                assert not any(parsed)
        held = verify(engine, domain, domain.tasks("heldout"), "g0", max_new_tokens=120)
        assert all(not r.episode["guided"] for r in held)
    finally:
        domain.close()


def test_the_swe_library_answers_malformed_calls_with_guidance_and_the_report_reads_free_episodes():
    from evotrainer.genome.edits import factors_changed
    from evotrainer.genome.harness import Harness
    from evotrainer.genome.program import HarnessProgram
    from evotrainer.loop.seed import DOMAIN_HARNESSES
    from evotrainer.operators import get_operator
    from evotrainer.operators.base import Evidence
    from evotrainer.operators.library import default_entries, propose_entry

    swe = HarnessProgram.from_file(DOMAIN_HARNESSES["swe"])
    report = {"metrics": {"turns_mean": 4.0, "malformed_call_rate": 1.0, "dead_group_ratio": 1.0}}
    found, skipped = get_operator("library").applicable(swe, Evidence(health_report=report))
    assert "swe_guided_tool_calls" in {a.entry.id for a in found}, skipped
    entry = {e.id: e for e in default_entries()}["swe_guided_tool_calls"]
    assert [c["value"] for c in entry.combinations(swe)] == [0.25, 0.5]
    iv = propose_entry("library", swe, entry, {"value": 0.5}, Evidence(health_report=report))
    child = HarnessProgram(iv.child_source)
    assert factors_changed(swe, child) == ["knob:guided_call_share"] and child.knobs["guided_call_share"]["value"] == 0.5
    # Guided episodes' calls are well-formed by construction: the call-form rates read the free ones.
    def ep(guided, ok):
        calls = [{"name": "list_files" if ok else None, "args": {}, "ok": ok}]
        return {"task_id": "t", "messages": [{"role": "user", "content": "issue"}], "completion": "", "turns": 1,
                "tool_calls": calls, "step": 0, "group": 0, "split": "train", "truncated": False,
                "visible": {"correct": False, "format_ok": True}, "episode": {"guided": guided}}
    rs = [ep(True, True), ep(False, False), ep(True, True), ep(False, False)]
    with Harness(swe) as h:
        m = h.metrics(rs, [rs])
    assert m["malformed_call_rate"] == 1.0 and m["guided_episode_rate"] == 0.5


def test_the_config_check_refuses_guidance_where_it_cannot_run():
    from evotrainer.config import parse_config
    from evotrainer.loop.validate import config_problems

    math = parse_config({"model": "tiny-random", "grpo": {"guided_call_share": 0.5}})
    assert any("guided_call_share" in p and "swe" in p for p in config_problems(math, loop=False))
    swe = {"model": "tiny-random", "domain": {"name": "swe", "difficulty": 1}, "grpo": {"guided_call_share": 0.5}}
    assert not any("guided_call_share" in p for p in config_problems(parse_config(swe), loop=False))
    vllm = parse_config({**swe, "engine": "vllm"})
    assert any("engine: transformers" in p for p in config_problems(vllm, loop=False))
