"""Domain: a task source plus a verifier (plus, later, an environment for agentic tasks).

The engine talks to every domain through this small interface: ``tasks(split)`` for the task lists
and ``verify(task, completion)`` for the verdict on one completion. The verdict is the *visible*
outcome (``correct``, ``format_ok``, ``extracted``, ...); whether it may be shown to a harness is the
engine's decision by split (train: visible; heldout/test: stored as the rollout's hidden outcome).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from evotrainer.domains.task import SPLITS, Task


class Domain(ABC):
    """Base class of task domains (math, code, swe). Subclasses set ``name`` and implement
    ``tasks`` and ``verify``; ``verify_batch`` loops by default and may be overridden."""

    name: str = "domain"

    @abstractmethod
    def tasks(self, split: str) -> list[Task]:
        """The tasks of one split."""

    @abstractmethod
    def verify(self, task: Task, completion: str) -> dict[str, Any]:
        """The verifier's verdict on one completion: correct, format_ok, extracted, ..."""

    def verify_batch(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[dict[str, Any]]:
        if len(tasks) != len(completions):
            raise ValueError(f"{self.name}: {len(tasks)} tasks but {len(completions)} completions")
        return [self.verify(t, c) for t, c in zip(tasks, completions)]

    def reference_completion(self, task: Task) -> str | None:
        """A completion the verifier accepts, in the form the prompt asks for (what the policy's
        log-likelihood of the answer is taken of), or None where the domain has none to offer."""
        return None

    def task_by_id(self, task_id: str) -> Task:
        for split in SPLITS:
            for t in self.tasks(split):
                if t.id == task_id:
                    return t
        raise KeyError(f"{self.name}: no task with id {task_id!r}")

    def __repr__(self) -> str:
        sizes = ", ".join(f"{s}={len(self.tasks(s))}" for s in SPLITS)
        return f"{type(self).__name__}({sizes})"
