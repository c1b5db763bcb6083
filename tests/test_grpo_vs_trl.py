"""Our GRPO-family loss and its gradients equal TRL's on identical inputs, for every loss type, on one
micro-batch and accumulated over several (GRPOTrainer.step's micro-batching: tests/test_policy.py);
and one whole optimisation step of our GRPOTrainer over two micro-batches (loss, gradient, grad norm,
AdamW update of the LoRA parameters) equals one step of TRL's GRPOTrainer.train() with gradient
accumulation, on the same data and the same LoRA init."""

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
    _compare_loss_and_gradients(loss_type, beta, tmp_path)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_dual_clip_delta_matches_trl(loss_type, tmp_path):
    """grpo.delta caps the importance ratio from above (two-sided clipping); the stored logprobs'
    ±0.4-nat noise puts ratios up to e^0.4 ≈ 1.49 past the cap of 1.2."""
    capped = _compare_loss_and_gradients(loss_type, 0.0, tmp_path / "capped", delta=1.2)
    plain = _compare_loss_and_gradients(loss_type, 0.0, tmp_path / "plain")
    assert capped != plain   # the cap binds on these inputs: the comparison is not vacuous


def _compare_loss_and_gradients(loss_type, beta, tmp_path, **extra):
    model, tok = load_base_model("tiny-random", seed=1)
    temperature = 0.7
    ours = copy.deepcopy(model)
    ref_model = copy.deepcopy(model)
    # TRL builds its own reference model from the checkpoint path when beta != 0.
    model.save_pretrained(tmp_path / "ckpt")
    model.config._name_or_path = str(tmp_path / "ckpt")
    trainer = _trl_trainer(model, tok, tmp_path, loss_type=loss_type, beta=beta, epsilon=0.2, epsilon_high=0.28,
                           temperature=temperature, **extra)
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
                     max_completion_length=6, **extra)
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
    return float(our_loss)


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


# ---- one whole optimisation step: GRPOTrainer.step against TRL's own training loop ------------------
ADAPTER = "default"   # TRL's adapter name; ours uses it too so parameter names line up


def _init_lora_identically(model) -> int:
    """LoRA A from a generator seeded by the parameter's name (so both sides agree), B small and nonzero
    (so the first step's gradient reaches A too); returns how many tensors were set."""
    import zlib

    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                key = name.replace(f".{ADAPTER}.", ".").replace("base_model.model.", "")
                g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
                scale = 1.0 / p.shape[1] ** 0.5 if "lora_A" in name else 0.02
                p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * scale)
                n += 1
    return n


def _lora_params(model) -> dict[str, torch.Tensor]:
    return {n.replace("base_model.model.", ""): p.detach().clone() for n, p in model.named_parameters()
            if "lora_" in n}


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_one_step_over_two_micro_batches_updates_lora_as_trls_trainer_does(loss_type, tmp_path, monkeypatch):
    """Same base model, same LoRA init, the same 4 rollouts (2 groups of 2) with the same stored sampler
    logprobs and advantages; ours: ``GRPOTrainer.step`` with ``per_device_train_batch_size=2`` (two
    micro-batches); TRL: ``GRPOTrainer.train()`` for one optimiser step with
    ``gradient_accumulation_steps=2``: its own data loop, loss scaling, gradient accumulation, grad-norm
    clipping, AdamW and scheduler, with generation replaced by the canned batch. The LoRA parameters
    after the step agree. TRL shuffles the generation batch before splitting it into micro-batches;
    that changes no gradient except bnpo's (a token mean per micro-batch), so for bnpo the shuffle is
    the identity."""
    from datasets import Dataset
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    import trl.trainer.grpo_trainer as trl_grpo
    from evotrainer.policy.grpo import GRPOTrainer
    from evotrainer.policy.lora import LoraSettings, Policy
    from evotrainer.records.rollout import Rollout

    lr, clip, T = 5e-2, 1.0, 6
    model, tok = load_base_model("tiny-random", seed=1)
    trl_model = copy.deepcopy(model)

    # The batch: equal-length prompts (no left padding, so positions agree however rows are grouped),
    # completions of unequal length (right padding), sampler logprobs off the policy by up to ±0.4 nats.
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(5, 1000, (4, 5), generator=g)
    completion_ids = torch.randint(5, 1000, (4, T), generator=g)
    lengths = [6, 3, 6, 4]
    completion_mask = torch.tensor([[1] * n + [0] * (T - n) for n in lengths])
    completion_ids = completion_ids * completion_mask + tok.pad_token_id * (1 - completion_mask)
    advantages = group_advantages(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), "group").flatten()
    with torch.no_grad():
        base = per_token_logps(model, torch.cat([prompt_ids, completion_ids], 1),
                               torch.cat([torch.ones_like(prompt_ids), completion_mask], 1), T)
        old = (base + (torch.rand(base.shape, generator=torch.Generator().manual_seed(3)) - 0.5) * 0.8) * completion_mask

    rollouts = [Rollout(task_id=f"g{i // 2}", messages=[], completion="", prompt_ids=prompt_ids[i].tolist(),
                        completion_ids=completion_ids[i, :n].tolist(), logprobs=old[i, :n].tolist(), group=i // 2)
                for i, n in enumerate(lengths)]

    # Ours.
    policy = Policy(model, tok, LoraSettings())
    policy.create(ADAPTER)
    assert _init_lora_identically(policy.model) > 5
    start = _lora_params(policy.model)
    cfg = GRPOConfig(learning_rate=lr, num_generations=2, max_completion_length=T, loss_type=loss_type,
                     epsilon=0.2, epsilon_high=0.28, per_device_train_batch_size=2, max_grad_norm=clip)
    ours_trainer = GRPOTrainer(policy, ADAPTER, cfg)
    grads: dict[str, dict[str, torch.Tensor]] = {}

    def grads_of(side, m):
        def hook(*_):   # the accumulated, clipped gradient the optimiser is about to apply
            grads[side] = {n.replace("base_model.model.", ""): p.grad.detach().clone()
                           for n, p in m.named_parameters() if "lora_" in n}
        return hook

    ours_trainer.optimizer.register_step_pre_hook(grads_of("ours", policy.model))
    ours_stats = ours_trainer.step(rollouts, advantages.tolist())
    ours = _lora_params(policy.model)

    # TRL.
    args = TRLConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False, fp16=False,
                     per_device_train_batch_size=2, gradient_accumulation_steps=2, num_generations=2,
                     max_completion_length=T, temperature=1.0, beta=0.0, epsilon=0.2, epsilon_high=0.28,
                     loss_type=loss_type, learning_rate=lr, weight_decay=0.0, max_grad_norm=clip, optim="adamw_torch",
                     lr_scheduler_type="constant", warmup_steps=0, max_steps=1, gradient_checkpointing=False,
                     logging_steps=1, save_strategy="no", seed=0)
    trainer = TRLTrainer(model=trl_model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                         train_dataset=Dataset.from_list([{"prompt": "hi"}] * 4), processing_class=tok,
                         peft_config=LoraSettings().peft_config())
    _init_lora_identically(trainer.model)
    assert _lora_params(trainer.model).keys() == start.keys()
    assert all(torch.equal(_lora_params(trainer.model)[k], start[k]) for k in start)
    canned = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
              "completion_mask": completion_mask, "advantages": advantages.float(), "old_per_token_logps": old,
              "num_items_in_batch": completion_mask.sum()}
    generated = []

    def generate_and_score(batch):
        generated.append(len(batch))
        return {k: v.clone() for k, v in canned.items()}

    monkeypatch.setattr(trainer, "_generate_and_score_completions", generate_and_score)
    if loss_type == "bnpo":
        monkeypatch.setattr(trl_grpo, "shuffle_sequence_dict", lambda d: d)
    from transformers import TrainerCallback

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kw):
            grads_of("trl", trainer.model)()

    trainer.add_callback(Grads())
    result = trainer.train()
    assert trainer.state.global_step == 1 and generated == [4]   # one generation batch, two micro-batches
    theirs = _lora_params(trainer.model)

    logged = next(h for h in trainer.state.log_history if "grad_norm" in h)
    # The objective and its gradient agree tightly: the step's loss and its pre-clip gradient norm.
    assert ours_stats["loss"] == pytest.approx(result.training_loss, abs=1e-5)
    assert ours_stats["grad_norm"] == pytest.approx(logged["grad_norm"], rel=1e-4)
    for k in start:   # the accumulated, clipped gradient of the step: equal to float precision
        assert torch.allclose(grads["ours"][k], grads["trl"][k], atol=1e-7, rtol=1e-4), (
            k, (grads["ours"][k] - grads["trl"][k]).abs().max())
    # Then AdamW's update agrees wherever the gradient is well above Adam's eps (1e-8): its first step
    # is lr * g / (|g| + eps), which turns float-level gradient differences in entries near eps (the
    # accumulation order, which TRL's shuffle changes) into visible ones there, and only there.
    moved, compared, total = 0, 0, 0
    for k in start:
        step_ours, step_theirs = ours[k] - start[k], theirs[k] - start[k]
        clear = grads["ours"][k].abs() > 1e-5
        assert torch.allclose(step_ours[clear], step_theirs[clear], atol=1e-6), (
            k, (step_ours - step_theirs)[clear].abs().max())
        compared, total = compared + int(clear.sum()), total + clear.numel()
        moved += bool(step_ours.abs().max() > 0.5 * lr)
    assert compared > 0.8 * total, (compared, total)   # 89% or more of the entries on this batch
    assert moved == len(start)   # every LoRA tensor took a full-size step: the comparison is not vacuous
