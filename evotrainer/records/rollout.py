"""Rollout and Group: one trajectory, and the rollouts of one task in one step.

A rollout is plain data, serialisable to one JSON line, so that it can be cached to disk per
branch version and handed to a sandboxed harness. ``visible`` is the outcome training may see
(the verifier's verdict on a train task: ``correct``, ``format_ok``, ``extracted``); ``hidden`` is
held-out verification and is stripped (``for_harness``) before a harness sees a rollout in training.

Multi-turn rollouts (episodes, ``policy/episodes.py``) use the same record: ``prompt_ids`` is the
opening, ``completion_ids`` the whole token trajectory after it (assistant turns and the tokens the
environment inserted between them: turn ends, tool results, the next turn's header), and
``completion_mask`` marks with 1 the tokens the policy sampled. ``logprobs`` holds the sampler's
logprobs of those sampled tokens only, in order (``len(logprobs) == sum(completion_mask)``).
``turn_log`` has one entry per turn (text, tool call, result, timings, its token ``span`` in
``completion_ids``) and ``episode`` the episode's outcome (stop reason, submitted patch, history
calls). Single-turn rollouts leave these empty: an empty mask means every completion token was
sampled, so records written before episodes existed load and train unchanged.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence


@dataclass
class Rollout:
    task_id: str
    messages: list[dict[str, str]]          # the prompt as chat messages (and later turns)
    completion: str                         # decoded completion text of the last turn
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)   # sampler log p of each completion token
    truncated: bool = False                 # hit max_new_tokens without a stop (episode: ran out of a limit)
    stop_reason: str = "eos"                # "eos" | "stop_string" | "length" (episode: "submitted", "max_turns", ...)
    turns: int = 1
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    gen_seconds: float = 0.0
    seed: int | None = None
    group: int = 0                          # index of its group within the step
    step: int = 0
    split: str = "train"
    visible: dict[str, Any] = field(default_factory=dict)
    hidden: dict[str, Any] = field(default_factory=dict)
    completion_mask: list[int] = field(default_factory=list)  # 1: sampled by the policy; empty: all
    turn_log: list[dict[str, Any]] = field(default_factory=list)   # per turn of an episode
    episode: dict[str, Any] = field(default_factory=dict)          # an episode's outcome
    reward: float | None = None             # shaped reward given by the harness (train rollouts)
    advantage: float | None = None          # advantage used in the update (None: group filtered out)

    @property
    def num_tokens(self) -> int:
        """Tokens the policy generated (an episode's tool results and turn headers not counted)."""
        return sum(self.completion_mask) if self.completion_mask else len(self.completion_ids)

    def sampled_mask(self) -> list[int]:
        """1 for each completion token the policy sampled; checks the record is consistent."""
        mask = list(self.completion_mask) or [1] * len(self.completion_ids)
        if len(mask) != len(self.completion_ids) or sum(mask) != len(self.logprobs):
            raise ValueError(f"rollout {self.task_id!r} (step {self.step}, group {self.group}): "
                             f"{len(self.completion_ids)} completion tokens, a mask of {len(mask)} with "
                             f"{sum(mask)} sampled, and {len(self.logprobs)} logprobs; they must agree")
        return mask

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def for_harness(self) -> dict[str, Any]:
        """The rollout as a harness sees it during training: no hidden outcome."""
        d = asdict(self)
        d.pop("hidden")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Rollout":
        return cls(**d)


@dataclass
class Group:
    """The rollouts of one task in one step (a GRPO group)."""

    task_id: str
    rollouts: list[Rollout]

    def __len__(self) -> int:
        return len(self.rollouts)


def group_rollouts(rollouts: Iterable[Rollout]) -> list[Group]:
    """Groups rollouts by (step, group index), in first-seen order."""
    groups: dict[tuple[int, int], Group] = {}
    for r in rollouts:
        key = (r.step, r.group)
        if key not in groups:
            groups[key] = Group(r.task_id, [])
        groups[key].rollouts.append(r)
    return list(groups.values())


def last_steps(rollouts: Sequence[Rollout], window: int) -> list[Rollout]:
    """The rollouts of the last ``window`` training steps (all of them for ``window <= 0``)."""
    steps = sorted({r.step for r in rollouts})
    keep = set(steps[-window:]) if window > 0 else set(steps)
    return [r for r in rollouts if r.step in keep]


def save_rollouts(path: str | Path, rollouts: Iterable[Rollout]) -> int:
    """Appends rollouts as JSON lines; returns how many were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("a", encoding="utf-8") as f:
        for r in rollouts:
            f.write(json.dumps(r.to_dict()) + "\n")
            n += 1
    return n


def load_rollouts(path: str | Path) -> list[Rollout]:
    return list(iter_rollouts(path))


class RolloutFileError(ValueError):
    """A rollouts file with a line that is not a rollout record (the message names file and line)."""


def iter_rollouts(path: str | Path) -> Iterator[Rollout]:
    path = Path(path)
    with path.open(encoding="utf-8") as f:
        lineno = 0
        try:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield Rollout.from_dict(json.loads(line))
                except (json.JSONDecodeError, TypeError) as e:
                    raise RolloutFileError(f"{path}:{lineno}: not a rollout record ({e})") from e
        except UnicodeDecodeError as e:
            raise RolloutFileError(f"{path}:{lineno + 1}: not UTF-8 text ({e.reason}); rollouts are JSON lines") from None
