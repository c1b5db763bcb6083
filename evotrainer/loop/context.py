"""The run context: the few things the train and verify stages need of a run.

An :class:`~evotrainer.loop.experiment.Experiment` is one, and so are the stand-ins that train a
version outside a loop run (``training.StandaloneContext``: ``evotrainer train`` and ``rerun``) and
in a worker process (``branch_worker.BranchWorker``: a Ray actor). Typing the stages by this protocol
keeps their hints true for all three and shows what a stage may touch: the config, where each
version's directory is, a way to say what happened, the budgets it spends, the loaded runtime and the
progress display. Selection, gates and proposals, which need the run's state, take the experiment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from evotrainer.config import Config
    from evotrainer.loop.budgets import Budgets
    from evotrainer.loop.progress import NullProgress
    from evotrainer.loop.compute.runtime import Runtime
    from evotrainer.records.version import VersionDir


@runtime_checkable
class RunContext(Protocol):
    cfg: Config
    budgets: Budgets
    runtime: Runtime
    progress: NullProgress

    def vdir(self, vid: str) -> VersionDir: ...

    def say(self, msg: str) -> None: ...
