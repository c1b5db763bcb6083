"""``executor: ray``: each live version's train and verify as one call on a Ray actor.

Each actor is a ``BranchWorker`` with its own ``Runtime`` (the base model loaded once per actor and
kept across versions and generations) reserving ``ray.num_cpus_per_branch`` CPUs and
``ray.num_gpus_per_branch`` GPUs; it writes the version's files into the run directory (a
filesystem every node shares). The driver keeps everything else: it dispatches versions, merges
each result's spend and messages into the run state and saves it after every version, and records
MLflow itself later (gate stage), so there is one tracking store and the records are those of the
local executor.

Results equal the local executor's: every random draw of training and verification is seeded by
(run seed, version's generation, step), never by what the process ran before, and a fresh actor
builds the base model (and the seed version's fresh adapter) from the same seed as the driver would.

A worker that dies (``kill``, out of memory, ``os._exit``) or raises is replaced and the version is
run again up to ``ray.max_retries`` times (the stages are idempotent: a partial training restarts
from the copied parent adapter), then the version is recorded as rejected with the reason.

Budgets: versions are dispatched while a limit is not reached, counting the train steps of the
versions in flight (each trains k steps), so a ``train_steps`` budget prunes the same versions as
under the local executor; other limits (tokens, wall time) are checked against what has come back,
so they may be overshot by the versions in flight.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evotrainer.config import Config, ConfigError
from evotrainer.loop.compute.branch_worker import BranchWorker
from evotrainer.loop.crash import crash_point
from evotrainer.loop.stages.probes import version_steps
from evotrainer.records.version import Status

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment

log = logging.getLogger(__name__)

FORWARDED_ENV = "EVOTRAINER_"   # the driver's EVOTRAINER_* variables reach its workers (crash hooks)


class RayExecutor:
    def __init__(self, cfg: Config, run_dir: str | Path):
        try:
            import ray
        except ImportError:
            raise ConfigError("field 'executor': executor: ray needs the ray package, which is not installed; "
                              "install the ray extra (pip install -c constraints.txt -e '.[ray]')") from None
        self.ray, self.cfg, self.run_dir = ray, cfg, str(Path(run_dir).resolve())
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(address=cfg.ray.address, log_to_driver=True)
        rc = cfg.ray
        env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV)}
        self._actor_cls = ray.remote(BranchWorker).options(
            num_cpus=rc.num_cpus_per_branch, num_gpus=rc.num_gpus_per_branch, max_restarts=0,
            runtime_env={"env_vars": env} if env else None)
        self._idle: list[Any] = []
        self._actors: list[Any] = []   # every live worker, idle or busy: close() ends them all
        try:
            self.capacity = self._capacity()
        except ConfigError:
            self.close()
            raise

    def _capacity(self) -> int:
        """How many workers the cluster's resources fit (at most ``ray.max_workers``)."""
        rc, have = self.cfg.ray, self.ray.cluster_resources()
        fits = int(have.get("CPU", 0) // rc.num_cpus_per_branch)
        if rc.num_gpus_per_branch:
            fits = min(fits, int(have.get("GPU", 0) // rc.num_gpus_per_branch))
        if fits < 1:
            raise ConfigError(f"field 'ray': the Ray cluster has {have.get('CPU', 0):g} CPUs and {have.get('GPU', 0):g} "
                              f"GPUs, which fit no worker of ray.num_cpus_per_branch={rc.num_cpus_per_branch:g} and "
                              f"ray.num_gpus_per_branch={rc.num_gpus_per_branch:g}; lower them or add nodes")
        return min(fits, rc.max_workers or fits)

    def _worker(self) -> Any:
        if self._idle:
            return self._idle.pop()
        actor = self._actor_cls.remote(self.cfg.model_dump(), self.run_dir)
        self._actors.append(actor)
        return actor

    def _drop(self, actor: Any) -> None:
        self._actors = [a for a in self._actors if a is not actor]
        try:
            self.ray.kill(actor)
        except Exception as e:  # noqa: BLE001 - an actor that is already gone
            log.debug("ray.kill of a dead worker: %s", e)

    # ---- the stages ---------------------------------------------------------------------------
    def train(self, exp: Experiment, vids: list[str]) -> None:
        """Trains and verifies every pending version (the verify stage then has nothing left)."""
        self._dispatch(exp, vids, budgeted=True)

    def verify(self, exp: Experiment, vids: list[str]) -> None:
        """Verifies what is trained and not verified (a run the local executor trained, say)."""
        self._dispatch(exp, vids, budgeted=False)

    def _dispatch(self, exp: Experiment, vids: list[str], budgeted: bool) -> None:
        ray, g = self.ray, exp.state.generation
        todo = (Status.PENDING, Status.TRAINED) if budgeted else (Status.TRAINED,)
        queue, in_flight, attempts = [], {}, {}
        for vid in vids:
            if exp.vdir(vid).meta().status in todo:
                queue.append(vid)
            else:
                exp.progress.advance()   # done already (a resumed run repeats no finished work)
        while queue or in_flight:
            while queue and len(in_flight) < self.capacity:
                vid = queue[0]
                pending = exp.vdir(vid).meta().status == Status.PENDING
                flying = sum(version_steps(exp.cfg, exp.vdir(v).meta()) for v, *_ in in_flight.values())
                if pending and in_flight and exp.budgets.steps_reached_with(flying):
                    break   # decide this one on what the versions in flight spend, as the local executor would
                queue.pop(0)
                if pending and exp.prune_if_budget_spent(vid):
                    exp.progress.advance()
                    continue
                exp.say(f"gen {g}: {'training and verifying' if pending else 'verifying'} {vid} on a Ray worker")
                actor = self._worker()
                in_flight[actor.run.remote(vid)] = (vid, actor, time.monotonic())
            if not in_flight:
                continue
            limit = self.cfg.ray.version_timeout_s
            wait = None if limit is None else max(0.0, min(t0 for *_, t0 in in_flight.values()) + limit - time.monotonic())
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=wait)
            if not ready:   # the oldest version in flight is past its limit: its worker is killed
                ref = min(in_flight, key=lambda r: in_flight[r][2])
                vid, actor, _ = in_flight.pop(ref)
                self._drop(actor)
                self._failed(exp, vid, f"its Ray worker took more than {limit:g} s (ray.version_timeout_s) and was "
                             "killed", attempts, queue)
                continue
            (ref,) = ready
            vid, actor, _ = in_flight.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                self._drop(actor)
                self._failed(exp, vid, f"its Ray worker died ({_first_line(e)})", attempts, queue)
                continue
            except ray.exceptions.RayError as e:   # the worker raised: it lives, the version failed
                self._idle.append(actor)
                self._failed(exp, vid, f"its Ray worker raised {_first_line(e)}", attempts, queue)
                continue
            self._idle.append(actor)
            crash_point("ray:result")   # the version is done on disk, the driver has not merged it yet
            exp.budgets.spend(**result["spent"])
            for msg in result["said"]:
                exp.say(msg)
            exp.say(f"gen {g}: {vid} {result['status']} on Ray worker pid {result['pid']}")
            exp.save()
            exp.progress.advance()

    def _failed(self, exp: Experiment, vid: str, reason: str, attempts: dict[str, int], queue: list[str]) -> None:
        """Runs the version again while retries are left, else records it rejected with the reason."""
        attempts[vid] = attempts.get(vid, 0) + 1
        retries = self.cfg.ray.max_retries
        if attempts[vid] <= retries:
            exp.say(f"{vid}: {reason}; running it again (retry {attempts[vid]} of {retries})")
            queue.insert(0, vid)
            return
        vd = exp.vdir(vid)
        meta = vd.meta()
        meta.status = Status.REJECTED
        meta.decision = {"reasons": [f"worker failed {attempts[vid]} times, last: {reason}"]}
        vd.save_meta(meta)
        exp.say(f"{vid}: rejected: {reason} ({attempts[vid]} attempts)")
        exp.save()
        exp.progress.advance()

    def close(self) -> None:
        """Ends the workers (their models with them), and the Ray cluster this executor started."""
        for actor in list(self._actors):
            self._drop(actor)
        self._idle = []
        if self._owns_ray and self.ray.is_initialized():
            self.ray.shutdown()


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return next((ln for ln in reversed(lines) if "Error" in ln), lines[0] if lines else type(e).__name__)[:300]
