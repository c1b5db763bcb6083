"""Several branches' rows in one KV-decoder batch (``TransformersEngine.generate_many``): each row is
decoded under its own adapter with its own seeded generator, so it gets the tokens and log-probs it
gets alone; the population's steps and verification then share batches in the loop, and a run's
versions, decisions and scores do not depend on whether they did."""

import pytest
import torch

from evotrainer.policy.base_model import load_base_model
from evotrainer.policy.collect import shares_batches
from evotrainer.policy.kv_decoder import KVDecoder, RowLora, lora_deltas
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.policy.rollout_engine import SamplingParams, TransformersEngine, chat_ids

PROMPTS = [[{"role": "user", "content": f"Count to {i}, then say {'yes' * i}."}] for i in range(1, 7)]
BRANCHES = ("b1", "b2", "b3")


@pytest.fixture(scope="module")
def policy():
    model, tok = load_base_model("tiny-random", seed=0, initializer_range=0.5)
    pol = Policy(model, tok, LoraSettings(r=4, lora_alpha=8, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    torch.manual_seed(3)
    for name in BRANCHES:
        pol.create(name)
        with torch.no_grad():
            for p in pol.parameters(name):
                p.add_(torch.randn_like(p) * 0.3)     # each branch really differs from the base and the others
    return pol


def test_row_lora_logits_equal_each_branch_alone(policy):
    decoder = KVDecoder(policy.model)
    ids = chat_ids(policy.tokenizer, PROMPTS[:4])
    width = max(map(len, ids))
    x = torch.tensor([[0] * (width - len(p)) + p for p in ids])
    valid = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in ids])
    names = ["b1", None, "b3", "b1"]
    loras = [lora_deltas(policy.model, n) for n in ("b1", None, "b3")]
    mixed = decoder.forward(decoder.new_cache(4, width), x, valid, RowLora(torch.tensor([0, 1, 2, 0]), loras))
    for i, name in enumerate(names):
        alone = decoder.forward(decoder.new_cache(1, width), x[i:i + 1], valid[i:i + 1],
                                lora_deltas(policy.model, name))
        assert torch.allclose(mixed[i], alone[0], atol=1e-4)
    assert not torch.allclose(mixed[0], mixed[2], atol=1e-2)      # the branches' rows did differ


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_job_samples_what_it_samples_alone(policy, temperature):
    eng = TransformersEngine(policy, decoder="kv", batch_size=4)   # 6 prompts: two chunks a job
    jobs = [(PROMPTS, SamplingParams(temperature=temperature, max_new_tokens=10, seed=s), a)
            for s, a in ((1, "b1"), (2, "b2"), (1, None), (3, "b3"))]
    together = eng.generate_many(jobs)
    for (prompts, params, adapter), got in zip(jobs, together):
        alone = eng.generate(prompts, params, adapter)
        assert [c.completion_ids for c in got] == [c.completion_ids for c in alone], adapter
        for g, a in zip(got, alone):
            assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(a.logprobs), atol=1e-4)
            assert g.text == a.text and g.stop_reason == a.stop_reason
    if temperature > 0:   # the same prompts under other adapters and seeds gave other samples
        assert [c.completion_ids for c in together[0]] != [c.completion_ids for c in together[1]]


def test_jobs_that_sample_differently_are_decoded_apart(policy):
    """A temperature above 0 is per row (a temperature child shares its siblings' batch); greedy rows, a
    completion cap or a top-p of their own decode apart."""
    eng = TransformersEngine(policy, decoder="kv")
    calls = []
    original = eng._sample_kv
    eng._sample_kv = lambda reqs: calls.append(len(reqs)) or original(reqs)
    hot = SamplingParams(temperature=1.0, max_new_tokens=6, seed=0)
    cool = SamplingParams(temperature=0.5, max_new_tokens=6, seed=0)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6, seed=0)
    capped = SamplingParams(temperature=1.0, max_new_tokens=4, seed=0)
    nucleus = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=6, seed=0)
    out = eng.generate_many([(PROMPTS[:2], hot, "b1"), (PROMPTS[:2], cool, "b2"), (PROMPTS[:2], hot, "b3"),
                             ([], hot, "b1"), (PROMPTS[:2], greedy, "b2"), (PROMPTS[:2], capped, "b3"),
                             (PROMPTS[:2], nucleus, "b1")])
    assert sorted(calls) == [1, 1, 1, 3] and [len(o) for o in out] == [2, 2, 2, 0, 2, 2, 2]
    for job, params, adapter in ((1, cool, "b2"), (4, greedy, "b2"), (5, capped, "b3"), (6, nucleus, "b1")):
        alone = eng.generate(PROMPTS[:2], params, adapter)
        assert [c.completion_ids for c in out[job]] == [c.completion_ids for c in alone]
        for g, a in zip(out[job], alone):
            assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(a.logprobs), atol=1e-4)


def test_rows_of_several_temperatures_sample_what_each_samples_alone(policy):
    """Per-row temperatures in one batch: each job gets the tokens and log-probs it gets alone, and a
    cooler temperature really sharpens the recorded distribution."""
    eng = TransformersEngine(policy, decoder="kv", batch_size=4)
    jobs = [(PROMPTS, SamplingParams(temperature=t, max_new_tokens=8, seed=s), a)
            for t, s, a in ((1.0, 1, "b1"), (0.3, 2, "b2"), (1.7, 1, None))]
    together = eng.generate_many(jobs)
    for (prompts, params, adapter), got in zip(jobs, together):
        alone = eng.generate(prompts, params, adapter)
        assert [c.completion_ids for c in got] == [c.completion_ids for c in alone], params.temperature
        for g, a in zip(got, alone):
            assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(a.logprobs), atol=1e-4)
    mean_logp = [sum(sum(c.logprobs) / len(c.logprobs) for c in got) / len(got) for got in together]
    assert mean_logp[1] > mean_logp[2]      # temperature 0.3's samples are likelier than 1.7's
    with pytest.raises(ValueError, match="all > 0 or all 0"):
        eng._kv.sample_rows([[1, 2], [1, 3]], [None, None], seeds=[(2, 0)], max_new_tokens=2,
                            temperature=[0.0, 1.0], top_k=0, top_p=1.0, eos=set(), pad=0)


def test_the_transformers_engine_shares_batches_for_single_turn_domains(policy):
    from evotrainer.domains import get_domain

    eng = TransformersEngine(policy)
    assert shares_batches(eng, get_domain("math", n_train=4, n_heldout=2, n_test=2), 2)
    assert not shares_batches(eng, get_domain("math", n_train=4, n_heldout=2, n_test=2), 1)


def _run(run_dir):
    from evotrainer.config import parse_config
    from evotrainer.loop.experiment import Experiment
    from tests.loop_runs import tiny_cfg

    exp = Experiment(parse_config(tiny_cfg(run_dir, operators={"knobs": 1.0, "library": 1.0})))
    exp.run()
    out = {}
    for vid in exp.versions():
        vd = exp.vdir(vid)
        m = vd.meta()
        out[vid] = (m.status, m.parents, m.genome_hash, m.metrics.get("heldout_accuracy"),
                    m.metrics.get("selection_accuracy"), [r.completion_ids for r in vd.rollouts("train")])
    return out, exp.state.events


def test_a_run_is_the_same_whether_its_versions_share_batches(tmp_path, monkeypatch):
    """The tiny loop twice: versions trained in lock step, their groups and held-out prompts in one
    batch per step, then one version after another (no generate_many): the same versions, statuses,
    scores and training tokens."""
    batched, events = _run(tmp_path / "batched")
    assert any("together" in e for e in events), "the population never shared a batch"
    monkeypatch.delattr(TransformersEngine, "generate_many")
    alone, _ = _run(tmp_path / "alone")
    assert batched == alone


@pytest.mark.parametrize("temperatures", [(1.0, 1.0, 1.0), (1.0, 0.5, 1.7)])
def test_rows_leaving_early_and_jobs_of_other_sizes_keep_their_own_tokens(policy, temperatures):
    """Many stop tokens, so rows finish at very different steps and the batch shrinks (RowLora.select),
    and jobs of 1, 3 and 6 prompts, so later chunks hold some jobs' rows only; each job at one
    temperature, or each at its own (per-row temperatures must follow the rows that stay)."""
    eng = TransformersEngine(policy, decoder="kv", batch_size=4)
    vocab = int(policy.model.get_output_embeddings().weight.shape[0])
    ids = chat_ids(policy.tokenizer, PROMPTS)
    jobs = [(ids[:1], "b1", 4), (ids[:3], None, 5), (ids, "b3", 6)]
    kw = dict(max_new_tokens=12, top_k=0, top_p=1.0, eos=set(range(0, vocab, 7)), pad=0)
    rows = [p for p, _, _ in jobs for p in p]
    eng._kv_sampler("b1")
    per_row = [t for (j, _, _), t in zip(jobs, temperatures) for _ in j]
    together = eng._kv.sample_rows([p for j, _, _ in jobs for p in j], [a for j, a, _ in jobs for _ in j],
                                   seeds=[(len(j), s) for j, _, s in jobs], temperature=per_row, **kw)
    lengths = {len(s.ids) for s in together}
    assert len(lengths) > 2 and min(lengths) < 6, "rows should finish at different steps"
    at = 0
    for (prompts, adapter, seed), temperature in zip(jobs, temperatures):
        alone = eng._kv.sample(prompts, adapter, seed=seed, temperature=temperature, **kw)
        for a, t in zip(alone, together[at:at + len(prompts)]):
            assert a.ids == t.ids and torch.allclose(torch.tensor(a.logprobs), torch.tensor(t.logprobs), atol=1e-4)
        at += len(prompts)
    assert at == len(rows)


def test_several_branches_continue_their_own_rows_at_the_next_call(policy):
    """The next turn of every branch's episodes in one call: each branch's rows start from the cache
    rows its previous turn left (only the new tokens are prefilled), and decode as if prefilled afresh."""
    eng = TransformersEngine(policy, decoder="kv", batch_size=8)
    ids = chat_ids(policy.tokenizer, PROMPTS[:4])
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6, seed=0)
    first = eng.generate_ids_many([(ids[:2], greedy, "b1", None), (ids[2:], greedy, "b2", None)])
    tool = policy.tokenizer("tool says ok", add_special_tokens=False)["input_ids"]
    nxt = [[p + c.completion_ids + tool for p, c in zip(part, done)] for part, done in ((ids[:2], first[0]), (ids[2:], first[1]))]
    asks = [(nxt[0], greedy, "b1", None), (nxt[1], greedy, "b2", None)]
    before = eng._kv.reused_tokens
    continued = eng.generate_ids_many(asks)
    # every token the first call's rows fed (the prompt and all sampled tokens but the last)
    assert eng._kv.reused_tokens - before == sum(len(p) + len(c.completion_ids) - 1 for part, done in
                                                 ((ids[:2], first[0]), (ids[2:], first[1])) for p, c in zip(part, done))
    eng._kv.forget()
    fresh = eng.generate_ids_many(asks)
    for a, b in zip(continued, fresh):
        assert [c.completion_ids for c in a] == [c.completion_ids for c in b]
        for x, y in zip(a, b):
            assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)


def test_each_shared_batch_is_logged_with_its_jobs_rows_and_settings(policy, caplog, tmp_path):
    """The trace that says why a population's sampling shares batches or not, and the demo benchmark's
    reading of it (benchmarks/demo_lockstep.py)."""
    import importlib.util
    import logging
    from pathlib import Path

    eng = TransformersEngine(policy, decoder="kv")
    hot = SamplingParams(temperature=1.0, max_new_tokens=4, seed=0)
    cool = SamplingParams(temperature=0.5, max_new_tokens=4, seed=0)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=4, seed=0)
    with caplog.at_level(logging.DEBUG, logger="evotrainer.policy.rollout_engine.batches"):
        eng.generate_many([(PROMPTS[:2], hot, "b1"), (PROMPTS[:3], greedy, "b2"), (PROMPTS[:2], cool, "b3")])
    lines = [r.getMessage() for r in caplog.records if r.name.endswith(".batches")]
    assert len(lines) == 2
    assert lines[0].startswith("batch: 2 jobs, 4 rows, temperature=1/0.5 ")
    assert lines[1].startswith("batch: 1 jobs, 3 rows, temperature=0 ")
    log = tmp_path / "together.batches.log"
    log.write_text("\n".join(lines + ["an unrelated line"]) + "\n")
    spec = importlib.util.spec_from_file_location("demo_lockstep", Path(__file__).parents[1] / "benchmarks" / "demo_lockstep.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    got = demo.batches(log)
    assert {k: (v["calls"], v["rows"]) for k, v in got["by_jobs"].items()} == {"1 jobs": (1, 3), "2 jobs": (1, 4)}
    assert len(got["by_settings"]) == 2 and all(v["seconds"] >= 0 for v in got["by_jobs"].values())
    assert demo.batches(tmp_path / "missing.log") == {"by_jobs": {}, "by_settings": {}}
