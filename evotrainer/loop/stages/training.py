"""The train and verify stages of a generation, each on one branch version and idempotent.

A stage reads a version's status from its directory and does nothing if its work is already
recorded there, so a resumed run repeats no finished work. Statuses move
pending → trained → verified → kept | promoted | rejected | invalid, and pruned when selection
drops a version.
"""

from __future__ import annotations

import contextlib
import pickle
import shutil
import time
from typing import TYPE_CHECKING, Callable

import torch

from evotrainer.config import Config
from evotrainer.fitness.episodes import working_call_rate
from evotrainer.fitness.health import health_report
from evotrainer.genome.errors import GenomeError
from evotrainer.genome.harness import Harness
from evotrainer.genome.program import HarnessProgram
from evotrainer.genome.sandbox import SandboxError
from evotrainer.loop.budgets import Budgets
from evotrainer.loop.crash import crash_point
from evotrainer.loop.stages.merging import start_adapter
from evotrainer.loop.stages.probes import version_steps
from evotrainer.loop.progress import NullProgress
from evotrainer.loop.compute.runtime import Runtime
from evotrainer.loop.stages.selection import groups_with_gradient
from evotrainer.loop.stages.start import START
from evotrainer.policy.collect import CollectJob, collect_many, default_prompt, prompt_fn, shares_batches, verify_many
from evotrainer.policy.curriculum import choose_tasks, task_stats
from evotrainer.policy.episodes import sampled_token_budget
from evotrainer.policy.grpo import GRPOTrainer
from evotrainer.policy.train_step import grpo_config, step_params, train_step
from evotrainer.records.run_dir import RunDirError
from evotrainer.records.run_state import RunState
from evotrainer.records.scores import heldout_accuracy
from evotrainer.records.version import Status, VersionDir, write_atomic

if TYPE_CHECKING:
    from evotrainer.loop.context import RunContext

OPTIMIZER_FILE = "optimizer.pt"        # AdamW state saved beside the adapter (train.carry_optimizer)


class BranchTraining:
    """One pending version's k training steps under its own harness, a step at a time, so that
    several versions can step together and share the engine's batches (:func:`train_versions`).

    ``bt.start_from_parent()`` copies the parent's adapter afresh; ``with BranchTraining(exp, vid) as bt:``
    then opens the harness and the trainer; ``bt.job(i)`` is what
    to sample at step i (its tasks, asked as the harness asks), ``bt.learn(i, tasks, sampled)`` runs
    the step on those rollouts (``bt.step(i)`` does both for a version that trains alone) and
    ``bt.finish()`` saves the adapter. ``exp`` is the run's :class:`~evotrainer.loop.context.RunContext`:
    the experiment, or outside a loop run a :class:`StandaloneContext` (``loop/compute/train_branch.py``,
    ``loop/tools/rerun.py``) or a worker process's ``BranchWorker``.
    A harness that fails at run time raises :data:`HARNESS_FAILURES`; ``bt.reject(e)`` records it.
    """

    def __init__(self, exp: RunContext, vid: str) -> None:
        self.exp, self.vid, self.vd = exp, vid, exp.vdir(vid)
        self.meta = self.vd.meta()
        self.k = version_steps(exp.cfg, self.meta)
        self.rollouts, self.violations = [], []
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> BranchTraining:
        exp, cfg, vd, meta = self.exp, self.exp.cfg, self.vd, self.meta
        (vd.path / "steps.jsonl").unlink(missing_ok=True)  # a crash mid-training restarts it from the copy
        exp.runtime.load_adapter(self.vid, vd.adapter_dir, fresh_ok=not meta.parents)
        self.t0 = time.perf_counter()
        # The curriculum's counts start from what the lineage last trained on (the parent's cache).
        self.history = exp.vdir(meta.parents[0]).rollouts("train") if meta.parents else []
        try:
            program = HarnessProgram(vd.genome_source(), name=f"{self.vid}/genome.py")
            self.harness = self._stack.enter_context(Harness(program, sandbox=cfg.sandbox))
            try:
                grpo = grpo_config(self.harness, cfg.grpo.model_dump())
            except GenomeError:
                raise
            except ValueError as e:   # the recipe the harness's knobs make: the harness's failure
                raise GenomeError(f"the trainer refuses the recipe of its KNOBS: {e}") from e
            self.trainer = GRPOTrainer(exp.runtime.policy, self.vid, grpo,
                                       max_tokens=sampled_token_budget(exp.runtime.domain, grpo.max_completion_length))
            inherited = vd.adapter_dir / OPTIMIZER_FILE   # copied with the parent's adapter
            if cfg.train.carry_optimizer and inherited.is_file():
                self._load_inherited_optimizer(inherited)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def _load_inherited_optimizer(self, path) -> None:
        """The parent's AdamW moments; one that does not fit this branch is the run directory's
        problem (another LoRA shape, a damaged file), not the harness's: it stops the run with the fix."""
        try:
            self.trainer.load_optimizer_state(torch.load(path, weights_only=True))
        except (ValueError, RuntimeError, KeyError, OSError, EOFError, pickle.UnpicklingError) as e:
            raise RunDirError(
                f"{self.vid}: the optimizer state it inherits from {self.meta.parents[0] if self.meta.parents else 'its seed'} "
                f"({path}) cannot be loaded: {e}. Set train.carry_optimizer: false in the run's config.json to "
                f"start every version with a fresh optimizer, or delete {path} to start {self.vid} alone with one; "
                "then resume the run") from e

    def start_from_parent(self) -> None:
        """Training always starts from a fresh copy of the parent's adapter (a seed: from none). An
        attempt that died after saving its trained adapter, or between removing the old one and
        renaming the new, must neither train that adapter twice nor start from fresh weights."""
        self.exp.runtime.unload_adapter(self.vid)
        shutil.rmtree(self.vd.adapter_dir, ignore_errors=True)
        if self.meta.parents:
            # a merge child starts from its parents' merged adapter (loop/stages/merging.py), any other from its first parent's
            src = start_adapter(self.exp, self.meta) or self.exp.vdir(self.meta.parents[0]).adapter_dir
            if not (src / "adapter_config.json").is_file():
                raise RunDirError(f"{self.vid}'s parent {self.meta.parents[0]} holds no adapter ({src}): its weights "
                                  "are lost; restore the folder from a backup, or start the run again")
            shutil.copytree(src, self.vd.adapter_dir)

    def step_number(self, i: int) -> int:
        # Common random numbers: siblings of one generation see the same tasks and seeds,
        # so a child and its control differ only in the harness.
        first = self.meta.first_step
        return (self.meta.generation * self.k if first is None else first) + i

    def job(self, i: int) -> CollectJob:
        """Step i's sampling request: its tasks (the harness's curriculum), asked as the harness asks
        them, after the adapter-applied check. Harness hooks run here, so a failing one is this
        version's failure, not the shared batch's."""
        rt, cfg = self.exp.runtime, self.exp.cfg
        step = self.step_number(i)
        tasks, bad = choose_tasks(self.harness, rt.train_tasks, task_stats(self.history + self.rollouts),
                                  step, cfg.train.prompts_per_step, cfg.seed)
        self.violations += bad
        if step > 0:   # rollouts only count if they really came from this branch's adapter
            rt.policy.check_adapter_applied(self.vid)
        ask = prompt_fn(self.harness)
        if ask is not default_prompt:
            asked = {t.id: ask(t) for t in tasks}
            ask = lambda t: asked[t.id]   # noqa: E731
        params = step_params(self.trainer.cfg, cfg.seed, step)
        return CollectJob(tasks, self.trainer.cfg.num_generations, params, self.vid, ask, step)

    def learn(self, i: int, tasks: list, sampled: tuple[list, float]) -> dict[str, float]:
        """Step i's GRPO update on its rollouts (sampled for :meth:`job`) and their generation seconds.
        Returns the step's metrics (also appended to the version's ``steps.jsonl``)."""
        rt = self.exp.runtime
        step_rollouts, metrics = train_step(rt.policy, rt.engine, self.trainer, self.harness, rt.domain, tasks,
                                            self.vid, self.step_number(i), self.exp.cfg.seed, sampled=sampled)
        self.rollouts += step_rollouts
        self.vd.append_step(metrics)
        self.exp.budgets.spend(train_steps=1, rollout_tokens=sum(r.num_tokens for r in step_rollouts),
                               gen_seconds=metrics["gen_seconds"], train_seconds=metrics["train_seconds"])
        return metrics

    def step(self, i: int) -> dict[str, float]:
        """Step i of a version that trains alone: sample its :meth:`job`, then :meth:`learn` from it."""
        job = self.job(i)
        t0 = time.perf_counter()
        [rollouts] = collect_many(self.exp.runtime.engine, self.exp.runtime.domain, [job])
        return self.learn(i, job.tasks, sampled=(rollouts, time.perf_counter() - t0))

    def reject(self, e: Exception) -> None:
        """The harness failed at run time: the engine records it and carries on with the others."""
        self.meta.status, self.meta.decision = Status.REJECTED, {"reasons": [f"harness failed in training: {e}"]}
        self.vd.save_meta(self.meta)
        self.exp.runtime.unload_adapter(self.vid)

    def finish(self) -> None:
        exp, cfg, vd, meta = self.exp, self.exp.cfg, self.vd, self.meta
        meta.knobs = self.harness.knob_values
        with exp.budgets.timed("adapter"):
            tmp = vd.path / "adapter.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            exp.runtime.policy.save(self.vid, tmp)
            if cfg.train.carry_optimizer:
                torch.save(self.trainer.optimizer_state(), tmp / OPTIMIZER_FILE)
            shutil.rmtree(vd.adapter_dir, ignore_errors=True)
            crash_point(f"train:adapter-removed:{self.vid}")
            tmp.rename(vd.adapter_dir)
            crash_point(f"train:adapter-saved:{self.vid}")   # trained weights on disk, the version still pending
        vd.save_rollouts("train", self.rollouts)
        vd.save_engine_violations(self.violations)
        for v in self.violations[:3]:
            exp.say(f"{self.vid}: engine check: {v}")
        meta.metrics.update(train_seconds=time.perf_counter() - self.t0)
        meta.status = Status.TRAINED
        vd.save_meta(meta)
        # The adapter stays loaded: verification comes next and would otherwise read it back from disk.


class StandaloneContext:
    """A :class:`~evotrainer.loop.context.RunContext` for a version trained outside a loop run
    (``evotrainer train``, ``evotrainer rerun``): the run's config and messages, a scratch budget
    ledger that is never saved, a :class:`Runtime` of its own, no progress display. ``vdir(vid)``
    says where each version's directory is."""

    def __init__(self, cfg: Config, vdir: Callable[[str], VersionDir], say: Callable[[str], None]) -> None:
        self.cfg, self.vdir, self.say = cfg, vdir, say
        self.budgets = Budgets(cfg, RunState())
        self.runtime = Runtime(cfg, self.budgets)
        self.progress = NullProgress()


# What a harness can cause at run time. Not ValueError at large: the engine's own ValueErrors (an
# inherited optimizer state that does not fit, a run directory that cannot be used) are not the harness's.
HARNESS_FAILURES = (SandboxError, GenomeError)


def train_version(exp: RunContext, vid: str) -> None:
    """Trains a pending version k steps from its (copied) parent adapter under its own harness."""
    train_versions(exp, [vid])


def train_versions(exp: RunContext, vids: list[str]) -> list[str]:
    """Trains pending versions in lock step: at each step every version picks and asks its tasks,
    all their rollouts are sampled in one engine call (``collect_many``: vLLM and the transformers
    engine serve every adapter in one batch; an episodic domain's turns go in one call on the transformers
    engine, one version after another on vLLM), then
    each version takes its own GRPO step. A version whose harness fails is rejected and the others go on. Returns the versions that
    trained."""
    sessions, stack = {}, contextlib.ExitStack()
    with stack:
        for vid in vids:
            if exp.vdir(vid).meta().status != Status.PENDING:
                continue
            bt = BranchTraining(exp, vid)
            bt.start_from_parent()   # before the harness's failures are caught: a lost adapter stops the run
            try:
                sessions[vid] = stack.enter_context(bt)
            except HARNESS_FAILURES as e:
                bt.reject(e)
        k = max((bt.k for bt in sessions.values()), default=0)   # one generation's steps, as a rule the same for all
        exp.progress.steps(f"{', '.join(sessions)} GRPO steps", k)
        for i in range(k):
            jobs = {}
            for vid, bt in list(sessions.items()):
                if i >= bt.k:
                    continue
                try:
                    jobs[vid] = bt.job(i)
                except HARNESS_FAILURES as e:
                    sessions.pop(vid).reject(e)
            if not jobs:
                break
            t0 = time.perf_counter()
            sampled = collect_many(exp.runtime.engine, exp.runtime.domain, list(jobs.values()))
            share = (time.perf_counter() - t0) / len(jobs)   # each version's part of a shared call
            for (vid, job), rollouts in zip(jobs.items(), sampled):
                try:
                    sessions[vid].learn(i, job.tasks, sampled=(rollouts, share))
                except HARNESS_FAILURES as e:
                    sessions.pop(vid).reject(e)
            exp.progress.step()
        for vid, bt in list(sessions.items()):
            try:
                bt.finish()
            except HARNESS_FAILURES as e:
                sessions.pop(vid).reject(e)
    return list(sessions)


def verify_version(exp: RunContext, vid: str) -> None:
    verify_versions(exp, [vid])


def verify_versions(exp: RunContext, vids: list[str], on_done=None) -> None:
    """Held-out verification by the engine (hidden outcomes) and each version's health report.

    The whole held-out pool is verified in one pass and stored in two parts: the gate draw as
    ``heldout`` (all the fitness layer reads: gates, health, validity checks) and the selection draw
    as ``selection`` (only selection reads it, through ``selection_accuracy``). On an engine that
    serves several adapters at once (vLLM, the transformers engine) all the versions' prompts go in one call; each version's
    ``verify_seconds`` is then its share of that call. ``on_done(vid)`` runs after each version."""
    tc = exp.cfg.train
    rt = exp.runtime
    ready, jobs = [], []
    for vid in vids:
        vd = exp.vdir(vid)
        meta = vd.meta()
        if meta.status != Status.TRAINED:
            continue
        rt.load_adapter(vid, vd.adapter_dir)
        rt.policy.check_adapter_applied(vid)
        program = HarnessProgram(vd.genome_source(), name=f"{vid}/genome.py")
        try:
            with Harness(program, sandbox=exp.cfg.sandbox) as harness:   # a version is verified as it is asked
                ask = prompt_fn(harness)
                asked = {t.id: ask(t) for t in rt.heldout_tasks} if ask is not default_prompt else None
        except HARNESS_FAILURES as e:
            meta.status, meta.decision = Status.REJECTED, {"reasons": [f"harness failed in verification: {e}"]}
            vd.save_meta(meta)
            rt.unload_adapter(vid)
            exp.say(f"{vid}: harness failed in verification: {e}")
            if on_done:
                on_done(vid)
            continue
        ready.append(vid)
        jobs.append((rt.heldout_tasks, vid, default_prompt if asked is None else (lambda t, a=asked: a[t.id])))
    if not ready:
        return
    if shares_batches(rt.engine, rt.domain, len(ready)):
        exp.say(f"verifying {', '.join(ready)} in one batch ({len(ready) * len(rt.heldout_tasks)} prompts per seed)")
    t0 = time.perf_counter()
    results = verify_many(rt.engine, rt.domain, jobs, max_new_tokens=tc.eval_max_new_tokens,
                          temperature=tc.eval_temperature, seeds=tc.eval_seeds)
    share = (time.perf_counter() - t0) / len(ready)
    for vid, heldout in zip(ready, results):
        _record_verification(exp, vid, heldout, share)
        if on_done:
            on_done(vid)


def _record_verification(exp: RunContext, vid: str, heldout: list, verify_seconds: float) -> None:
    vd = exp.vdir(vid)
    meta = vd.meta()
    exp.runtime.unload_adapter(vid)
    exp.budgets.spend(rollout_tokens=sum(r.num_tokens for r in heldout), verify_seconds=verify_seconds)
    in_gate = {t.id for t in exp.runtime.gate_tasks}
    selection = [r for r in heldout if r.task_id not in in_gate]
    heldout = [r for r in heldout if r.task_id in in_gate]
    vd.save_rollouts("selection", selection)
    vd.save_rollouts("heldout", heldout)
    # Its report reads against where it started: the parent, or for generation 0 the untrained model's
    # record beside the versions folder (the start: same gate tasks, same seeds).
    start = vd.path.parent.parent / START
    parent_dir = (exp.vdir(meta.parents[0]).path if meta.parents else start)
    parent_dir = parent_dir if (parent_dir / "rollouts" / "heldout.jsonl").is_file() else None
    with exp.budgets.timed("health"):
        report = health_report(vd.path, compare=parent_dir)
        write_atomic(vd.path / "health.json", report.to_json())
        write_atomic(vd.path / "health.md", report.to_markdown())
    train = vd.rollouts("train")
    meta.metrics.update(
        heldout_accuracy=heldout_accuracy(heldout),          # the gate draw
        selection_accuracy=heldout_accuracy(selection),      # the selection draw: what selection ranks by
        both_draws_accuracy=heldout_accuracy(heldout + selection),   # the untrained model's bar (evolution.start_bar)
        train_reward_mean=sum(r.reward or 0.0 for r in train) / max(1, len(train)),
        cost=sum(r.num_tokens for r in train) / max(1, len(train)),   # generated tokens per rollout
        verify_seconds=verify_seconds,
    )
    working = working_call_rate(selection)
    if working is not None:   # episodes: what breaks a tie in selection_accuracy (loop/stages/selection.py)
        meta.metrics["selection_working_calls"] = working
        live = groups_with_gradient(train, vd.steps())
        if live is not None:  # and then a tie in both: the share of its groups that had a gradient
            meta.metrics["train_live_groups"] = live
    meta.status = Status.VERIFIED
    vd.save_meta(meta)
