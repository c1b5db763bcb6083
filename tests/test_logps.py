"""The trainer's two ways to per-token log-probs (policy/logps.py): each distinct prompt once, or every
row whole. Same values and same LoRA gradients on a batch whose groups share prompts of unequal length."""

import torch

from evotrainer.policy.base_model import load_base_model
from evotrainer.policy.grpo import GRPOConfig, GRPOTrainer
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.records.rollout import Rollout


def _policy():
    model, tok = load_base_model("tiny-random", seed=0, initializer_range=0.2)
    pol = Policy(model, tok, LoraSettings(r=4, lora_alpha=8))
    pol.create("b0")
    with torch.no_grad():
        for p in pol.parameters("b0"):
            p.add_(torch.randn_like(p) * 0.1)
    return pol


def _rollouts(tok):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 2000, (n,), generator=g).tolist() for n in (7, 11, 4)]
    out = []
    for i in range(9):   # three groups of three, completions of unequal length
        c = torch.randint(5, 2000, (3 + i % 4,), generator=g).tolist()
        out.append(Rollout(task_id=str(i // 3), messages=[], completion="", prompt_ids=prompts[i // 3],
                           completion_ids=c, logprobs=[-1.0] * len(c), group=i // 3))
    return out


def _logps_and_grads(pol, rollouts, shared, temperature=0.7, top_p=1.0):
    tr = GRPOTrainer(pol, "b0", GRPOConfig(temperature=temperature, top_p=top_p, num_generations=3),
                     shared_prompts=shared)
    batch = tr._batch(rollouts)
    for p in tr.params:
        p.grad = None
    with pol.adapter("b0") as m:
        lp = tr._logps(m, batch)
        (lp * batch["completion_mask"]).sum().backward()
    return lp.detach(), [p.grad.clone() for p in tr.params], batch


def test_shared_prompts_give_the_same_logps_and_gradients():
    pol = _policy()
    rollouts = _rollouts(pol.tokenizer)
    for top_p in (1.0, 0.9):
        shared, g_shared, batch = _logps_and_grads(pol, rollouts, True, top_p=top_p)
        whole, g_whole, _ = _logps_and_grads(pol, rollouts, False, top_p=top_p)
        assert batch["prompt_ids"].shape[0] == 3 and batch["rows"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
        mask = batch["completion_mask"]
        assert float(((shared - whole).abs() * mask).max()) < 1e-4
        assert float((shared * mask).abs().sum()) > 1.0   # not vacuous
        for a, b in zip(g_shared, g_whole):
            assert torch.allclose(a, b, atol=1e-4, rtol=1e-3)
        assert any(float(a.abs().max()) > 1e-3 for a in g_shared)


def test_each_row_alone_equals_its_row_in_the_shared_batch():
    """Left padding of the shorter prompts and right padding of the shorter completions change nothing."""
    pol = _policy()
    rollouts = _rollouts(pol.tokenizer)
    batch_lp, _, batch = _logps_and_grads(pol, rollouts, True)
    for i, r in enumerate(rollouts):
        alone, _, _ = _logps_and_grads(pol, [r], True)
        n = len(r.completion_ids)
        assert torch.allclose(alone[0, :n], batch_lp[i, :n], atol=1e-4)


def test_answer_logprobs_are_the_summed_token_logprobs_of_each_answer():
    from evotrainer.policy.answer_logprob import answer_logprobs
    from evotrainer.policy.grpo import per_token_logps
    from evotrainer.policy.rollout_engine import chat_ids

    pol = _policy()
    tok = pol.tokenizer
    prompts = [[{"role": "user", "content": q}] for q in ("What is 2 + 2?", "What is 30 + 12?", "What is 2 + 2?")]
    answers = ["Answer: 4", "Answer: 42", "Answer: 5"]
    got = answer_logprobs(pol, "b0", prompts, answers, batch_size=2)
    for p, a, g in zip(chat_ids(tok, prompts), answers, got):
        c = tok(a, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        ids = torch.tensor([p + c])
        with torch.no_grad(), pol.adapter("b0") as m:
            want = float(per_token_logps(m, ids, torch.ones_like(ids), len(c)).sum())
        assert abs(g - want) < 1e-3
    assert got[0] != got[2]            # the answer matters, not only the prompt


def test_reference_completions_pass_their_verifier():
    from evotrainer.domains import get_domain

    for name, kw in (("math", dict(difficulty=[1, 2, 3])), ("code", dict(difficulty=2))):
        d = get_domain(name, n_train=6, n_heldout=4, n_test=4, **kw)
        tasks = d.tasks("test")
        verdicts = d.verify_batch(tasks, [d.reference_completion(t) for t in tasks])
        assert all(v["correct"] for v in verdicts), name


def _saved_bytes(fn):
    """(result, bytes of the tensors autograd keeps for the backward pass while ``fn`` runs)."""
    kept = []

    def pack(t):
        kept.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(kept)


def test_past_the_logits_budget_the_head_runs_in_chunks_with_the_same_logps_and_gradients(monkeypatch):
    """A 151k-vocabulary model's logits over a batch's completions do not fit in memory at once: past
    LOGITS_BUDGET the head runs a few positions at a time, recomputed in the backward pass. Same
    log-probs and LoRA gradients on both trainer paths, and far less kept for the backward pass."""
    import evotrainer.policy.logps as logps_module

    pol = _policy()
    rollouts = _rollouts(pol.tokenizer)
    vocab = pol.base_model.config.vocab_size
    for shared in (True, False):
        for top_p in (1.0, 0.9):
            (lp, grads, batch), kept = _saved_bytes(lambda: _logps_and_grads(pol, rollouts, shared, top_p=top_p))
            monkeypatch.setattr(logps_module, "LOGITS_BUDGET", 5 * vocab)   # 5 positions at a time
            (lp_c, grads_c, _), kept_c = _saved_bytes(lambda: _logps_and_grads(pol, rollouts, shared, top_p=top_p))
            monkeypatch.undo()
            mask = batch["completion_mask"]
            assert float(((lp - lp_c).abs() * mask).max()) < 1e-5
            for a, b in zip(grads, grads_c):
                assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
            logits_bytes = mask.numel() * vocab * 4
            assert kept - kept_c > logits_bytes // 2, (kept, kept_c, logits_bytes)


def test_gradient_checkpointing_keeps_less_for_the_backward_pass_with_the_same_gradients(monkeypatch):
    """train.gradient_checkpointing: each decoder layer's activations are recomputed in the backward
    pass; the same log-probs and LoRA gradients, every row run whole (no KV cache to share). The head
    runs chunked in both runs, so what is kept is the decoder's."""
    import evotrainer.policy.logps as logps_module

    monkeypatch.setattr(logps_module, "LOGITS_BUDGET", 5 * 49152)
    out = {}
    for checkpointing in (False, True):
        model, tok = load_base_model("tiny-random", seed=0, initializer_range=0.2)
        pol = Policy(model, tok, LoraSettings(r=4, lora_alpha=8), gradient_checkpointing=checkpointing)
        pol.create("b0")
        with torch.no_grad():
            torch.manual_seed(1)
            for p in pol.parameters("b0"):
                p.add_(torch.randn_like(p) * 0.1)
        rollouts = _rollouts(tok)
        tr = GRPOTrainer(pol, "b0", GRPOConfig(temperature=0.7, num_generations=3))
        batch = tr._batch(rollouts)
        with pol.adapter("b0") as m:
            m.train()   # checkpointing acts in training mode, as in GRPOTrainer.step
            lp, kept = _saved_bytes(lambda: tr._logps(m, batch))
            (lp * batch["completion_mask"]).sum().backward()
            m.eval()
        out[checkpointing] = (lp.detach(), [p.grad.clone() for p in tr.params], kept, tr.shared_prompts)
    (lp, grads, kept, shared), (lp_c, grads_c, kept_c, shared_c) = out[False], out[True]
    assert shared and not shared_c
    assert float((lp - lp_c).abs().max()) < 1e-4
    for a, b in zip(grads, grads_c):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-3)
    assert kept_c < kept / 2, (kept, kept_c)


def test_the_shared_prompt_pass_is_the_default_on_a_cpu_only():
    from evotrainer.policy.grpo import shares_prompts_by_default

    assert shares_prompts_by_default(torch.device("cpu")) and shares_prompts_by_default("cpu")
    # on an H200 it made the GRPO step about twice as slow (benchmarks/results/step_speed_h200*.json)
    assert not shares_prompts_by_default(torch.device("cuda")) and not shares_prompts_by_default("cuda:1")
    model, tok = load_base_model("tiny-random", seed=0)
    pol = Policy(model, tok, LoraSettings(r=4, lora_alpha=8))
    pol.create("b0")
    assert GRPOTrainer(pol, "b0", GRPOConfig(num_generations=2)).shared_prompts             # a CPU policy
    assert not GRPOTrainer(pol, "b0", GRPOConfig(num_generations=2), shared_prompts=False).shared_prompts
