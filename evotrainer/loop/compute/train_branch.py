"""Training one branch under a harness, outside the loop: what ``evotrainer train`` runs.

The steps are the loop's own (:class:`~evotrainer.loop.stages.training.BranchTraining`, on a
:class:`~evotrainer.loop.stages.training.StandaloneContext`): the branch is a seed version, ``v0``, trained
``train.steps`` steps from a fresh adapter, or from a saved one (``init_adapter``: a version's
``adapter/`` folder, to train it further under another harness). Held-out accuracy is measured by the engine before and
after, with data the harness never sees.

The new version is written beside the directory's old one (``.partial/``) and moved in only once it
is whole, its ``meta.json`` last: a failed or killed training leaves the old version as it was, and
a checkpoint every ``train.save_steps`` steps that the next ``train`` of the same training continues
from (``loop/compute/checkpoint.py``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from evotrainer.config import Config
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.compute import checkpoint
from evotrainer.loop.crash import crash_point
from evotrainer.loop.seed import seed_program
from evotrainer.loop.stages.training import BranchTraining, StandaloneContext
from evotrainer.loop.tools.validate import validate_resources
from evotrainer.policy.collect import prompt_fn, verify
from evotrainer.records import run_dir as rundir
from evotrainer.records.numeric import mean
from evotrainer.records.scores import heldout_accuracy
from evotrainer.records.version import BranchVersion, Status, VersionDir, write_atomic

BRANCH = "v0"
PARTIAL = ".partial"


class InitAdapterError(ValueError):
    """An ``init_adapter`` that this config cannot train from (the message says what to fix)."""


@dataclass
class TrainResult:
    version_dir: Path
    heldout_before: float
    heldout_after: float
    steps: list[dict[str, Any]]
    resumed_from: int = 0        # the step a checkpoint continued at (0: trained from the start)
    elapsed_s: float = 0.0       # the training's seconds, every sitting's


def train_branch(cfg: Config, on_step: Callable[[dict[str, Any]], None] | None = None,
                 on_event: Callable[[str], None] | None = None, validate: bool = True,
                 overwrite: bool = False, init_adapter: str | Path | None = None,
                 restart: bool = False) -> TrainResult:
    """Trains one branch of ``cfg.model`` under ``cfg.harness`` and records it as a version dir.
    ``validate=False``: the caller has run ``validate_resources`` already. A directory that holds a
    trained version is refused unless ``overwrite`` (then it is replaced once this training succeeded).
    ``init_adapter``: start from this saved LoRA adapter instead of a fresh one (it is copied, never
    written to); the version records where it came from in ``init_adapter.json``. An unfinished
    training of the same config and harness is continued from its checkpoint; ``restart`` discards it."""
    say = on_event or (lambda msg: None)
    t0 = time.perf_counter()
    if init_adapter is not None:   # before any compute: a wrong folder is the user's to fix
        init_adapter = check_init_adapter(cfg, init_adapter)
    if validate:   # before any compute, and before the directory is touched
        validate_resources(cfg, loop=False, say=say)
    program = seed_program(cfg)
    out = VersionDir(cfg.run_dir)
    # Only a version directory (or a new or empty one) is written, by one process at a time.
    rundir.claim(out.path, "version")
    with rundir.acquire(out.path, "evotrainer train"):
        _roll_forward(out.path / PARTIAL, out.path, say)
        if (out.path / "meta.json").is_file() and not overwrite:
            raise rundir.RunDirError(f"{out.path} holds a trained version already (meta.json): train into a new "
                                     "--run-dir, or pass --overwrite to replace it once the new training succeeded")
        ident = checkpoint.identity(cfg, program.hash, init_adapter)
        resumed = checkpoint.load(out.path / PARTIAL, ident, cfg.train.steps, restart)
        if resumed is not None:   # BranchTraining loads an adapter it finds instead of a fresh one
            partial = VersionDir(out.path / PARTIAL)
            checkpoint.restore_adapter(resumed, partial.adapter_dir)
            say(f"resuming at step {resumed.step} of {cfg.train.steps} from the checkpoint in {resumed.path}")
        else:
            if restart and checkpoint.find(out.path / PARTIAL):
                say(f"discarding the unfinished training's checkpoint in {out.path / PARTIAL} (--restart)")
            partial = _pending_version(out.path / PARTIAL, cfg, program)
            if init_adapter is not None:
                shutil.copytree(init_adapter, partial.adapter_dir)
                write_atomic(partial.path / "init_adapter.json", json.dumps({"from": str(init_adapter)}))
                say(f"starting from the adapter in {init_adapter}")
        start, prior_s = (resumed.step, resumed.elapsed_s) if resumed else (0, 0.0)
        ctx = StandaloneContext(cfg, vdir=lambda vid: partial, say=say)
        rt = ctx.runtime
        say(f"loading {cfg.model} (rollout engine: {rt.engine_name})")
        with BranchTraining(ctx, BRANCH) as bt:
            verify_kwargs = dict(max_new_tokens=cfg.train.eval_max_new_tokens, temperature=cfg.train.eval_temperature,
                      seeds=cfg.train.eval_seeds, prompt=prompt_fn(bt.harness))
            steps: list[dict[str, Any]] = []
            if resumed is None:
                say(f"verifying {len(rt.heldout_tasks)} held-out tasks before training")
                before = verify(rt.engine, rt.domain, rt.heldout_tasks, BRANCH, **verify_kwargs)
                partial.save_rollouts("heldout_base", before)   # before the first checkpoint: a resume reads it
            else:   # the adapter is the checkpoint's: the untrained scores are the first sitting's
                before = partial.rollouts("heldout_base")
                resumed.load_optimizer(bt.trainer)
                bt.rollouts, bt.violations, steps = list(resumed.rollouts), list(resumed.violations), list(resumed.steps)
                for m in steps:   # BranchTraining starts steps.jsonl afresh
                    partial.append_step(m)
            every = cfg.train.save_steps
            for i in range(start, cfg.train.steps):
                steps.append(bt.step(i))
                if on_step:
                    on_step(steps[-1])
                # The last step too: a kill while the trained adapter is verified repeats no step.
                if every and ((i + 1) % every == 0 or i + 1 == cfg.train.steps):
                    checkpoint.save(partial.path, cfg, program.hash, init_adapter, i + 1, rt.policy, BRANCH,
                                    bt.trainer, steps, bt.rollouts, bt.violations, prior_s + time.perf_counter() - t0)
                    crash_point(f"train:checkpoint-saved:{i + 1}")
            rt.policy.check_adapter_applied(BRANCH)
            say(f"verifying {len(rt.heldout_tasks)} held-out tasks after training")
            after = verify(rt.engine, rt.domain, rt.heldout_tasks, BRANCH, **verify_kwargs)
            bt.finish()   # the adapter, the train rollouts, the engine's violations

        acc_before, acc_after = heldout_accuracy(before), heldout_accuracy(after)
        partial.save_rollouts("heldout", after)
        write_atomic(partial.path / "config.json", cfg.model_dump_json(indent=2))
        summary = {"heldout_accuracy": acc_after, "heldout_accuracy_before": acc_before,
                   "train_reward_mean": mean([s.get("reward_mean", math.nan) for s in steps[-3:]]),
                   "steps": float(len(steps)), "resumed_from_step": float(start)}
        partial.save_meta(BranchVersion(id=BRANCH, base_model=cfg.model, genome_hash=program.hash, parents=["base"],
                                        metrics=summary))
        if (out.path / "meta.json").is_file():
            say(f"replacing the version in {out.path} (--overwrite)")
        _move_in(partial.path, out.path)
    return TrainResult(out.path, acc_before, acc_after, steps, start, prior_s + time.perf_counter() - t0)


def check_init_adapter(cfg: Config, path: str | Path) -> Path:
    """``path`` as an adapter this config's LoRA settings can train, or an InitAdapterError saying why not."""
    path = Path(path).expanduser().resolve()
    conf = path / "adapter_config.json"
    if not conf.is_file():
        raise InitAdapterError(f"init adapter {path} holds no adapter_config.json: name a LoRA adapter folder, "
                         "e.g. a version's adapter/ folder (runs/<run>/versions/<id>/adapter)")
    try:
        saved = json.loads(conf.read_text())
    except json.JSONDecodeError as e:
        raise InitAdapterError(f"init adapter {conf} is not valid JSON ({e}): restore the adapter folder") from None
    want = cfg.lora.model_dump()
    differ = [f"{k} {saved.get(k)!r} (config: {want[k]!r})" for k in ("r", "lora_alpha")
              if saved.get(k) != want[k]]
    if sorted(saved.get("target_modules") or []) != sorted(want["target_modules"]):
        differ.append(f"target_modules {sorted(saved.get('target_modules') or [])} (config: {sorted(want['target_modules'])})")
    if differ:
        raise InitAdapterError(f"init adapter {path} was trained with other LoRA settings: {'; '.join(differ)}; set the "
                         "config's lora section to the adapter's values")
    return path


def _pending_version(path: Path, cfg: Config, program: HarnessProgram) -> VersionDir:
    """An empty ``path`` holding what BranchTraining starts from: the genome and a pending seed meta
    (no parents: a fresh adapter). Emptied first, so nothing of an earlier failed attempt (its
    adapter above all) is trained from or moved in."""
    shutil.rmtree(path, ignore_errors=True)
    vd = VersionDir(path)
    path.mkdir(parents=True)
    vd.save_genome(program.source)
    vd.save_meta(BranchVersion(id=BRANCH, base_model=cfg.model, genome_hash=program.hash, parents=[],
                               status=Status.PENDING))
    return vd


def _roll_forward(partial: Path, out: Path, say: Callable[[str], None]) -> None:
    """A training killed while its finished version moved in (meta.json last) is moved in, not resumed:
    ``.partial`` with a finished meta completes the move; one whose meta already moved is what the
    move left behind (the checkpoint among it) and goes."""
    if not partial.is_dir():
        return
    meta = partial / "meta.json"
    if meta.is_file() and VersionDir(partial).meta().status != Status.PENDING:
        say(f"completing the move of a finished training into {out} (killed while it moved in)")
        _move_in(partial, out)
    elif not meta.is_file() and (out / "meta.json").is_file():
        shutil.rmtree(partial, ignore_errors=True)


def _move_in(partial: Path, out: Path) -> None:
    """Moves every entry of ``partial`` into ``out`` (replacing what is there), meta.json last; the
    checkpoint stays behind until the version is in (a kill before then still resumes from it)."""
    (out / "meta.json").unlink(missing_ok=True)
    names = sorted(p.name for p in partial.iterdir() if not p.name.startswith(checkpoint.NAME))
    for name in [n for n in names if n != "meta.json"] + ["meta.json"]:
        target = out / name
        if target.is_dir():
            shutil.rmtree(target)   # no file of an earlier adapter (or rollouts folder) survives
        os.replace(partial / name, target)
        crash_point("train:moving-in")
    shutil.rmtree(partial, ignore_errors=True)
