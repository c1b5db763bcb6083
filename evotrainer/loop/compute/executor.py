"""The executor seam: where a generation's train and verify stages run (``executor: local | ray``).

The driver (``Experiment``) keeps the state machine: stages, selection, gates, MLflow records, the
run state saved after every version. An executor only decides where ``train_version`` and
``verify_version`` run:

- ``local``: in this process, on the experiment's own ``Runtime``: the train stage trains the live
  versions in lock step, their rollouts in one batch per step (every engine serves several adapters
  in one call: vLLM multi-LoRA, the transformers engine's KV decoder per-row adapters; an episodic
  domain's episodes turn by turn in one call on the transformers engine, one version after another on
  vLLM), then the verify stage verifies them in one batch;
- ``ray`` (``loop/compute/ray_executor.py``): each live version's train and verify as one Ray actor call on
  a worker that holds its own ``Runtime`` (base model loaded once per actor), writing into the same
  run directory; the driver merges each worker's spend and messages into the run state.

Both stages are idempotent per version (a version's status says what is done), so either executor
resumes a run without repeating finished work, and a run may be resumed under the other executor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from evotrainer.loop.stages.probes import version_steps
from evotrainer.loop.stages.training import train_version, train_versions, verify_versions
from evotrainer.policy.collect import shares_batches
from evotrainer.records.version import Status

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment


class Executor(Protocol):
    def train(self, exp: Experiment, vids: list[str]) -> None: ...
    def verify(self, exp: Experiment, vids: list[str]) -> None: ...
    def close(self) -> None: ...


class LocalExecutor:
    """Train and verify in the driver's process: one version after another, or, on an engine that
    serves several adapters in one call (vLLM, the transformers engine), the pending versions together
    in lock step."""

    def train(self, exp: Experiment, vids: list[str]) -> None:
        g = exp.state.generation
        pending = [v for v in vids if exp.vdir(v).meta().status == Status.PENDING]
        if len(pending) > 1 and shares_batches(exp.runtime.engine, exp.runtime.domain, len(pending)):
            self._train_together(exp, pending)
        for vid in vids:   # the rest one at a time: already done, or left when the batch started
            if exp.vdir(vid).meta().status == Status.PENDING:
                if exp.prune_if_budget_spent(vid):
                    continue
                exp.say(f"gen {g}: training {vid}")
                train_version(exp, vid)
                exp.save()
            exp.progress.advance()

    def _train_together(self, exp: Experiment, pending: list[str]) -> None:
        """The versions that the budget lets start, as starting them one by one would decide (the
        others are left to the one-at-a-time path, which prunes them with the reason)."""
        together = []
        for vid in pending:
            if together and exp.budgets.steps_reached_with(sum(version_steps(exp.cfg, exp.vdir(v).meta())
                                                               for v in together)):
                break
            if exp.prune_if_budget_spent(vid):
                return
            together.append(vid)
        if len(together) < 2:
            return
        exp.say(f"gen {exp.state.generation}: training {', '.join(together)} together "
                f"(their rollouts sampled in one batch per step)")
        train_versions(exp, together)
        exp.save()

    def verify(self, exp: Experiment, vids: list[str]) -> None:
        g = exp.state.generation
        for vid in vids:   # what verify_versions verifies: a version pruned untrained is not
            if exp.vdir(vid).meta().status == Status.TRAINED:
                exp.say(f"gen {g}: verifying {vid} on {len(exp.runtime.heldout_tasks)} held-out tasks")

        def done(vid: str) -> None:
            exp.save()
            exp.progress.advance()

        verify_versions(exp, vids, on_done=done)

    def close(self) -> None:
        pass


def build_executor(exp: Experiment) -> Executor:
    if exp.cfg.executor == "ray":
        from evotrainer.loop.compute.ray_executor import RayExecutor   # ray is imported only when asked for

        return RayExecutor(exp.cfg, exp.run_dir)
    return LocalExecutor()
