"""Training one branch under a harness: the reference trainer behind ``evotrainer train``.

Per step: sample tasks → rollouts (verified; visible outcome only) → harness reward →
harness group filter → harness advantages → one GRPO update of the branch's LoRA adapter.
Held-out accuracy is measured by the engine before and after, with data the harness never sees.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from evotrainer.branch import BranchVersion, VersionDir
from evotrainer.collect import accuracy, collect_groups, sample_tasks, verify
from evotrainer.config import Config
from evotrainer.domains import get_domain
from evotrainer.genome.harness import Harness
from evotrainer.genome.program import HarnessProgram, reference_program
from evotrainer.policy.base_model import load_base_model
from evotrainer.policy.grpo import GRPOConfig, GRPOTrainer
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.policy.rollout_engine import SamplingParams, TransformersEngine
from evotrainer.rollout import Rollout, group_rollouts

GRPO_KNOBS = set(GRPOConfig.__dataclass_fields__)
STEP_COLUMNS = ("reward_mean", "reward_std", "dead_group_ratio", "response_length_p50", "truncation_rate",
                "clip_ratio", "kl", "grad_norm")


@dataclass
class TrainResult:
    version_dir: Path
    heldout_before: float
    heldout_after: float
    steps: list[dict[str, Any]]


def grpo_config(harness: Harness, overrides: dict[str, Any]) -> GRPOConfig:
    """The recipe: GRPOConfig defaults ← the harness's knobs ← config overrides of non-knob settings.

    Knob overrides are not applied here: ``seed_program`` writes them into the seed genome, so a
    child whose operator changed a knob really trains with its own value.
    """
    values = {k: v for k, v in harness.knob_values.items() if k in GRPO_KNOBS}
    own = harness.program.knobs  # a genome without KNOBS falls back to the reference's: overridable here
    values.update({k: v for k, v in overrides.items() if v is not None and k not in own})
    return GRPOConfig(**values)


def seed_program(cfg: Config) -> HarnessProgram:
    """The harness a run starts from, with the config's ``grpo`` knob overrides written into KNOBS."""
    from evotrainer.config import ConfigError
    from evotrainer.genome.errors import ContractError

    program = load_program(cfg.harness)
    values = {k: v for k, v in cfg.grpo.model_dump().items() if v is not None and k in program.knobs}
    try:
        return program.with_knobs(**values) if values else program
    except ContractError as e:
        raise ConfigError(f"grpo override outside the harness's declared knob space: {e}; "
                          "choose an allowed value or widen the knob in the harness's KNOBS") from None


def build_domain(cfg: Config):
    d = cfg.domain
    return get_domain(d.name, n_train=d.n_train, n_heldout=d.n_heldout, n_test=d.n_test, difficulty=d.difficulty,
                      seed=d.seed, leak_share=d.leak_share, files=d.files)


def load_program(path: str | None) -> HarnessProgram:
    return HarnessProgram.from_file(path) if path else reference_program()


def train_step(policy: Policy, engine: TransformersEngine, trainer: GRPOTrainer, harness: Harness, domain,
               tasks, branch: str, step: int, seed: int) -> tuple[list[Rollout], dict[str, float]]:
    """One step: rollouts → harness reward/filter/advantages → GRPO update. Returns (rollouts, metrics)."""
    cfg = trainer.cfg
    t0 = time.perf_counter()
    if step > 0:  # rollouts only count if they really came from this branch's adapter
        policy.check_adapter_applied(branch)
    params = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_completion_length,
                            seed=seed * 100_003 + step)
    rollouts = collect_groups(engine, domain, tasks, cfg.num_generations, params, branch, step=step)
    t_gen = time.perf_counter() - t0
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
    if batch and any(a != 0.0 for a in batch_adv):
        stats = trainer.step(batch, batch_adv)
    else:  # nothing to learn from: every kept group is dead (or all were filtered)
        stats = {"loss": 0.0, "clip_ratio": 0.0, "kl": 0.0, "grad_norm": 0.0, "skipped": 1.0}
    t_train = time.perf_counter() - t1
    metrics = dict(harness.metrics(rollouts, groups))
    metrics.update({k: v for k, v in stats.items() if isinstance(v, (int, float))})
    metrics.update(step=step, kept_groups=len(kept), groups=len(groups), gen_seconds=t_gen, train_seconds=t_train,
                   step_seconds=time.perf_counter() - t0)
    return rollouts, metrics


def train_branch(cfg: Config, on_step: Callable[[dict[str, Any]], None] | None = None,
                 on_event: Callable[[str], None] | None = None) -> TrainResult:
    """Trains one branch of ``cfg.model`` under ``cfg.harness`` and records it as a version dir."""
    say = on_event or (lambda msg: None)
    program = seed_program(cfg)
    domain = build_domain(cfg)
    out = VersionDir(cfg.run_dir)
    with Harness(program, sandbox=cfg.sandbox) as harness:
        grpo = grpo_config(harness, cfg.grpo.model_dump())
        say(f"loading {cfg.model}")
        model, tok = load_base_model(cfg.model, dtype=cfg.dtype, device=cfg.device, seed=cfg.seed)
        policy = Policy(model, tok, LoraSettings(**cfg.lora.model_dump()))
        branch = "v0"
        policy.create(branch)
        engine = TransformersEngine(policy, batch_size=cfg.train.rollout_batch_size)
        trainer = GRPOTrainer(policy, branch, grpo)
        heldout = domain.tasks("heldout")[: cfg.train.eval_size]
        ev = dict(max_new_tokens=cfg.train.eval_max_new_tokens, temperature=cfg.train.eval_temperature,
                  seeds=cfg.train.eval_seeds)
        say(f"verifying {len(heldout)} held-out tasks before training")
        before = verify(engine, domain, heldout, branch, **ev)
        train_tasks = domain.tasks("train")
        all_rollouts: list[Rollout] = []
        steps: list[dict[str, Any]] = []
        out.path.mkdir(parents=True, exist_ok=True)
        (out.path / "steps.jsonl").unlink(missing_ok=True)
        for step in range(cfg.train.steps):
            tasks = sample_tasks(train_tasks, cfg.train.prompts_per_step, step, cfg.seed)
            rollouts, metrics = train_step(policy, engine, trainer, harness, domain, tasks, branch, step, cfg.seed)
            all_rollouts.extend(rollouts)
            steps.append(metrics)
            out.append_step(metrics)
            if on_step:
                on_step(metrics)
        policy.check_adapter_applied(branch)
        say(f"verifying {len(heldout)} held-out tasks after training")
        after = verify(engine, domain, heldout, branch, **ev)

        acc_before, acc_after = accuracy(before), accuracy(after)
        policy.save(branch, out.adapter_dir)
        out.save_genome(program.source)
        out.save_rollouts("train", all_rollouts)
        out.save_rollouts("heldout", after)
        out.save_rollouts("heldout_base", before)
        summary = {"heldout_accuracy": acc_after, "heldout_accuracy_before": acc_before,
                   "train_reward_mean": _mean([s.get("reward_mean", math.nan) for s in steps[-3:]]),
                   "steps": float(len(steps))}
        out.save_meta(BranchVersion(id=branch, base_model=cfg.model, genome_hash=program.hash, parents=["base"],
                                    metrics=summary))
        (out.path / "config.json").write_text(cfg.model_dump_json(indent=2))
    return TrainResult(out.path, acc_before, acc_after, steps)


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else math.nan
