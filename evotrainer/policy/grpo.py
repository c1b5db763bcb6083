"""GRPO-family trainer for LoRA branches, readable top to bottom (CleanRL style).

Names follow TRL's ``GRPOConfig`` so users can carry settings across: ``num_generations``,
``beta`` (KL coefficient), ``epsilon`` / ``epsilon_high`` (clip-higher, DAPO), ``delta`` (dual
clip), ``loss_type`` (grpo, bnpo, dr_grpo, dapo), ``mask_truncated_completions``. The loss matches
TRL's on identical inputs (tests/test_grpo_vs_trl.py). Advantages (and TRL's ``scale_rewards``) come
from the harness's ``advantages`` hook, not from this module.

The importance ratio is taken against the *sampler's* stored logprobs (``Rollout.logprobs``), so a
rollout engine whose numerics differ from training (vLLM, bf16 sampling) is corrected for, and
several optimisation passes over one batch stay on-policy-correct.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from evotrainer.policy.grpo_config import LOSS_TYPES, GRPOConfig
from evotrainer.policy.guided_decoding import LOGPROB_FLOOR
from evotrainer.policy.imitation import imitation_mask
from evotrainer.policy.logps import per_token_logps, shared_prompt_logps
from evotrainer.records.rollout import Rollout

__all__ = ["GRPOConfig", "GRPOTrainer", "LOSS_TYPES", "group_advantages", "grpo_loss", "per_token_logps"]


# ---- advantages: a reference, not used in training -------------------------------------------
def group_advantages(rewards: torch.Tensor, scale_rewards: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """TRL's GRPO advantage formula in torch, for rewards of shape (num_groups, num_generations).

    Training never calls it: a step's advantages come from the harness's ``advantages`` hook. It is
    the yardstick the TRL-parity tests hold the reference hook to (tests/test_grpo_vs_trl.py) and a
    quick source of advantages for benchmarks that drive ``GRPOTrainer.step`` directly.

    A_i = (r_i - mean(group)) / (std + eps), std from the group (``"group"``), the whole batch
    (``"batch"``), or no scaling (``"none"``, Dr. GRPO). std is the sample std, as in TRL.
    """
    mean = rewards.mean(dim=1, keepdim=True)
    centred = rewards - mean
    if scale_rewards == "none":
        return centred
    std = rewards.std(dim=1, keepdim=True) if scale_rewards == "group" else rewards.std().expand_as(mean)
    return centred / (std + eps)


# ---- the loss ---------------------------------------------------------------------------------
def grpo_loss(
    logps: torch.Tensor,            # (B, T) current policy
    old_logps: torch.Tensor,        # (B, T) sampler logprobs
    advantages: torch.Tensor,       # (B,)
    mask: torch.Tensor,             # (B, T) 1 on completion tokens that count
    cfg: GRPOConfig,
    ref_logps: torch.Tensor | None = None,
    num_items_in_batch: float | None = None,  # completion tokens in the whole step (dapo)
    num_micro_batches: int = 1,
    max_tokens: int | None = None,  # dr_grpo's constant: the most tokens a sequence may sample
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate loss of the GRPO family; returns (loss, stats)."""
    A = advantages.unsqueeze(1)
    ratio = torch.exp(logps - old_logps)
    kl = None
    if cfg.beta != 0.0:
        # k3 estimator of KL(π || π_ref): exp(ref - logp) - (ref - logp) - 1  (Schulman 2020);
        # samples come from the sampler, so reweight by the ratio for an unbiased estimate.
        kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
        if cfg.use_bias_correction_kl:
            kl = kl * ratio
    clipped = torch.clamp(ratio, 1 - cfg.epsilon, 1 + cfg.epsilon_high)
    if cfg.delta is not None:
        ratio = torch.clamp(ratio, max=cfg.delta)
    per_token = -torch.min(ratio * A, clipped * A)
    if kl is not None:
        per_token = per_token + cfg.beta * kl

    mask = mask.to(per_token.dtype)
    if cfg.loss_type == "grpo":        # mean over each sequence's tokens, then over sequences
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / num_micro_batches
    elif cfg.loss_type == "bnpo":      # mean over the micro-batch's tokens
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0) / num_micro_batches
    elif cfg.loss_type == "dr_grpo":   # constant normaliser: no length bias (Dr. GRPO)
        budget = max_tokens or cfg.max_completion_length
        loss = (per_token * mask).sum() / (per_token.size(0) * budget) / num_micro_batches
    else:                              # dapo: token mean over the whole step
        total = num_items_in_batch if num_items_in_batch is not None else mask.sum()
        loss = (per_token * mask).sum() / max(float(total), 1.0)

    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        low = ((ratio < 1 - cfg.epsilon) & (A < 0)).float()
        high = ((ratio > 1 + cfg.epsilon_high) & (A > 0)).float()
        stats = {
            "clip_ratio/low": float((low * mask).sum() / n),
            "clip_ratio/high": float((high * mask).sum() / n),
            "kl": float((kl * mask).sum() / n) if kl is not None else 0.0,
        }
    return loss, stats


def imitation_loss(logps: torch.Tensor, mask: torch.Tensor, num_imitated: float) -> torch.Tensor:
    """Behaviour cloning on the imitated tokens (``guided_imitation`` weighs it): their mean negative
    log-likelihood over the whole step (``num_imitated`` tokens), summed over its micro-batches."""
    return -(logps * mask).sum() / max(num_imitated, 1.0)


# ---- the trainer ------------------------------------------------------------------------------
def shares_prompts_by_default(device: torch.device | str) -> bool:
    """Whether a GRPO step runs each distinct prompt once (the shared-prompt pass) unless told: on a
    CPU, yes (fewer FLOPs is less time there); on a GPU, no. On an H200 the shared-prompt pass made
    the GRPO step about twice as slow as running every row whole, at 16 and at 64 rollouts of short
    prompts (``benchmarks/step_speed.py``): its extra passes cost more launches than the prompt
    FLOPs they save on a device that is not compute-bound at these sizes."""
    return torch.device(device).type == "cpu"


# Rows x T^2 a micro-batch may hold on the CPU, T a row's prompt and completion tokens: attention there
# keeps a (heads, T, T) score matrix per row and layer for the backward pass. 2^21 leaves the defaults
# as they were (16 rows up to T = 362: code-2's prompts reach 218 tokens before a 128-token completion),
# while a 512-token code completion (T = 730), which took a suite process past 19 GB and the
# out-of-memory killer, trains 2 rows at a time. Not applied on a GPU, whose fused attention kernels
# keep no such matrix (nor measured there).
ATTENTION_BUDGET = 2**21


def micro_batch_rows(n: int, longest: int, cap: int, budget: int | None = None) -> int:
    """Rows per micro-batch for ``n`` rows whose longest is ``longest`` tokens: at most ``cap``
    (``per_device_train_batch_size``), fewer where ``cap`` rows would pass ``budget`` (rows x T^2); a
    divisor of ``n`` where one is at least half that limit, so the micro-batches are equal and the
    losses that average micro-batch means ('grpo', 'dr_grpo') equal the whole batch's ('dapo' does at
    any split)."""
    limit = max(1, min(cap, n, budget // max(1, longest) ** 2 if budget is not None else cap))
    even = max(d for d in range(1, limit + 1) if n % d == 0)
    return even if 2 * even >= limit else limit


class GRPOTrainer:
    """Optimises one LoRA branch of a :class:`~evotrainer.policy.lora.Policy` on scored rollouts.

    ``step(rollouts, advantages)`` does ``num_iterations`` passes of micro-batched forward/backward
    over the batch, accumulating gradients, then one clipped AdamW step on the branch's LoRA
    parameters only. Rewards and advantages come from the harness, not from here. With
    ``guided_imitation`` above 0, the imitated tokens of ``rollouts`` and of ``imitate`` (guided
    episodes whose groups carried no advantage) add :func:`imitation_loss`.
    """

    def __init__(self, policy, branch: str, cfg: GRPOConfig, max_tokens: int | None = None,
                 shared_prompts: bool | None = None) -> None:
        # max_tokens: the most tokens one sequence may sample (dr_grpo's constant normaliser):
        # max_completion_length for a single turn, the whole episode's budget for a multi-turn one.
        # shared_prompts: each distinct prompt of a micro-batch runs once (policy/logps.py); False runs
        # every row whole, as TRL does (the same numbers up to float summation order, more FLOPs).
        # None: by device (shares_prompts_by_default).
        self.policy, self.branch, self.cfg = policy, branch, cfg
        if shared_prompts is None:
            shared_prompts = shares_prompts_by_default(policy.device)
        # Under gradient checkpointing a training forward keeps no KV cache, which the shared prompt
        # pass continues from: every row runs whole then.
        self.shared_prompts = shared_prompts and not getattr(policy.base_model, "is_gradient_checkpointing", False)
        self.max_tokens = max_tokens or cfg.max_completion_length
        self.params = policy.parameters(branch)
        if not self.params:
            raise ValueError(f"branch {branch!r} has no trainable LoRA parameters")
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        self.pad_id = policy.tokenizer.pad_token_id

    def set_learning_rate(self, lr: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def optimizer_state(self) -> dict:
        """The AdamW moments and step counts by parameter position (what a child may inherit)."""
        return self.optimizer.state_dict()["state"]

    def load_optimizer_state(self, state: dict) -> None:
        """Continue from a parent's AdamW moments, as population-based training does. The
        hyper-parameters (lr, betas, weight decay) stay this trainer's: a child may have changed them."""
        for i, st in state.items():
            i = int(i)
            if i >= len(self.params) or st["exp_avg"].shape != self.params[i].shape:
                raise ValueError(f"optimizer state does not fit branch {self.branch!r} (parameter {i}): "
                                 "the parent had another LoRA shape; start this version with a fresh optimizer")
        sd = self.optimizer.state_dict()
        sd["state"] = {int(i): st for i, st in state.items()}
        self.optimizer.load_state_dict(sd)

    def _batch(self, rollouts: Sequence[Rollout]) -> dict[str, torch.Tensor]:
        """Each distinct prompt once (left-padded) with the row of each rollout's prompt, and the
        completions right-padded. ``completion_mask`` is 1 on the tokens the policy sampled (all of a
        single-turn completion; an episode's assistant turns); ``completion_attention`` on every real one."""
        dev = self.policy.device
        distinct: dict[tuple[int, ...], int] = {}
        rows = [distinct.setdefault(tuple(r.prompt_ids), len(distinct)) for r in rollouts]
        P = max(len(p) for p in distinct)
        T = max(max(len(r.completion_ids) for r in rollouts), 1)
        comp, cattn, cmask, old, imask = [], [], [], [], []
        for r in rollouts:
            c = list(r.completion_ids)
            sampled = r.sampled_mask()   # an episode's tool results and turn headers are 0: no loss there
            comp.append(c + [self.pad_id] * (T - len(c)))
            cattn.append([1] * len(c) + [0] * (T - len(c)))
            keep = 0 if (self.cfg.mask_truncated_completions and r.truncated) else 1
            cmask.append([keep * m for m in sampled] + [0] * (T - len(c)))
            lps = iter(r.logprobs)   # the sampler's logprobs, of the sampled tokens, in order
            old.append([next(lps) if m else 0.0 for m in sampled] + [0.0] * (T - len(c)))
            # A guided token outside the sampler's nucleus (top_p < 1) has the floor log-probability,
            # no gradient to its own logit: nothing to imitate there.
            imitate = imitation_mask(r) if self.cfg.guided_imitation else [0] * len(c)
            imask.append([int(m and lp > LOGPROB_FLOOR / 2) for m, lp in zip(imitate, old[-1])] + [0] * (T - len(c)))
        t = lambda x, dtype=torch.long: torch.tensor(x, device=dev, dtype=dtype)   # noqa: E731
        return {
            "prompt_ids": t([[self.pad_id] * (P - len(p)) + list(p) for p in distinct]),
            "prompt_mask": t([[0] * (P - len(p)) + [1] * len(p) for p in distinct]),
            "rows": t(rows), "completion_ids": t(comp), "completion_attention": t(cattn),
            "completion_mask": t(cmask, torch.float32), "old_logps": t(old, torch.float32), "T": T,
            "imitation_mask": t(imask, torch.float32),
        }

    def _logps(self, model, b: dict) -> torch.Tensor:
        cfg = self.cfg
        if self.shared_prompts:
            return shared_prompt_logps(model, b["prompt_ids"], b["prompt_mask"], b["rows"], b["completion_ids"],
                                       b["completion_attention"], cfg.temperature, cfg.top_p)
        ids = torch.cat([b["prompt_ids"].index_select(0, b["rows"]), b["completion_ids"]], 1)
        attention = torch.cat([b["prompt_mask"].index_select(0, b["rows"]), b["completion_attention"]], 1)
        return per_token_logps(model, ids, attention, b["T"], cfg.temperature, cfg.top_p)

    def step(self, rollouts: Sequence[Rollout], advantages: Sequence[float],
             imitate: Sequence[Rollout] = ()) -> dict[str, float]:
        if len(rollouts) != len(advantages):
            raise ValueError(f"{len(rollouts)} rollouts but {len(advantages)} advantages")
        cfg = self.cfg
        own = {id(r) for r in rollouts}
        extra = [r for r in imitate if id(r) not in own] if cfg.guided_imitation else []
        if not rollouts and not extra:
            raise ValueError("nothing to train on: no rollouts and nothing to imitate")
        longest = max(len(r.prompt_ids) + len(r.completion_ids) for r in [*rollouts, *extra])
        cap = max(1, cfg.per_device_train_batch_size)
        budget = ATTENTION_BUDGET if self.policy.device.type == "cpu" else None
        mb = micro_batch_rows(len(rollouts), longest, cap, budget) if rollouts else cap
        chunks = [list(range(i, min(i + mb, len(rollouts)))) for i in range(0, len(rollouts), mb)]
        batches = [self._batch([rollouts[i] for i in c]) for c in chunks]
        advs = [torch.tensor([advantages[i] for i in c], device=self.policy.device, dtype=torch.float32)
                for c in chunks]
        mb_extra = micro_batch_rows(len(extra), longest, cap, budget) if extra else cap
        clone_only = [self._batch(extra[i:i + mb_extra]) for i in range(0, len(extra), mb_extra)]
        total_tokens = float(sum(b["completion_mask"].sum() for b in batches))
        imitated = float(sum(b["imitation_mask"].sum() for b in batches + clone_only))
        stats: dict[str, float] = {"loss": 0.0, "clip_ratio/low": 0.0, "clip_ratio/high": 0.0, "kl": 0.0}
        if cfg.guided_imitation:
            stats.update(imitation_nll=0.0, imitated_tokens=imitated)
        model = self.policy.model
        model.train()
        with self.policy.adapter(self.branch):
            for _ in range(cfg.num_iterations):
                self.optimizer.zero_grad(set_to_none=True)
                for batch, adv in zip(batches, advs):
                    ref = None
                    if cfg.beta != 0.0:
                        with torch.no_grad(), self.policy.adapter(None) as base:
                            ref = self._logps(base, batch)
                        self.policy.model.set_adapter(self.branch)
                    logps = self._logps(model, batch)
                    loss, s = grpo_loss(logps, batch["old_logps"], adv, batch["completion_mask"], cfg, ref,
                                        num_items_in_batch=total_tokens, num_micro_batches=len(batches),
                                        max_tokens=self.max_tokens)
                    loss = loss + self._imitate(logps, batch, imitated, stats)
                    loss.backward()
                    stats["loss"] += float(loss.detach()) / cfg.num_iterations
                    for k in ("clip_ratio/low", "clip_ratio/high", "kl"):
                        stats[k] += s[k] / (len(batches) * cfg.num_iterations)
                for batch in clone_only:   # guided episodes of groups without advantage: imitation only
                    loss = self._imitate(self._logps(model, batch), batch, imitated, stats)
                    loss.backward()
                    stats["loss"] += float(loss.detach()) / cfg.num_iterations
                grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
                self.optimizer.step()
        model.eval()
        stats["grad_norm"] = float(grad_norm) if math.isfinite(float(grad_norm)) else float("nan")
        stats["clip_ratio"] = stats["clip_ratio/low"] + stats["clip_ratio/high"]
        return stats

    def _imitate(self, logps: torch.Tensor, batch: dict, imitated: float, stats: dict[str, float]) -> torch.Tensor:
        """The micro-batch's share of the step's imitation loss (0 when nothing is imitated), and its
        share of ``imitation_nll``, the imitated tokens' mean negative log-likelihood over the passes."""
        if not imitated:
            return torch.zeros((), device=logps.device)
        nll = imitation_loss(logps, batch["imitation_mask"], imitated)
        stats["imitation_nll"] += float(nll.detach()) / self.cfg.num_iterations
        return self.cfg.guided_imitation * nll
