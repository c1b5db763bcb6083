"""Task: a prompt, its reference answer and hidden verification data.

A task belongs to one split: ``train`` (the policy learns from it), ``heldout`` (selection:
gates and fitness) or ``test`` (final report only). ``hidden`` holds what the engine verifies with
and what a harness must never see during training (hidden tests, the answer for held-out checks).
``visible`` holds extra fields the policy's prompt may carry (e.g. a planted leak in a test domain).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

SPLITS = ("train", "heldout", "test")


@dataclass(frozen=True)
class Task:
    id: str
    prompt: str
    answer: str
    split: str
    domain: str
    difficulty: int = 0
    hidden: dict[str, Any] = field(default_factory=dict)
    visible: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"Task {self.id!r}: split must be one of {SPLITS}, got {self.split!r}")

    def to_dict(self, include_hidden: bool = True) -> dict[str, Any]:
        d = asdict(self)
        if not include_hidden:
            d.pop("hidden")
            d.pop("answer")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Task":
        return cls(**d)

    def messages(self, system: str | None = None) -> list[dict[str, str]]:
        """Chat messages for this task's prompt."""
        msgs = [{"role": "system", "content": system}] if system else []
        return msgs + [{"role": "user", "content": self.prompt}]


def text_key(text: str) -> str:
    """Identity of a prompt text for split-disjointness checks (whitespace/case-insensitive)."""
    return hashlib.sha256(" ".join(text.lower().split()).encode()).hexdigest()[:16]
