"""Our GRPO-family loss and its gradients equal TRL's on identical inputs, for every loss type, on one
micro-batch and accumulated over several (GRPOTrainer.step's micro-batching: tests/test_policy.py)."""

import copy

import pytest
import torch

from evotrainer.policy.base_model import load_base_model
from evotrainer.policy.grpo import GRPOConfig, grpo_loss, group_advantages, per_token_logps

trl = pytest.importorskip("trl", reason="trl is a dev dependency installed by `make test`")


def _trl_trainer(model, tok, tmp_path, **kw):
    from datasets import Dataset
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    args = TRLConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, per_device_train_batch_size=4,
                     num_generations=4, max_completion_length=6, logging_steps=1, bf16=False, **kw)
    data = Dataset.from_list([{"prompt": "hi"}] * 8)
    return TRLTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                      train_dataset=data, processing_class=tok)


def _inputs(tok, seed=0):
    g = torch.Generator().manual_seed(seed)
    B, P, T = 4, 5, 6
    prompt_ids = torch.randint(5, 1000, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[0, :2] = 0  # left padding
    prompt_ids[0, :2] = tok.pad_token_id
    completion_ids = torch.randint(5, 1000, (B, T), generator=g)
    completion_mask = torch.ones(B, T, dtype=torch.long)
    completion_mask[1, 4:] = 0  # right padding: a shorter completion
    completion_mask[3, 2:] = 0
    advantages = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), "group").flatten()
    return prompt_ids, prompt_mask, completion_ids, completion_mask, advantages


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_loss_and_gradients_match_trl(loss_type, beta, tmp_path):
    model, tok = load_base_model("tiny-random", seed=1)
    temperature = 0.7
    ours = copy.deepcopy(model)
    ref_model = copy.deepcopy(model)
    # TRL builds its own reference model from the checkpoint path when beta != 0.
    model.save_pretrained(tmp_path / "ckpt")
    model.config._name_or_path = str(tmp_path / "ckpt")
    trainer = _trl_trainer(model, tok, tmp_path, loss_type=loss_type, beta=beta, epsilon=0.2, epsilon_high=0.28,
                           temperature=temperature)
    trainer.current_gradient_accumulation_steps = 1
    prompt_ids, prompt_mask, completion_ids, completion_mask, advantages = _inputs(tok)
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    attn = torch.cat([prompt_mask, completion_mask], 1)
    T = completion_ids.size(1)

    with torch.no_grad():
        base = per_token_logps(ours, input_ids, attn, T, temperature)
        # Stored sampler logprobs off by up to ±0.4 nats, so both clip sides are exercised.
        old = base + (torch.rand(base.shape, generator=torch.Generator().manual_seed(3)) - 0.5) * 0.8
        ref = per_token_logps(ref_model, input_ids, attn, T, temperature) + 0.05
    n_items = completion_mask.sum()

    cfg = GRPOConfig(loss_type=loss_type, beta=beta, epsilon=0.2, epsilon_high=0.28, temperature=temperature,
                     max_completion_length=6)
    ours.train()
    logps = per_token_logps(ours, input_ids, attn, T, temperature)
    our_loss, _ = grpo_loss(logps, old, advantages, completion_mask, cfg, ref_logps=ref, num_items_in_batch=n_items)
    our_loss.backward()

    trainer.model.train()
    inputs = dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                  completion_mask=completion_mask, advantages=advantages, old_per_token_logps=old,
                  ref_per_token_logps=ref, num_items_in_batch=n_items)
    trl_loss = trainer.compute_loss(trainer.model, inputs)
    trl_loss.backward()

    assert torch.allclose(our_loss, trl_loss, atol=1e-5), (float(our_loss), float(trl_loss))
    trl_grads = dict(trainer.model.named_parameters())
    compared = 0
    for name, p in ours.named_parameters():
        q = trl_grads[name]
        assert p.grad is not None and q.grad is not None, name
        assert torch.allclose(p.grad, q.grad, atol=1e-5), (name, (p.grad - q.grad).abs().max())
        compared += 1
    assert compared > 5
    assert float(our_loss) != 0.0  # a zero loss would make the comparison vacuous


def test_group_advantages_match_trl_scalings():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.2, 0.4, 0.6, 0.8]])
    g = group_advantages(r, "group")
    assert torch.allclose(g[1], torch.zeros(4))  # a dead group carries no signal
    assert torch.allclose(g[0], (r[0] - 0.5) / (r[0].std() + 1e-4))
    b = group_advantages(r, "batch")
    assert torch.allclose(b[2], (r[2] - r[2].mean()) / (r.std() + 1e-4))
    assert torch.allclose(group_advantages(r, "none")[2], r[2] - 0.5)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_reference_harness_advantages_equal_the_trainers(scale):
    """The reference harness's advantages hook is the same estimator as the TRL-checked one."""
    from evotrainer.genome.harness import Harness
    from evotrainer.genome.program import reference_program

    rewards = [[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.2, 0.4, 0.6, 0.8]]
    groups = [[{"task_id": str(i), "completion": "", "visible": {}} for _ in rs] for i, rs in enumerate(rewards)]
    program = reference_program().with_knobs(scale_rewards=scale)
    with Harness(program, sandbox=False) as h:
        got = torch.tensor(h.advantages(groups, rewards))
    assert torch.allclose(got, group_advantages(torch.tensor(rewards), scale), atol=1e-6)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_gradients_accumulated_over_micro_batches_match_trl(loss_type, tmp_path):
    """Several micro-batches of one step (what GRPOTrainer.step does when the batch exceeds
    per_device_train_batch_size): each micro-batch's loss, normalised as TRL normalises it under
    gradient accumulation (1/accumulation steps; dapo: the whole step's token count), summed into one
    gradient. The single-micro-batch test above does not see that normalisation."""
    model, tok = load_base_model("tiny-random", seed=1)
    ours = copy.deepcopy(model)
    chunks = [slice(0, 2), slice(2, 4)]     # unequal token counts: rows 1 and 3 are shorter
    # One generation batch per optimiser step, split into len(chunks) accumulation windows (TRL's default
    # steps_per_generation = gradient_accumulation_steps), as GRPOTrainer.step splits its batch.
    trainer = _trl_trainer(model, tok, tmp_path, loss_type=loss_type, beta=0.0, epsilon=0.2, epsilon_high=0.28,
                           gradient_accumulation_steps=len(chunks))
    assert trainer.args.steps_per_generation == len(chunks)
    prompt_ids, prompt_mask, completion_ids, completion_mask, advantages = _inputs(tok)
    T = completion_ids.size(1)
    with torch.no_grad():
        full = per_token_logps(ours, torch.cat([prompt_ids, completion_ids], 1),
                               torch.cat([prompt_mask, completion_mask], 1), T)
        old = full + (torch.rand(full.shape, generator=torch.Generator().manual_seed(3)) - 0.5) * 0.8
    n_items = completion_mask.sum()
    cfg = GRPOConfig(loss_type=loss_type, epsilon=0.2, epsilon_high=0.28, max_completion_length=T)
    trainer.current_gradient_accumulation_steps = len(chunks)
    ours.train()
    trainer.model.train()
    for c in chunks:
        ids = torch.cat([prompt_ids[c], completion_ids[c]], 1)
        attn = torch.cat([prompt_mask[c], completion_mask[c]], 1)
        logps = per_token_logps(ours, ids, attn, T)
        loss, _ = grpo_loss(logps, old[c], advantages[c], completion_mask[c], cfg, num_items_in_batch=n_items,
                            num_micro_batches=len(chunks))
        loss.backward()
        inputs = dict(prompt_ids=prompt_ids[c], prompt_mask=prompt_mask[c], completion_ids=completion_ids[c],
                      completion_mask=completion_mask[c], advantages=advantages[c], old_per_token_logps=old[c],
                      num_items_in_batch=n_items)
        trl_loss = trainer.compute_loss(trainer.model, inputs)
        assert torch.allclose(loss, trl_loss, atol=1e-5), (float(loss.detach()), float(trl_loss.detach()))
        trl_loss.backward()
    trl_grads = dict(trainer.model.named_parameters())
    compared = 0
    for name, p in ours.named_parameters():
        q = trl_grads[name]
        assert torch.allclose(p.grad, q.grad, atol=1e-5), (name, (p.grad - q.grad).abs().max())
        compared += 1
    assert compared > 5
