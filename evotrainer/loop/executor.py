"""The executor seam: where a generation's train and verify stages run (``executor: local | ray``).

The driver (``Experiment``) keeps the state machine: stages, selection, gates, MLflow records, the
run state saved after every version. An executor only decides where ``train_version`` and
``verify_version`` run:

- ``local``: in this process, on the experiment's own ``Runtime``: the train stage trains the live
  versions one after another, then the verify stage verifies them (on vLLM, all in one batch);
- ``ray`` (``loop/ray_executor.py``): each live version's train and verify as one Ray actor call on
  a worker that holds its own ``Runtime`` (base model loaded once per actor), writing into the same
  run directory; the driver merges each worker's spend and messages into the run state.

Both stages are idempotent per version (a version's status says what is done), so either executor
resumes a run without repeating finished work, and a run may be resumed under the other executor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from evotrainer.loop.training import train_version, verify_versions

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment


class Executor(Protocol):
    def train(self, exp: Experiment, vids: list[str]) -> None: ...
    def verify(self, exp: Experiment, vids: list[str]) -> None: ...
    def close(self) -> None: ...


class LocalExecutor:
    """Train and verify in the driver's process, one version at a time."""

    def train(self, exp: Experiment, vids: list[str]) -> None:
        g = exp.state.generation
        for vid in vids:
            if exp.vdir(vid).meta().status == "pending" and not exp.budget_left(vid):
                continue
            exp.say(f"gen {g}: training {vid}")
            train_version(exp, vid)
            exp.save()
            exp.progress.advance()

    def verify(self, exp: Experiment, vids: list[str]) -> None:
        g = exp.state.generation
        for vid in vids:
            exp.say(f"gen {g}: verifying {vid} on {len(exp.runtime.heldout_tasks)} held-out tasks")

        def done(vid: str) -> None:
            exp.save()
            exp.progress.advance()

        verify_versions(exp, vids, on_done=done)

    def close(self) -> None:
        pass


def build_executor(exp: Experiment) -> Executor:
    if exp.cfg.executor == "ray":
        from evotrainer.loop.ray_executor import RayExecutor   # ray is imported only when asked for

        return RayExecutor(exp.cfg, exp.run_dir)
    return LocalExecutor()
