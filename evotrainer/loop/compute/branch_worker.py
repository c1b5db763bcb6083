"""A branch worker: the part of an ``Experiment`` that ``train_version`` and ``verify_version`` use,
in a process of its own (a Ray actor; nothing here imports ray).

It holds its own ``Runtime`` (the base model is loaded on the first version and kept for the next
ones) and reads and writes the run directory the driver names (a shared filesystem). It owns no run
state: what a version spent (steps, tokens, ``*_seconds``) and the messages it said come back in
the result, and the driver merges them into the run state it saves.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from evotrainer.config import Config
from evotrainer.loop.budgets import Budgets
from evotrainer.loop.crash import crash_point
from evotrainer.loop.progress import NullProgress
from evotrainer.loop.compute.runtime import Runtime
from evotrainer.loop.stages.training import train_version, verify_version
from evotrainer.records.run_state import RunState
from evotrainer.records.version import VersionDir

RAISE_ENV = "EVOTRAINER_WORKER_RAISE"   # tests: a worker raises (not dies) on this version id
HANG_ENV = "EVOTRAINER_WORKER_HANG"     # tests: a worker hangs on this version id


class BranchWorkerError(RuntimeError):
    """Raised on purpose by ``EVOTRAINER_WORKER_RAISE`` (tests of the driver's retry)."""


class BranchWorker:
    def __init__(self, cfg_data: dict[str, Any], run_dir: str):
        self.cfg = Config.model_validate(cfg_data)
        self.run_dir = Path(run_dir)
        self.state = RunState()               # a scratch ledger for one version's spend, never saved
        self.budgets = Budgets(self.cfg, self.state)
        self.runtime = Runtime(self.cfg, self.budgets)
        self.progress = NullProgress()
        self._said: list[str] = []

    def vdir(self, vid: str) -> VersionDir:
        return VersionDir(self.run_dir / "versions" / vid)

    def say(self, msg: str) -> None:
        self._said.append(msg)

    def run(self, vid: str) -> dict[str, Any]:
        """Trains (if pending) and verifies (if trained) one version; returns its status, what it
        spent and what it said. A failure leaves the version where the stages' idempotence can
        take it up again (a partial training restarts from the copied adapter)."""
        self.state.budget_used = {}
        self._said = []
        try:
            crash_point(f"worker:{vid}")   # EVOTRAINER_CRASH_AT=worker:<vid>: this process dies here
            if os.environ.get(RAISE_ENV) == vid:
                raise BranchWorkerError(f"{RAISE_ENV}={vid}")
            if os.environ.get(HANG_ENV) == vid:
                time.sleep(86_400)
            train_version(self, vid)
            verify_version(self, vid)
        finally:
            self.runtime.unload_adapter(vid)   # the next version on this worker starts clean
        return {"vid": vid, "status": self.vdir(vid).meta().status, "spent": dict(self.state.budget_used),
                "said": self._said, "pid": os.getpid()}
