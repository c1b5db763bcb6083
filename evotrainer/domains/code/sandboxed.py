"""A domain whose verdicts come from running programs in the code executor's isolated workers.

The code and SWE domains both grade this way: one pool of warm workers per domain, started on the
first verdict (listing tasks never starts one) and closed with the domain.
"""

from __future__ import annotations

from typing import Any

from evotrainer.domains.base import Domain
from evotrainer.domains.code.executor import CodeExecutor, ExecLimits
from evotrainer.domains.task import Task


class SandboxedDomain(Domain):
    def __init__(self, workers: int | None = None, limits: ExecLimits | None = None) -> None:
        self._workers, self._limits = workers, limits
        self._executor: CodeExecutor | None = None

    @property
    def executor(self) -> CodeExecutor:
        if self._executor is None:
            self._executor = CodeExecutor(self._workers, self._limits)
        return self._executor

    def close(self) -> None:
        if self._executor is not None:
            self._executor.close()
            self._executor = None

    def verify(self, task: Task, completion: str) -> dict[str, Any]:
        return self.verify_batch([task], [completion])[0]   # one executor run, as for a batch
