"""The KV decoder and sampler (policy/kv_decoder.py, kv_sampler.py) against the Hugging Face model with
peft: same logits, same greedy tokens, the sampled distribution, continued episodes, fallbacks."""

import logging

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from evotrainer.policy.base_model import load_base_model, load_tokenizer
from evotrainer.policy.grpo import GRPOConfig, GRPOTrainer
from evotrainer.policy.kv_decoder import KVDecoder, lora_deltas, supports
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.policy.rollout_engine import SamplingParams, TransformersEngine, chat_ids
from evotrainer.records.rollout import Rollout

PROMPTS = [[{"role": "user", "content": f"Count to {i}, then say {'yes' * i}."}] for i in range(1, 6)]


def _randomise(policy, name, std=0.3):
    """A trained-looking adapter (a fresh one has B = 0 and equals the base model)."""
    with torch.no_grad():
        for p in policy.parameters(name):
            p.add_(torch.randn_like(p) * std)


def _policy(targets=("q_proj", "k_proj", "v_proj", "o_proj"), model=None, **lora):
    if model is None:
        model, tok = load_base_model("tiny-random", seed=0, initializer_range=0.5)
    else:
        tok = load_tokenizer("tiny-random")
    pol = Policy(model, tok, LoraSettings(r=4, lora_alpha=8, target_modules=list(targets), **lora))
    pol.create("br")
    torch.manual_seed(1)
    _randomise(pol, "br")
    return pol


def _padded(tok, prompts):
    ids = chat_ids(tok, prompts)
    width = max(map(len, ids))
    x = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in ids])
    valid = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in ids])
    return x, valid


def _hf_last_logits(policy, adapter, ids, valid):
    pos = (valid.long().cumsum(1) - 1).clamp(min=0)
    with torch.no_grad(), policy.adapter(adapter) as m:
        return m(input_ids=ids, attention_mask=valid.long(), position_ids=pos).logits[:, -1].float()


@pytest.mark.parametrize("targets", [
    ("q_proj", "k_proj", "v_proj", "o_proj"),
    ("q_proj", "v_proj", "up_proj", "down_proj"),          # fused groups with a projection left out
    ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
])
def test_prefill_and_decode_logits_equal_the_peft_model(targets):
    pol = _policy(targets)
    ids, valid = _padded(pol.tokenizer, PROMPTS)
    dec = KVDecoder(pol.model)
    for adapter in ("br", None):
        lora = lora_deltas(pol.model, adapter)
        cache = dec.new_cache(len(PROMPTS), ids.shape[1] + 4)
        got = dec.forward(cache, ids, valid, lora)
        assert (got - _hf_last_logits(pol, adapter, ids, valid)).abs().max() < 2e-4   # fp32 sums, logits ~20
        nxt = got.argmax(-1, keepdim=True)
        got2 = dec.forward(cache, nxt, torch.ones_like(nxt, dtype=torch.bool), lora)
        ids2, valid2 = torch.cat([ids, nxt], 1), torch.cat([valid, torch.ones_like(nxt, dtype=torch.bool)], 1)
        assert (got2 - _hf_last_logits(pol, adapter, ids2, valid2)).abs().max() < 2e-4
    # The adapter really acts: its logits are not the base model's.
    base = dec.forward(dec.new_cache(len(PROMPTS), ids.shape[1]), ids, valid, lora_deltas(pol.model, None))
    adapted = dec.forward(dec.new_cache(len(PROMPTS), ids.shape[1]), ids, valid, lora_deltas(pol.model, "br"))
    assert (base - adapted).abs().max() > 1e-2


def test_a_model_with_attention_biases_qwen2():
    tok = load_tokenizer("tiny-random")
    cfg = AutoConfig.for_model("qwen2", vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                               max_position_embeddings=512, tie_word_embeddings=False, use_sliding_window=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.bias.normal_(0, 0.5)
            layer.self_attn.k_proj.bias.normal_(0, 0.5)
    assert supports(model.config) is None
    pol = _policy(model=model)
    ids, valid = _padded(tok, PROMPTS)
    got = KVDecoder(pol.model).forward(KVDecoder(pol.model).new_cache(len(PROMPTS), ids.shape[1]), ids, valid,
                                       lora_deltas(pol.model, "br"))
    assert (got - _hf_last_logits(pol, "br", ids, valid)).abs().max() < 2e-4


def test_greedy_tokens_and_logprobs_equal_generate():
    pol = _policy()
    kv, gen = TransformersEngine(pol, decoder="kv"), TransformersEngine(pol, decoder="generate")
    params = SamplingParams(temperature=0, max_new_tokens=12)
    a, b = kv.generate(PROMPTS, params, "br"), gen.generate(PROMPTS, params, "br")
    assert [x.completion_ids for x in a] == [x.completion_ids for x in b]
    assert [x.stop_reason for x in a] == [x.stop_reason for x in b]
    for x, y in zip(a, b):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4, rtol=1e-4)


def test_sampled_first_tokens_follow_the_processed_distribution():
    """Inverse-CDF draws: the first token's frequencies over many samples match the distribution
    after temperature and top-p, and nothing outside the nucleus is ever drawn."""
    pol = _policy()
    eng = TransformersEngine(pol, decoder="kv", batch_size=500)
    prompt = PROMPTS[:1] * 2000
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=1, seed=3)
    outs = eng.generate(prompt, params, "br")
    ids, valid = _padded(pol.tokenizer, PROMPTS[:1])
    logits = _hf_last_logits(pol, "br", ids, valid)[0] / 0.7
    from transformers import TopPLogitsWarper
    probs = torch.softmax(TopPLogitsWarper(0.9)(None, logits[None])[0], -1)
    counts = torch.zeros_like(probs)
    for o in outs:
        counts[o.completion_ids[0]] += 1
        assert probs[o.completion_ids[0]] > 0
        assert abs(o.logprobs[0] - float(probs[o.completion_ids[0]].log())) < 1e-4
    top = probs.topk(3).indices
    for t in top:   # binomial standard error at n = 2000 is at most 0.011
        assert abs(float(counts[t] / len(outs) - probs[t])) < 0.04, (int(t), float(probs[t]))


def test_same_seed_same_tokens_and_batches_are_seeded_apart():
    pol = _policy()
    eng = TransformersEngine(pol, decoder="kv", batch_size=2)
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)
    a, b = eng.generate(PROMPTS, params, "br"), eng.generate(PROMPTS, params, "br")
    assert [x.completion_ids for x in a] == [x.completion_ids for x in b]
    c = eng.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=8, seed=6), "br")
    assert [x.completion_ids for x in a] != [x.completion_ids for x in c]


def test_a_group_prompt_is_prefilled_once_and_a_common_opening_once():
    pol = _policy()
    eng = TransformersEngine(pol, decoder="kv")
    eng.generate(PROMPTS[:2] * 4, SamplingParams(max_new_tokens=4, seed=1), "br")
    a, b = chat_ids(pol.tokenizer, PROMPTS[:2])
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)   # the chat template's system prompt and more
    assert shared >= 8
    assert eng._kv.prefilled_tokens == len(a) + len(b) - shared


def test_greedy_results_do_not_depend_on_what_else_is_in_the_batch():
    """Shared openings, groups and rows leaving the batch early change no row's tokens or log-probs."""
    pol = _policy()
    eng = TransformersEngine(pol, decoder="kv")
    params = SamplingParams(temperature=0, max_new_tokens=10)
    mixed = PROMPTS + PROMPTS[:2]
    together = eng.generate(mixed, params, "br")
    for p, t in zip(mixed, together):
        alone = eng.generate([p], params, "br")[0]
        assert alone.completion_ids == t.completion_ids
        assert torch.allclose(torch.tensor(alone.logprobs), torch.tensor(t.logprobs), atol=1e-4)


def _continue(eng, first, extra, params, adapter="br"):
    """The next turn: each sequence so far, then ``extra`` tokens, continued."""
    return eng.generate_ids([c.prompt_ids + c.completion_ids + extra for c in first], params, adapter)


def test_a_continued_sequence_reuses_the_cache_and_samples_what_a_fresh_engine_samples():
    pol = _policy()
    eng, fresh = TransformersEngine(pol, decoder="kv"), TransformersEngine(pol, decoder="kv")
    params = SamplingParams(temperature=0, max_new_tokens=6)
    first = eng.generate(PROMPTS, params, "br")
    extra = pol.tokenizer("\nuser: go on\nassistant:", add_special_tokens=False)["input_ids"]
    before = eng._kv.prefilled_tokens
    again = _continue(eng, first, extra, params)
    # Only the new tokens are prefilled: the last sampled token (never fed) and the extra ones.
    assert eng._kv.prefilled_tokens - before == len(first) * (len(extra) + 1)
    assert eng._kv.reused_tokens >= sum(len(c.prompt_ids) for c in first)
    alone = _continue(fresh, first, extra, params)
    assert fresh._kv.reused_tokens == 0
    assert [x.completion_ids for x in again] == [x.completion_ids for x in alone]
    for x, y in zip(again, alone):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4, rtol=1e-4)
    # A subset of the sequences (episodes that ended left the batch) still continues from the cache.
    before = eng._kv.reused_tokens
    _continue(eng, again[1:3], extra, params)
    assert eng._kv.reused_tokens > before


def test_a_trained_adapter_never_continues_from_a_stale_cache():
    pol = _policy()
    eng, fresh = TransformersEngine(pol, decoder="kv"), TransformersEngine(pol, decoder="kv")
    params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=2)
    first = eng.generate(PROMPTS[:2] * 2, params, "br")
    rollouts = [Rollout(task_id=str(i // 2), messages=[], completion=c.text, prompt_ids=c.prompt_ids,
                        completion_ids=c.completion_ids, logprobs=c.logprobs, truncated=c.truncated)
                for i, c in enumerate(first)]
    GRPOTrainer(pol, "br", GRPOConfig(learning_rate=0.5, num_generations=2)).step(rollouts, [1.0, -1.0, -1.0, 1.0])
    before = eng._kv.reused_tokens
    greedy = SamplingParams(temperature=0, max_new_tokens=6)
    again = _continue(eng, first, [pol.tokenizer.eos_token_id], greedy)
    assert eng._kv.reused_tokens == before
    assert [x.logprobs for x in again] == [x.logprobs for x in _continue(fresh, first, [pol.tokenizer.eos_token_id],
                                                                         greedy)]


def test_an_adapter_it_cannot_run_falls_back_to_generate_and_says_so(caplog):
    from peft import LoraConfig

    pol = _policy()
    pol.model.add_adapter("dora", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_dora=True))
    pol.branches.append("dora")
    _randomise(pol, "dora")
    eng = TransformersEngine(pol)
    with caplog.at_level(logging.WARNING):
        outs = eng.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=5), "dora")
    assert "generate" in caplog.text and "DoRA" in caplog.text
    ref = TransformersEngine(pol, decoder="generate").generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=5),
                                                               "dora")
    assert [o.completion_ids for o in outs] == [o.completion_ids for o in ref]
    eng.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=5), "br")   # the other adapter still can
    assert eng._kv is not None and eng._kv.prefilled_tokens > 0
    with pytest.raises(ValueError, match="decoder 'kv' cannot"):
        TransformersEngine(pol, decoder="kv").generate(PROMPTS, SamplingParams(max_new_tokens=2), "dora")


def test_unsupported_architectures_are_named():
    assert "model_type 'gpt2'" in supports(AutoConfig.for_model("gpt2"))
    assert supports(AutoConfig.for_model("llama", hidden_act="gelu")) is not None
    with pytest.raises(ValueError, match="decoder must be one of"):
        TransformersEngine(None, decoder="fast")


def test_rows_that_finish_early_leave_the_batch_without_changing_the_others():
    """Rows cut by a stop token at different steps: the batch shrinks (the finished rows' cache is
    kept apart), every row's tokens are its unstopped tokens up to the stop (each row's draws do not
    depend on which rows are left), and a next turn continues every row, finished early or not,
    from the kept cache."""
    from evotrainer.policy.kv_sampler import KVSampler

    pol = _policy()
    sampler = KVSampler(pol)
    prompts = chat_ids(pol.tokenizer, PROMPTS * 2)
    kw = dict(max_new_tokens=12, temperature=1.0, top_k=0, top_p=1.0, seed=0, pad=pol.tokenizer.pad_token_id)
    free = sampler.sample(prompts, "br", eos=set(), **kw)
    # A stop token that ends rows at different steps (and leaves some rows running to the end).
    firsts = {}
    for s in free:
        for i, t in enumerate(s.ids):
            firsts.setdefault(t, {})
            firsts[t].setdefault(id(s), i)
    stop = max(firsts, key=lambda t: (len(set(firsts[t].values())), -len(firsts[t])))
    assert len(set(firsts[stop].values())) >= 2
    cut = sampler.sample(prompts, "br", eos={stop}, **kw)
    [pieces] = sampler.kept.values()
    assert len(pieces) >= 2                             # at least one shrink: finished rows kept apart
    for f, c in zip(free, cut):
        n = f.ids.index(stop) + 1 if stop in f.ids else len(f.ids)
        assert c.ids == f.ids[:n]
        assert torch.allclose(torch.tensor(c.logprobs), torch.tensor(f.logprobs[:n]), atol=1e-4)
    nxt = [p + c.ids + [11, 12] for p, c in zip(prompts, cut)]
    before = sampler.prefilled_tokens
    greedy = dict(kw, temperature=0)
    again = sampler.sample(nxt, "br", eos=set(), **greedy)
    assert sampler.prefilled_tokens - before == 3 * len(nxt)          # the stop token and the two new ones
    fresh = KVSampler(pol).sample(nxt, "br", eos=set(), **greedy)
    assert [a.ids for a in again] == [f.ids for f in fresh]
