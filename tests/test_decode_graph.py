"""The decode step at static shapes (policy/decode_graph.py), the one a CUDA graph captures: on this CPU
it runs without capture and must compute what ``KVDecoder.forward`` computes, step after step, for
one branch and for rows of several, and the sampler must sample the same tokens with it."""

import logging
from types import SimpleNamespace

import pytest
import torch

from evotrainer.policy.base_model import load_base_model
from evotrainer.policy.decode_graph import StaticDecodeStep, decode_step, graphs_supported
from evotrainer.policy.kv_decoder import KVDecoder, RowLora, lora_deltas
from evotrainer.policy.kv_sampler import KVSampler
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.policy.rollout_engine import SamplingParams, TransformersEngine, chat_ids

PROMPTS = [[{"role": "user", "content": f"Count to {i}, then say {'yes' * i}."}] for i in range(1, 6)]


@pytest.fixture(scope="module")
def policy():
    model, tok = load_base_model("tiny-random", seed=0, initializer_range=0.5)
    pol = Policy(model, tok, LoraSettings(r=4, lora_alpha=8, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    torch.manual_seed(2)
    for name in ("b1", "b2"):
        pol.create(name)
        with torch.no_grad():
            for p in pol.parameters(name):
                p.add_(torch.randn_like(p) * 0.3)
    return pol


def _prefilled(decoder, policy, lora, extra):
    ids = chat_ids(policy.tokenizer, PROMPTS)
    width = max(map(len, ids))
    x = torch.tensor([[0] * (width - len(p)) + p for p in ids])
    valid = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in ids])
    cache = decoder.new_cache(len(ids), width + extra)
    return cache, decoder.forward(cache, x, valid, lora)


@pytest.mark.parametrize("rows", ["one branch", "several branches"])
def test_static_steps_equal_forward_on_the_growing_prefix(policy, rows):
    decoder = KVDecoder(policy.model)
    if rows == "one branch":
        lora = lora_deltas(policy.model, "b1")
    else:
        loras = [lora_deltas(policy.model, n) for n in ("b1", None, "b2")]
        lora = RowLora(torch.tensor([0, 1, 2, 0, 2]), loras)
    steps = 6
    a, logits_a = _prefilled(decoder, policy, lora, steps)
    b, logits_b = _prefilled(decoder, policy, lora, steps)
    for k, v in zip(b.k, b.v):      # positions past the filled prefix hold stale values: masked, never read
        k[:, :, b.length:] = torch.randn_like(k[:, :, b.length:]) * 10
        v[:, :, b.length:] = torch.randn_like(v[:, :, b.length:]) * 10
    static = StaticDecodeStep(decoder, b, lora, capture=False)
    for step in range(steps):
        nxt = logits_a.argmax(-1, keepdim=True)
        # Rows 1 and 3 finish at step 2: padding from then on, as the sampler feeds a static batch.
        valid = torch.ones_like(nxt, dtype=torch.bool)
        if step >= 2:
            valid[[1, 3]] = False
            nxt = nxt.masked_fill(~valid, 0)
        logits_a = decoder.forward(a, nxt, valid, lora)
        logits_b = static(nxt, valid)
        live = valid.squeeze(1)
        assert torch.allclose(logits_a[live], logits_b[live], atol=1e-4), step
        assert torch.isfinite(logits_b).all()          # a padding row stays finite
    assert a.length == b.length and torch.equal(a.valid, b.valid) and torch.equal(a.next_pos, b.next_pos)
    for ka, kb in zip(a.k, b.k):
        assert torch.allclose(ka[:, :, :a.length], kb[:, :, :b.length], atol=1e-5)
    with pytest.raises(ValueError, match="KV cache holds"):
        static(nxt, valid)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_sampler_samples_the_same_tokens_at_static_shapes(policy, temperature):
    """Rows that stop early (the dynamic sampler shrinks its batch, the static one feeds them
    padding) get the same tokens and log-probs either way, and a next turn continues from the kept
    cache in both."""
    prompts = chat_ids(policy.tokenizer, PROMPTS * 2)
    kw = dict(max_new_tokens=10, temperature=temperature, top_k=0, top_p=1.0, seed=4,
              pad=policy.tokenizer.pad_token_id)
    free = KVSampler(policy, static=False).sample(prompts, "b1", eos=set(), **kw)
    firsts = {}
    for s in free:                  # a stop token that ends rows at different steps
        for i, t in enumerate(s.ids):
            firsts.setdefault(t, {}).setdefault(id(s), i)
    stop = max(firsts, key=lambda t: (len(set(firsts[t].values())), -len(firsts[t])))
    dynamic, static = KVSampler(policy, static=False), KVSampler(policy, static=True)
    a = dynamic.sample(prompts, "b1", eos={stop}, **kw)
    b = static.sample(prompts, "b1", eos={stop}, **kw)
    assert any(len(x.ids) < kw["max_new_tokens"] for x in a)       # some rows did stop early
    assert [x.ids for x in a] == [y.ids for y in b]
    for x, y in zip(a, b):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)
    nxt = [p + x.ids + [11, 12] for p, x in zip(prompts, a)]
    greedy = dict(kw, temperature=0)
    before = static.prefilled_tokens
    again_a, again_b = dynamic.sample(nxt, "b1", eos=set(), **greedy), static.sample(nxt, "b1", eos=set(), **greedy)
    assert static.prefilled_tokens - before == 3 * len({tuple(s) for s in nxt})   # continued from the kept rows
    assert [x.ids for x in again_a] == [y.ids for y in again_b]


def test_rows_of_several_branches_sample_alike_at_static_shapes(policy):
    jobs = [(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=8, seed=s), a)
            for s, a in ((1, "b1"), (2, None), (3, "b2"))]
    dynamic = TransformersEngine(policy, decoder="kv").generate_many(jobs)
    engine = TransformersEngine(policy, decoder="kv")
    engine._kv = KVSampler(policy, static=True)
    static = engine.generate_many(jobs)
    for got, want in zip(static, dynamic):
        assert [c.completion_ids for c in got] == [c.completion_ids for c in want]


def test_static_shapes_are_the_default_on_cuda_only(policy):
    assert KVSampler(policy).static is False           # this CPU: the growing prefix is cheaper
    decoder = KVDecoder(policy.model)
    cache = decoder.new_cache(1, 4)
    assert not isinstance(decode_step(decoder, cache, None, static=False, steps=32), StaticDecodeStep)
    step = decode_step(decoder, cache, None, static=True, steps=32)
    assert isinstance(step, StaticDecodeStep) and step.capture is False   # no capture off CUDA


def test_a_rope_that_cannot_be_captured_and_a_failed_capture_are_named(policy):
    decoder = KVDecoder(policy.model)
    assert graphs_supported(decoder) is None
    decoder.rotary = SimpleNamespace(rope_type="dynamic")      # recomputes its frequencies per position
    assert "dynamic" in graphs_supported(decoder)
    decoder = KVDecoder(policy.model)
    decoder.graph_failure = "operation not permitted when stream is capturing"
    assert "an earlier capture failed" in graphs_supported(decoder)


def test_a_capture_that_fails_is_logged_and_the_step_runs_eagerly(policy, caplog):
    """Capture asked where it cannot happen (this CPU build has no CUDA graphs): the failure is
    logged once, nothing was written by it, and every step still equals forward's."""
    decoder = KVDecoder(policy.model)
    lora = lora_deltas(policy.model, "b2")
    a, logits_a = _prefilled(decoder, policy, lora, 4)
    b, _ = _prefilled(decoder, policy, lora, 4)
    step = StaticDecodeStep(decoder, b, lora, capture=True)
    with caplog.at_level(logging.WARNING, logger="evotrainer.policy.decode_graph"):
        for _ in range(4):
            nxt = logits_a.argmax(-1, keepdim=True)
            ones = torch.ones_like(nxt, dtype=torch.bool)
            logits_a = decoder.forward(a, nxt, ones, lora)
            assert torch.allclose(logits_a, step(nxt, ones), atol=1e-4)
    warnings = [r for r in caplog.records if "could not be captured" in r.getMessage()]
    assert len(warnings) == 1 and step.capture is False and step.graph is None
    assert decoder.graph_failure and graphs_supported(decoder) is not None   # not tried again on this decoder


def test_the_config_reaches_the_sampler(policy):
    """``train.cuda_graphs`` sets the transformers engine's decode: true runs the static step (eagerly
    on this CPU, sampling what the growing prefix samples), false never does, unset follows the device."""
    from evotrainer.config import parse_config
    from evotrainer.policy.engine_choice import build_engine

    params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=2)
    got = {}
    for graphs in (True, False, None):
        cfg = parse_config({"model": "tiny-random", "train": {"cuda_graphs": graphs}})
        engine = build_engine(cfg, policy, "transformers")
        assert engine.static_decode is graphs
        got[graphs] = [c.completion_ids for c in engine.generate(PROMPTS, params, "b1")]
        assert engine._kv.static is bool(graphs)        # None on a CPU: off
    assert got[True] == got[False] == got[None]
