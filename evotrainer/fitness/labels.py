"""Labelled history: branches and rollouts known to be (in)valid, the diagnostic gaps, and scoring.

Diagnostics evolve like the rest of a harness, so they need a fitness of their own: how many known
invalid cases does a harness's ``validity`` (and ``alerts``) flag, and how many valid ones does it
flag wrongly? The labels come from the engine (a gate found a branch invalid: leak used, held-out
failure behind high training reward, tampered cache) or from a person. When a gate finds a branch
invalid that the branch's own validity checks did not flag, a ``DiagnosticGap`` is recorded: the
evidence operators get when they are asked to extend the diagnostics.

The store is one JSON file (written atomically). Labels point into version dirs, which are immutable,
rather than copying rollouts.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evotrainer.fitness.cache import CachedVersion
from evotrainer.fitness.leak import leak_used_by
from evotrainer.genome.harness import Harness
from evotrainer.records.rollout import Rollout, group_rollouts
from evotrainer.records.version import VersionDir, exclusive, write_atomic

if TYPE_CHECKING:
    from evotrainer.fitness.gates import GateDecision
    from evotrainer.fitness.health import HealthReport
    from evotrainer.fitness.validity import Check


@dataclass
class BranchLabel:
    path: str                       # the version dir
    invalid: bool
    reasons: list[str] = field(default_factory=list)
    source: str = "gate"            # gate | user
    genome_hash: str = ""
    time: float = field(default_factory=time.time)


@dataclass
class RolloutLabel:
    path: str                       # the version dir
    split: str
    index: int                      # line of the rollout in rollouts/<split>.jsonl
    invalid: bool
    reason: str = ""


@dataclass
class DiagnosticGap:
    """An invalid branch that no validity check of its harness flagged."""

    path: str
    genome_hash: str
    engine_checks: list[str]        # the engine checks that found it invalid
    evidence: dict[str, Any]        # their numbers
    harness_alerts: list[str]       # what the harness did say (names), for context
    suggestion: str
    time: float = field(default_factory=time.time)


@dataclass
class LabelledCase:
    """One unit a diagnostic is scored on: a batch of rollouts (a branch's, or a single rollout)."""

    name: str
    rollouts: list[Rollout]
    invalid: bool
    reason: str = ""


class LabelStoreError(ValueError):
    """A labels file that is not a label store (the message names it and says nothing changed)."""


class LabelStore:
    """Every change is a read-modify-write under a file lock, reloading first: a running loop and
    ``evotrainer gate --record`` may write the same store, and neither may lose the other's labels."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.load()

    def load(self) -> None:
        """Reads the store; a file that is not one is refused (and so never rewritten)."""
        if self.path.exists() and not self.path.is_file():
            raise LabelStoreError(f"labels file {self.path} is a directory; name a JSON file")
        fix = "nothing was changed; name another file, or fix or move this one aside"
        try:
            d = json.loads(self.path.read_text(encoding="utf-8")) if self.path.is_file() else {}
        except (ValueError, UnicodeDecodeError) as e:
            raise LabelStoreError(f"labels file {self.path} is not valid JSON ({e}); {fix}") from None
        kinds = {"branches": BranchLabel, "rollouts": RolloutLabel, "gaps": DiagnosticGap}
        if not isinstance(d, dict) or set(d) - set(kinds) or not all(isinstance(d.get(k, []), list) for k in kinds):
            raise LabelStoreError(f"labels file {self.path} is not a label store (expected an object of lists "
                                  f"{', '.join(kinds)}); {fix}")
        try:
            parsed = {k: [cls(**x) for x in d.get(k, [])] for k, cls in kinds.items()}
        except TypeError as e:
            raise LabelStoreError(f"labels file {self.path} holds a record that is not a label ({e}); {fix}") from None
        self.branches: list[BranchLabel] = parsed["branches"]
        self.rollouts: list[RolloutLabel] = parsed["rollouts"]
        self.gaps: list[DiagnosticGap] = parsed["gaps"]

    def save(self) -> None:
        d = {"branches": [asdict(x) for x in self.branches], "rollouts": [asdict(x) for x in self.rollouts],
             "gaps": [asdict(x) for x in self.gaps]}
        write_atomic(self.path, json.dumps(d, indent=2))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with exclusive(self.path):
            self.load()
            yield
            self.save()

    def label_branch(self, label: BranchLabel) -> None:
        """Adds (or replaces: the latest verdict on a version wins) a branch label, and saves."""
        with self._locked():
            self.branches = [b for b in self.branches if b.path != label.path] + [label]

    def label_rollouts(self, labels: Sequence[RolloutLabel]) -> None:
        keys = {(x.path, x.split, x.index) for x in labels}
        with self._locked():
            self.rollouts = [x for x in self.rollouts if (x.path, x.split, x.index) not in keys] + list(labels)

    def record_gap(self, gap: DiagnosticGap) -> None:
        with self._locked():
            self.gaps.append(gap)

    def cases(self, max_rollout_cases: int = 200) -> list[LabelledCase]:
        """Labels materialised from their version dirs (labels whose dir is gone are skipped). Every
        branch label is used; rollout labels are capped (a seeded sample, half invalid and half valid
        where there are enough) because each case costs a few sandbox round trips."""
        out, cache = [], {}

        def rollouts(path: str, split: str) -> list[Rollout]:
            if (path, split) not in cache:
                cache[path, split] = VersionDir(path).rollouts(split) if Path(path).is_dir() else []
            return cache[path, split]

        for b in self.branches:
            rs = rollouts(b.path, "train")
            if rs:
                out.append(LabelledCase(f"branch {b.path}", rs, b.invalid, "; ".join(b.reasons)))
        half = max_rollout_cases // 2
        bad = [x for x in self.rollouts if x.invalid]
        good = [x for x in self.rollouts if not x.invalid]
        rng = random.Random(0)
        n_bad = min(len(bad), max(half, max_rollout_cases - len(good)))
        picked = rng.sample(bad, n_bad) + rng.sample(good, min(len(good), max_rollout_cases - n_bad))
        for x in picked:
            rs = rollouts(x.path, x.split)
            if 0 <= x.index < len(rs):
                out.append(LabelledCase(f"rollout {x.path}:{x.split}:{x.index}", [rs[x.index]], x.invalid, x.reason))
        return out


# ---- scoring ---------------------------------------------------------------------------------------
@dataclass
class HookScore:
    recall: float | None            # flagged invalid / invalid (None: no invalid case)
    fpr: float | None               # flagged valid / valid (None: no valid case)
    flagged_invalid: int
    invalid: int
    flagged_valid: int
    valid: int
    missed: list[str] = field(default_factory=list)       # invalid cases not flagged
    false_alarms: list[str] = field(default_factory=list)


@dataclass
class DiagnosticsScore:
    validity: HookScore
    alerts: HookScore               # "flagged" = at least one critical alert
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _score(flags: list[bool], cases: Sequence[LabelledCase]) -> HookScore:
    inv = [(f, c) for f, c in zip(flags, cases) if c.invalid]
    val = [(f, c) for f, c in zip(flags, cases) if not c.invalid]
    fi, fv = sum(f for f, _ in inv), sum(f for f, _ in val)
    return HookScore(recall=fi / len(inv) if inv else None, fpr=fv / len(val) if val else None,
                     flagged_invalid=fi, invalid=len(inv), flagged_valid=fv, valid=len(val),
                     missed=[c.name for f, c in inv if not f][:20], false_alarms=[c.name for f, c in val if f][:20])


def score_diagnostics(harness: Harness, cases: Sequence[LabelledCase]) -> DiagnosticsScore:
    """Runs the harness's metrics → validity/alerts on each case alone (in its sandbox) and scores
    the flags against the labels. A hook that fails on a case counts as not flagging it."""
    vflags, aflags, errors = [], [], []
    for case in cases:
        try:
            m = harness.metrics(case.rollouts, group_rollouts(case.rollouts))
            vflags.append(bool(harness.validity(case.rollouts, m, [])))
            aflags.append(any(a["severity"] == "critical" for a in harness.alerts(m, [])))
        except Exception as e:  # noqa: BLE001 - a diagnostic that crashes flags nothing
            errors.append(f"{case.name}: {type(e).__name__}: {e}")
            vflags.append(False)
            aflags.append(False)
    return DiagnosticsScore(_score(vflags, cases), _score(aflags, cases), errors[:20])


# ---- a gate's verdict as labelled history ---------------------------------------------------------
def record_verdict(labels: LabelStore, v: CachedVersion, d: GateDecision, failed: list[Check],
                   report: HealthReport) -> None:
    """The verdict becomes labelled history; an engine-found invalidity the harness missed is a gap."""
    genome_hash = v.meta.genome_hash if v.meta else v.program.hash
    labels.label_branch(BranchLabel(str(v.path), not d.valid, [r for r in d.reasons if "paired" not in r],
                                    "gate", genome_hash))
    if any(c.name == "leak_used" for c in failed):  # the leak says which rollouts cheated
        marks = []
        for i, r in enumerate(v.train):
            leak = v.leak_of(r)
            if leak is not None:
                used = leak_used_by(leak, r)
                marks.append(RolloutLabel(str(v.path), "train", i, used, "leak_used" if used else "leak not used"))
            else:
                marks.append(RolloutLabel(str(v.path), "train", i, False, "clean prompt"))
        labels.label_rollouts(marks)
    if failed and not d.harness_violations:
        gap = DiagnosticGap(str(v.path), genome_hash, [c.name for c in failed], {c.name: c.numbers for c in failed},
                            [a["name"] for a in report.alerts if a.get("source") == "harness"], _suggest(failed))
        labels.record_gap(gap)
        d.gap = asdict(gap)


def _suggest(failed: list[Check]) -> str:
    names = {c.name for c in failed}
    if "leak_used" in names and any(c.numbers.get("history_read_rate") for c in failed if c.name == "leak_used"):
        return ("extend validity: count the git-history commands of each episode (git_log, git log/show, "
                "reading .git) and flag a batch whose resolved episodes read a history that showed a diff")
    if "leak_used" in names:
        return ("extend validity: flag completions that repeat information only training prompts carry "
                "(e.g. a number given in a note of the prompt)")
    if names & {"train_heldout_divergence", "reward_hacking"}:
        return ("extend validity/alerts: flag training success that held-out verification does not confirm "
                "(a shaped reward or correctness rising without held-out gains)")
    return "extend validity: add a check that would have flagged " + ", ".join(sorted(names))
