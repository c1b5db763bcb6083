"""Resumable ``evotrainer train``: a checkpoint of an unfinished training, and continuing from it.

A loop run resumes version by version, but ``evotrainer train`` (and the benchmarks built on it,
``benchmarks/headroom.py``) trains one version for all its steps: a 16-step SWE ladder killed at
step 12 used to start again from step 0, hours lost. Every ``train.save_steps`` steps the training
now leaves ``<run_dir>/.partial/checkpoint/``: the adapter, the AdamW moments, the train rollouts
so far (the curriculum counts from them), the engine's violations, the steps' metrics, and what it
was trained for (the config, the harness, the init adapter). A later ``evotrainer train`` of the
same training finds it and continues at the next step, as TRL's ``resume_from_checkpoint`` does.
Each step samples from seeds given by its index (``policy.train_step.step_params``), so a resumed
training is the uninterrupted one, bit for bit on a CPU (tests/test_train_checkpoint.py). State a
harness keeps in its own process between steps is not carried: a harness that keeps any restarts
it at the resumed step.

A checkpoint of another training (another config or harness) is never discarded silently: the
train stops and names what differs, and ``--restart`` discards it.

The checkpoint is written beside (``checkpoint.tmp``) and swapped in; a kill between the two renames
leaves ``checkpoint.old``, which :func:`find` still reads.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from evotrainer.config import Config, ConfigError, parse_config
from evotrainer.loop.crash import crash_point
from evotrainer.records.rollout import Rollout
from evotrainer.records.run_dir import RunDirError
from evotrainer.records.version import VersionDir, write_atomic

NAME = "checkpoint"
OPTIMIZER = "optimizer.pt"
STATE = "state.json"
# What may change between a training and its resumption without making it another training: where it
# is written, how long it runs, how often it checkpoints; the harness file's path (its genome hash is
# compared) and the loop's own section, which one-version training does not read.
FREE = ({"run_dir", "harness", "evolution"}, {"steps", "save_steps"})   # (top-level keys, train.* keys)


class CheckpointMismatch(RunDirError):
    """The run dir holds a checkpoint of another training (the message names what differs)."""


@dataclass
class Resumed:
    """What a checkpoint restores: the next step, the steps' metrics, train rollouts and violations."""
    path: Path
    step: int
    steps: list[dict[str, Any]]
    rollouts: list[Rollout]
    violations: list[str]
    elapsed_s: float   # the sittings before this one, from the start of train_branch to the checkpoint

    def load_optimizer(self, trainer) -> None:
        trainer.load_optimizer_state(torch.load(self.path / OPTIMIZER, weights_only=True))


def identity(cfg: Config, genome_hash: str, init_adapter: Path | str | None) -> dict[str, Any]:
    """What makes a training the same training: its config (less what ``FREE`` lets change), its
    harness and where its adapter started."""
    conf = cfg.model_dump(mode="json")
    top, train = FREE
    for k in top:
        conf.pop(k, None)
    for k in train:
        conf["train"].pop(k, None)
    return {"config": conf, "genome_hash": genome_hash, "init_adapter": str(init_adapter) if init_adapter else None}


def differences(saved: Any, want: Any, at: str = "") -> list[str]:
    """Dotted paths where two identities differ, each with both values (the first few are enough)."""
    if isinstance(saved, dict) and isinstance(want, dict):
        out = []
        for k in sorted(set(saved) | set(want), key=str):
            out += differences(saved.get(k), want.get(k), f"{at}.{k}" if at else str(k))
        return out
    return [] if saved == want else [f"{at}: {saved!r} in the checkpoint, {want!r} now"]


def find(partial: Path) -> Path | None:
    """The checkpoint in a ``.partial`` folder: the swapped-in one, else one a kill left mid-swap."""
    for name in (NAME, f"{NAME}.old"):
        if (partial / name / STATE).is_file():
            return partial / name
    return None


def load(partial: Path, ident: dict[str, Any], total_steps: int, restart: bool) -> Resumed | None:
    """The checkpoint to continue from, or None (there is none, or ``restart`` discards it). One of
    another training, or past ``total_steps``, is a :class:`CheckpointMismatch` naming what to do."""
    path = find(partial)
    if path is None or restart:
        return None
    state = json.loads((path / STATE).read_text())
    try:   # parsed again, so a field added since (at its default) or renamed reads as the code reads it now
        saved = identity(parse_config(state["config"], f"{path / STATE}"), state["genome_hash"], state["init_adapter"])
    except ConfigError as e:
        raise CheckpointMismatch(f"{partial.parent} holds the checkpoint of an unfinished training at step {state['step']} "
                                 f"whose config this version of evotrainer no longer reads ({e}): pass --restart to "
                                 "start from step 0, or continue it with the evotrainer version that wrote it") from None
    diff = differences(saved, ident)
    if diff:
        raise CheckpointMismatch(
            f"{partial.parent} holds the checkpoint of an unfinished training at step {state['step']} that is another "
            f"training than this one ({'; '.join(diff[:4])}{'; ...' if len(diff) > 4 else ''}): train with its config to "
            "continue it, pass --restart to discard it and start from step 0, or choose another --run-dir")
    if state["step"] > total_steps:
        raise CheckpointMismatch(
            f"{partial.parent} holds a checkpoint at step {state['step']}, past train.steps {total_steps}: raise "
            "--steps to at least that to continue it, or pass --restart to start from step 0")
    if not VersionDir(partial).rollouts_path("heldout_base").is_file():
        raise CheckpointMismatch(f"{partial} holds a checkpoint at step {state['step']} but not the untrained model's "
                                 "held-out rollouts (rollouts/heldout_base.jsonl) that the version reports beside its "
                                 "own: pass --restart to start from step 0")
    vd = VersionDir(path)
    return Resumed(path, state["step"], vd.steps(), vd.rollouts("train"), vd.engine_violations(),
                   float(state.get("elapsed_s", 0.0)))


def save(partial: Path, cfg: Config, genome_hash: str, init_adapter: Path | None, step: int, policy, branch: str, trainer,
         steps: list[dict[str, Any]], rollouts: list[Rollout], violations: list[str], elapsed_s: float) -> Path:
    """Writes the checkpoint after ``step`` steps (the next to run is ``step``) and swaps it in;
    ``elapsed_s``: the training's seconds so far, every sitting's."""
    tmp, final, old = partial / f"{NAME}.tmp", partial / NAME, partial / f"{NAME}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    policy.save(branch, tmp / "adapter")
    torch.save(trainer.optimizer_state(), tmp / OPTIMIZER)
    vd = VersionDir(tmp)
    vd.save_rollouts("train", rollouts)
    vd.save_engine_violations(violations)
    for m in steps:
        vd.append_step(m)
    state = {"step": step, "elapsed_s": elapsed_s, "config": cfg.model_dump(mode="json"), "genome_hash": genome_hash,
             "init_adapter": str(init_adapter) if init_adapter else None}
    write_atomic(tmp / STATE, json.dumps(state, indent=1))   # last: it marks the folder whole
    if final.is_dir():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    crash_point("train:checkpoint-swapping")
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def discard(partial: Path) -> None:
    """Every checkpoint folder in ``partial`` removed (the training it would resume is done)."""
    for name in (NAME, f"{NAME}.tmp", f"{NAME}.old"):
        shutil.rmtree(partial / name, ignore_errors=True)


def restore_adapter(resumed: Resumed, adapter_dir: Path) -> None:
    """The checkpoint's adapter copied to where the training loads its branch from."""
    shutil.rmtree(adapter_dir, ignore_errors=True)
    shutil.copytree(resumed.path / "adapter", adapter_dir)
