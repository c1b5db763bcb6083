"""Branch versions on disk: an immutable policy version and everything needed to judge it.

A version directory holds::

    meta.json            id, base model, genome hash, parents, intervention, metrics, status
    genome.py            the harness program it trained under
    adapter/             the LoRA adapter (peft format)
    rollouts/train.jsonl, rollouts/heldout.jsonl   the rollout cache
    steps.jsonl          per-step training metrics

Files are written atomically (temp file + rename) so a crash never leaves a half-written record.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Iterable, Iterator

from evotrainer.records.rollout import Rollout, load_rollouts
from evotrainer.records.run_dir import RunDirError


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)   # no stray temporary file beside the one that was not written
        raise


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path``'s sibling ``.lock`` file across processes, for a
    read-modify-write of a file several writers share (released when the lock file closes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from ``path``; a truncated or garbled file is an error that names it."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise RunDirError(f"{path}: cannot read {what} ({e}); the file is damaged or truncated: "
                         "restore it, or start a new run") from None
    if not isinstance(data, dict):
        raise RunDirError(f"{path}: {what} must be a JSON object, got {type(data).__name__}")
    return data


class Status(str, Enum):
    """Where a version is in its life, as ``meta.json`` stores it (the plain value: a Status compares
    equal to its string, so records read back compare the same way)."""

    PENDING = "pending"                       # created (a seed, a child, a continuation), not trained yet
    AWAITING_APPROVAL = "awaiting_approval"   # a human gate holds it before training
    TRAINED = "trained"                       # trained; held-out verification next
    VERIFIED = "verified"                     # verified and reported on; the gate next
    PROMOTED = "promoted"                     # the gate: better than its control, and valid
    KEPT = "kept"                             # the gate: a tie that lives on as a branch of its own
    REJECTED = "rejected"                     # the gate refused it, or its harness failed
    INVALID = "invalid"                       # a validity check marked it: never promoted
    PRUNED = "pruned"                         # selection (or a spent budget) ended its line

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


SETTLED = (Status.KEPT, Status.PROMOTED)      # gated versions that may live on


@dataclass
class BranchVersion:
    id: str
    base_model: str
    genome_hash: str
    parents: list[str] = field(default_factory=list)
    intervention: dict[str, Any] | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    status: Status = Status.TRAINED
    created: float = field(default_factory=time.time)
    generation: int = 0
    operator: str | None = None        # the operator that proposed its intervention (None for seeds)
    factor: str | None = None          # the single factor changed, e.g. "knob:learning_rate", "hook:reward"
    decision: dict[str, Any] | None = None   # the gate's decision record (numbers and reasons)
    violations: list[dict[str, Any]] = field(default_factory=list)  # validity findings (invalid if any)
    knobs: dict[str, Any] = field(default_factory=dict)              # the recipe knob values it trained with
    hypothesis: dict[str, Any] | None = None   # its intervention's expected effect, judged after training
    steps: int | None = None        # training steps it takes (None: evolution.steps_per_generation; a probe takes fewer)
    first_step: int | None = None   # its first step in the run's task schedule (None: generation × steps_per_generation)

    def __post_init__(self) -> None:
        try:
            self.status = Status(self.status)
        except ValueError:
            raise ValueError(f"version {self.id}: status {self.status!r} is not one of "
                             f"{', '.join(s.value for s in Status)}") from None

    @property
    def is_invalid(self) -> bool:
        """Marked invalid by a gate or a validity finding: never promoted, whatever it scores."""
        return bool(self.violations) or self.status == Status.INVALID

    @property
    def heldout_accuracy(self) -> float | None:
        """The fitness: held-out accuracy, once verified (None before)."""
        x = self.metrics.get("heldout_accuracy")
        return float(x) if isinstance(x, (int, float)) else None

    @classmethod
    def load(cls, version_dir: str | Path) -> "BranchVersion":
        path = Path(version_dir) / "meta.json"
        if not path.is_file():
            raise RunDirError(f"{version_dir} is not a branch version directory (meta.json missing)")
        data = read_json(path, "a version's record")
        known = set(cls.__dataclass_fields__)
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except (TypeError, ValueError) as e:
            raise RunDirError(f"{path}: not a version record ({e})") from None


class VersionDir:
    """Reads and writes one version directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @property
    def adapter_dir(self) -> Path:
        return self.path / "adapter"

    def rollouts_path(self, split: str) -> Path:
        return self.path / "rollouts" / f"{split}.jsonl"

    def save_meta(self, version: BranchVersion) -> None:
        write_atomic(self.path / "meta.json", json.dumps(asdict(version), indent=2, sort_keys=True))

    def meta(self) -> BranchVersion:
        return BranchVersion.load(self.path)

    def save_genome(self, source: str) -> None:
        write_atomic(self.path / "genome.py", source)

    def genome_source(self) -> str:
        return (self.path / "genome.py").read_text()

    def save_rollouts(self, split: str, rollouts: Iterable[Rollout]) -> None:
        lines = "".join(json.dumps(r.to_dict()) + "\n" for r in rollouts)
        write_atomic(self.rollouts_path(split), lines)

    def rollouts(self, split: str) -> list[Rollout]:
        path = self.rollouts_path(split)
        return load_rollouts(path) if path.is_file() else []

    def save_engine_violations(self, violations: list[str]) -> None:
        """What the engine caught the harness doing while it trained (a curriculum that picked a
        non-train task, ...): the gate marks such a version invalid."""
        write_atomic(self.path / "engine_violations.json", json.dumps(violations, indent=2))

    def engine_violations(self) -> list[str]:
        path = self.path / "engine_violations.json"
        return list(json.loads(path.read_text())) if path.is_file() else []

    def append_step(self, metrics: dict[str, Any]) -> None:
        path = self.path / "steps.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(metrics) + "\n")

    def steps(self) -> list[dict[str, Any]]:
        path = self.path / "steps.jsonl"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
