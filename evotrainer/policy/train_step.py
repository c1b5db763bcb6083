"""One GRPO step of a branch under a harness, and the recipe a harness's knobs make.

Per step: rollouts (verified; visible outcome only) → harness reward → harness group filter →
harness advantages → one GRPO update of the branch's LoRA adapter (with ``guided_imitation``, plus
behaviour cloning on guided episodes' accepted calls, which trains even when every group is dead). The harness is anything with
the hooks of :class:`HarnessHooks` (the sandboxed :class:`~evotrainer.genome.harness.Harness` in
practice): the trainer calls hooks, it never imports the genome layer above it.
"""

from __future__ import annotations

import time
from typing import Any, Protocol, Sequence

from evotrainer.domains.base import Domain
from evotrainer.domains.task import Task
from evotrainer.policy.collect import PromptFn, collect_groups, default_prompt
from evotrainer.policy.grpo import GRPOConfig, GRPOTrainer
from evotrainer.policy.grpo_config import TRAINER_SETTINGS
from evotrainer.policy.imitation import to_imitate
from evotrainer.policy.lora import Policy
from evotrainer.policy.rollout_engine import RolloutEngine, SamplingParams
from evotrainer.records.rollout import Group, Rollout, group_rollouts


class HarnessHooks(Protocol):
    """What a training step needs of a harness (batch hooks, see the harness contract)."""

    knob_values: dict[str, Any]

    def reward(self, rollouts: list[Rollout], tasks: list[Task]) -> list[float]: ...
    def keep_groups(self, groups: list[Group]) -> list[bool]: ...
    def advantages(self, groups: list[Group], rewards: list[list[float]]) -> list[list[float]]: ...
    def metrics(self, rollouts: list[Rollout], groups: list[Group]) -> dict[str, float]: ...
    def select_tasks(self, pool: Sequence[Task], stats: dict[str, dict[str, int]], step: int, n: int) -> list[str]: ...
    def prompt(self, task: Task) -> list[dict[str, str]]: ...
    def uses_reference(self, hook: str) -> bool: ...


GRPO_KNOBS = TRAINER_SETTINGS
STEP_COLUMNS = ("reward_mean", "reward_std", "dead_group_ratio", "response_length_p50", "truncation_rate",
                "clip_ratio", "kl", "grad_norm")


def grpo_config(harness: HarnessHooks, overrides: dict[str, Any]) -> GRPOConfig:
    """The recipe: GRPOConfig defaults ← the harness's knobs ← config overrides of non-knob settings.

    Knob overrides are not applied here: ``seed_program`` writes them into the seed genome, so a
    child whose operator changed a knob really trains with its own value. Knobs that are not trainer
    settings are read by the harness's hooks (the contract check refuses a knob nothing reads), and
    ``seed_program`` refuses an override that neither the trainer nor the harness reads.
    """
    values = {k: v for k, v in harness.knob_values.items() if k in GRPO_KNOBS}
    own = harness.program.knobs  # a genome without KNOBS falls back to the reference's: overridable here
    values.update({k: v for k, v in overrides.items() if v is not None and k not in own and k in GRPO_KNOBS})
    return GRPOConfig(**values)


def step_params(cfg: GRPOConfig, seed: int, step: int) -> SamplingParams:
    """How a training step samples: the recipe's temperature, nucleus and length, seeded per step."""
    return SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_completion_length,
                          seed=seed * 100_003 + step, guided_call_share=cfg.guided_call_share,
                          guided_plan_share=cfg.guided_plan_share, guided_edit=cfg.guided_edit)


def train_step(policy: Policy, engine: RolloutEngine, trainer: GRPOTrainer, harness: HarnessHooks,
               domain: Domain, tasks: Sequence[Task], branch: str, step: int, seed: int,
               prompt: PromptFn = default_prompt,
               sampled: tuple[list[Rollout], float] | None = None) -> tuple[list[Rollout], dict[str, float]]:
    """One step: rollouts → harness reward/filter/advantages → GRPO update. Returns (rollouts, metrics).

    ``sampled``: this step's rollouts and their generation seconds, already collected by the caller
    (several branches' in one engine call, ``collect.collect_many``, asked with :func:`step_params`);
    the caller has then run the adapter-applied check."""
    cfg = trainer.cfg
    t0 = time.perf_counter()
    if sampled is None:
        if step > 0:  # rollouts only count if they really came from this branch's adapter
            policy.check_adapter_applied(branch)
        rollouts = collect_groups(engine, domain, tasks, cfg.num_generations, step_params(cfg, seed, step), branch,
                                  step=step, prompt=prompt)
        t_gen = time.perf_counter() - t0
    else:
        rollouts, t_gen = sampled
        t0 -= t_gen   # step_seconds counts this step's share of the shared sampling
    aligned = [t for t in tasks for _ in range(cfg.num_generations)]
    rewards = harness.reward(rollouts, aligned)
    for r, rew in zip(rollouts, rewards):
        r.reward = float(rew)
    groups = group_rollouts(rollouts)
    keep = harness.keep_groups(groups)
    kept = [g for g, k in zip(groups, keep) if k]
    advs = harness.advantages(kept, [[r.reward for r in g.rollouts] for g in kept]) if kept else []
    batch, batch_adv = [], []
    for g, adv in zip(kept, advs):
        for r, a in zip(g.rollouts, adv):
            r.advantage = float(a)
            batch.append(r)
            batch_adv.append(float(a))
    t1 = time.perf_counter()
    # Guided episodes' accepted calls (guided_imitation), of any group, kept or not, live or dead.
    imitate = to_imitate(rollouts) if cfg.guided_imitation else []
    # All-zero advantages leave no policy gradient, but a KL term (beta > 0) still pulls toward the base.
    if batch and (any(a != 0.0 for a in batch_adv) or cfg.beta != 0.0):
        stats = trainer.step(batch, batch_adv, imitate=imitate)
    elif imitate:  # no policy gradient, and calls to imitate
        stats = trainer.step([], [], imitate=imitate)
    else:  # nothing to learn from: every kept group is dead (or all were filtered)
        stats = {"loss": 0.0, "clip_ratio": 0.0, "kl": 0.0, "grad_norm": 0.0, "skipped": 1.0}
    t_train = time.perf_counter() - t1
    metrics = dict(harness.metrics(rollouts, groups))
    metrics.update({k: v for k, v in stats.items() if isinstance(v, (int, float))})
    metrics.update(step=step, kept_groups=len(kept), groups=len(groups), gen_seconds=t_gen, train_seconds=t_train,
                   step_seconds=time.perf_counter() - t0)
    return rollouts, metrics
