"""Training one branch under a harness, outside the loop: what ``evotrainer train`` runs.

Steps are :func:`~evotrainer.policy.train_step.train_step`; held-out accuracy is measured by the
engine before and after, with data the harness never sees.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from evotrainer.config import Config
from evotrainer.domains import build_domain
from evotrainer.genome.harness import Harness
from evotrainer.policy.base_model import load_base_model
from evotrainer.policy.collect import prompt_fn, verify
from evotrainer.policy.curriculum import choose_tasks, task_stats
from evotrainer.policy.episodes import sampled_token_budget
from evotrainer.policy.grpo import GRPOTrainer
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.policy.engine_choice import build_engine, resolve_engine, tiny_overrides
from evotrainer.loop.seed import seed_program
from evotrainer.loop.validate import validate_resources
from evotrainer.policy.train_step import grpo_config, train_step
from evotrainer.records import run_dir as rundir
from evotrainer.records.numeric import mean
from evotrainer.records.rollout import Rollout
from evotrainer.records.scores import heldout_accuracy
from evotrainer.records.version import BranchVersion, VersionDir, write_atomic


@dataclass
class TrainResult:
    version_dir: Path
    heldout_before: float
    heldout_after: float
    steps: list[dict[str, Any]]


def train_branch(cfg: Config, on_step: Callable[[dict[str, Any]], None] | None = None,
                 on_event: Callable[[str], None] | None = None, validate: bool = True,
                 overwrite: bool = False) -> TrainResult:
    """Trains one branch of ``cfg.model`` under ``cfg.harness`` and records it as a version dir.
    ``validate=False``: the caller has run ``validate_resources`` already. A directory that holds a
    trained version is refused unless ``overwrite`` (then it is replaced once this training succeeded)."""
    say = on_event or (lambda msg: None)
    if validate:   # before any compute, and before the directory is touched
        validate_resources(cfg, loop=False, say=say)
    program = seed_program(cfg)
    domain = build_domain(cfg.domain)
    out = VersionDir(cfg.run_dir)
    # Only a version directory (or a new or empty one) is written, by one process at a time.
    rundir.claim(out.path, "version")
    with rundir.acquire(out.path, "evotrainer train"), Harness(program, sandbox=cfg.sandbox) as harness:
        if (out.path / "meta.json").is_file() and not overwrite:
            raise rundir.RunDirError(f"{out.path} holds a trained version already (meta.json): train into a new "
                                     "--run-dir, or pass --overwrite to replace it once the new training succeeded")
        grpo = grpo_config(harness, cfg.grpo.model_dump())
        say(f"loading {cfg.model}")
        engine_name, why = resolve_engine(cfg)
        say(f"rollout engine: {engine_name} ({why})")
        model, tok = load_base_model(cfg.model, dtype=cfg.dtype, device=cfg.device, seed=cfg.seed,
                                     **tiny_overrides(cfg, engine_name))
        policy = Policy(model, tok, LoraSettings(**cfg.lora.model_dump()),
                        gradient_checkpointing=cfg.train.gradient_checkpointing)
        branch = "v0"
        policy.create(branch)
        engine = build_engine(cfg, policy, engine_name)
        trainer = GRPOTrainer(policy, branch, grpo, max_tokens=sampled_token_budget(domain, grpo.max_completion_length))
        heldout = domain.tasks("heldout")[: cfg.train.eval_size]
        ev = dict(max_new_tokens=cfg.train.eval_max_new_tokens, temperature=cfg.train.eval_temperature,
                  seeds=cfg.train.eval_seeds, prompt=prompt_fn(harness))
        say(f"verifying {len(heldout)} held-out tasks before training")
        before = verify(engine, domain, heldout, branch, **ev)
        train_tasks = domain.tasks("train")
        all_rollouts: list[Rollout] = []
        steps: list[dict[str, Any]] = []
        violations: list[str] = []
        partial = VersionDir(out.path / ".partial")   # this run's steps, live, beside the old version's
        (partial.path / "steps.jsonl").unlink(missing_ok=True)
        for step in range(cfg.train.steps):
            tasks, bad = choose_tasks(harness, train_tasks, task_stats(all_rollouts), step, cfg.train.prompts_per_step,
                                      cfg.seed)
            for v in bad:
                say(f"engine check: {v}")
            violations += bad
            rollouts, metrics = train_step(policy, engine, trainer, harness, domain, tasks, branch, step, cfg.seed,
                                           prompt=ev["prompt"])
            all_rollouts.extend(rollouts)
            steps.append(metrics)
            partial.append_step(metrics)
            if on_step:
                on_step(metrics)
        policy.check_adapter_applied(branch)
        say(f"verifying {len(heldout)} held-out tasks after training")
        after = verify(engine, domain, heldout, branch, **ev)

        acc_before, acc_after = heldout_accuracy(before), heldout_accuracy(after)
        # The whole new version is written beside the old one first, then moved in with its meta
        # last: a process killed while moving leaves no meta.json, never an old meta over new weights.
        policy.save(branch, partial.adapter_dir)
        write_atomic(partial.path / "steps.jsonl", "".join(json.dumps(m) + "\n" for m in steps))
        partial.save_genome(program.source)
        partial.save_rollouts("train", all_rollouts)
        partial.save_rollouts("heldout", after)
        partial.save_rollouts("heldout_base", before)
        partial.save_engine_violations(violations)
        write_atomic(partial.path / "config.json", cfg.model_dump_json(indent=2))
        summary = {"heldout_accuracy": acc_after, "heldout_accuracy_before": acc_before,
                   "train_reward_mean": mean([s.get("reward_mean", math.nan) for s in steps[-3:]]),
                   "steps": float(len(steps))}
        partial.save_meta(BranchVersion(id=branch, base_model=cfg.model, genome_hash=program.hash, parents=["base"],
                                        metrics=summary))
        if (out.path / "meta.json").is_file():
            say(f"replacing the version in {out.path} (--overwrite)")
        _move_in(partial.path, out.path)
    return TrainResult(out.path, acc_before, acc_after, steps)


def _move_in(partial: Path, out: Path) -> None:
    """Moves every entry of ``partial`` into ``out`` (replacing what is there), meta.json last."""
    (out / "meta.json").unlink(missing_ok=True)
    names = sorted(p.name for p in partial.iterdir())
    for name in [n for n in names if n != "meta.json"] + ["meta.json"]:
        target = out / name
        if target.is_dir():
            shutil.rmtree(target)   # no file of an earlier adapter (or rollouts folder) survives
        os.replace(partial / name, target)
    shutil.rmtree(partial, ignore_errors=True)
