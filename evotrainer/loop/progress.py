"""Progress display of long runs: a rich progress bar per stage and per version's training steps.

The loop reports through a tiny interface so that library users get silence by default and the
CLI gets bars; ``RichProgress`` is used by ``evotrainer run`` and ``resume``.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class NullProgress:
    def stage(self, description: str, total: int) -> None: ...
    def advance(self) -> None: ...
    def steps(self, description: str, total: int) -> None: ...
    def step(self) -> None: ...
    def close(self) -> None: ...


class RichProgress(NullProgress):
    def __init__(self, console: Console | None = None) -> None:
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=console, transient=False)
        self.bar.start()
        self._stage = self._steps = None

    def stage(self, description: str, total: int) -> None:
        if self._stage is not None:
            self.bar.update(self._stage, visible=False)
        self._stage = self.bar.add_task(description, total=max(total, 1))

    def advance(self) -> None:
        if self._stage is not None:
            self.bar.advance(self._stage)

    def steps(self, description: str, total: int) -> None:
        if self._steps is not None:
            self.bar.remove_task(self._steps)
        self._steps = self.bar.add_task(f"  {description}", total=max(total, 1))

    def step(self) -> None:
        if self._steps is not None:
            self.bar.advance(self._steps)

    def close(self) -> None:
        self.bar.stop()
