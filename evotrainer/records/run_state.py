"""The loop's state on disk: written atomically after every stage so `evotrainer resume` after
``kill -9`` at any point continues with no version lost or duplicated.

Each version's own progress lives in its version directory (meta.json status: pending → trained →
verified → kept | promoted | rejected | invalid | pruned); this file holds what spans versions:
the generation and stage, the live set, budgets spent, approvals and operator statistics.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from evotrainer.records.history import HistoryRecord, from_dict, to_dict
from evotrainer.records.run_dir import RunDirError
from evotrainer.records.version import read_json, write_atomic

STAGES = ("train", "verify", "gate", "select", "propose")


class Approval(StrEnum):
    """A person's latest decision on a version at a human gate (``loop/human/``)."""
    PENDING = "pending"      # open: the run waits for it
    APPROVED = "approved"
    REVISED = "revised"      # changed by a person; it waits for approve or abort where the point says so
    REJECTED = "rejected"


@dataclass(frozen=True)
class DecisionPoint:
    """Where a version's human decision is taken: the gate point (diagnosis | design | backtest |
    completion) and the generation it belongs to."""
    point: str
    generation: int


@dataclass
class RunState:
    generation: int = 0
    stage: str = "train"
    status: str = "running"            # running | paused | finished | stopped | failed
    stop_reason: str | None = None
    live: list[str] = field(default_factory=list)          # versions to train this generation
    survivors: list[str] = field(default_factory=list)     # selected at the end of this generation
    selection: dict[str, Any] | None = None  # the select stage's saved plan (survivors, reverts, prune)
    exploit_from: int | None = None    # the generation whose selection began the exploit phase (loop/stages/exploit.py)
    next_id: int = 0
    budget_used: dict[str, float] = field(default_factory=lambda: {
        "train_steps": 0, "rollout_tokens": 0, "llm_calls": 0, "llm_tokens": 0, "wall_time_s": 0.0})
    # The human gate (loop/human/human_gate.py): version id -> its latest decision, and version id -> where
    # that decision is taken (a run from before the points may lack the second: human_gate.migrate).
    approvals: dict[str, Approval] = field(default_factory=dict)
    gates: dict[str, DecisionPoint] = field(default_factory=dict)
    operator_stats: dict[str, Any] = field(default_factory=dict)
    history: list[HistoryRecord] = field(default_factory=list)  # proposals, reverts, decisions (records/history.py)
    final: dict[str, Any] | None = None   # the final pick and its test-split score (loop/stages/final_pick.py)
    start: dict[str, Any] | None = None   # the untrained model's held-out scores (loop/stages/start.py)
    events: list[str] = field(default_factory=list)

    def new_id(self) -> str:
        vid = f"v{self.next_id:04d}"
        self.next_id += 1
        return vid

    def log(self, message: str) -> None:
        self.events = (self.events + [message])[-200:]


def state_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "state.json"


def save_state(run_dir: str | Path, state: RunState) -> None:
    data = asdict(state)
    data["history"] = [to_dict(h) for h in state.history]
    write_atomic(state_path(run_dir), json.dumps(data, indent=2, sort_keys=True))


def load_state(run_dir: str | Path) -> RunState:
    path = state_path(run_dir)
    if not path.is_file():
        raise RunDirError(f"{run_dir} is not an evotrainer run directory (state.json missing); "
                          "start one with `evotrainer run CONFIG`")
    data = read_json(path, "the run state")
    known = set(RunState.__dataclass_fields__)
    try:
        state = RunState(**{k: v for k, v in data.items() if k in known})
    except TypeError as e:
        raise RunDirError(f"{path}: not a run state ({e}); restore the file or start a new run") from None
    wrong = _wrong_types(state)
    if not wrong:
        try:
            state.history = [from_dict(h) for h in state.history]
        except (TypeError, ValueError) as e:
            wrong = [f"history: {e}"]
    if not wrong:
        wrong = _typed_decisions(state)
    if wrong:
        raise RunDirError(f"{path}: not a run state ({'; '.join(wrong)}); the file is damaged: restore it, or "
                          "start a new run")
    return state


# The type every field must have: a damaged file is refused on load, naming the field, rather than
# failing later in a comparison.
_TYPES = {"generation": int, "stage": str, "status": str, "stop_reason": (str, type(None)), "live": list,
          "survivors": list, "selection": (dict, type(None)), "exploit_from": (int, type(None)), "next_id": int,
          "budget_used": dict, "approvals": dict, "gates": dict, "operator_stats": dict, "history": list,
          "final": (dict, type(None)), "start": (dict, type(None)), "events": list}


def _wrong_types(state: RunState) -> list[str]:
    out = []
    for name, kind in _TYPES.items():
        value = getattr(state, name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            out.append(f"{name} is {type(value).__name__} {value!r:.40}")
    if isinstance(state.live, list) and isinstance(state.survivors, list) and \
            not all(isinstance(v, str) for v in state.live + state.survivors):
        out.append("live and survivors must list version ids")
    return out


def _typed_decisions(state: RunState) -> list[str]:
    """The human gate's decisions as their types, in place; what is wrong with them otherwise."""
    try:
        state.approvals = {str(v): Approval(a) for v, a in state.approvals.items()}
    except ValueError as e:
        return [f"approvals: {e}; one of {', '.join(a.value for a in Approval)}"]
    points = {}
    for vid, where in state.gates.items():
        point, generation = (where.get("point"), where.get("generation")) if isinstance(where, dict) else (None, None)
        if not isinstance(point, str) or not isinstance(generation, int) or isinstance(generation, bool):
            return [f"gates: {vid} is {where!r:.60}, not a point and a generation"]
        points[vid] = DecisionPoint(point, generation)
    state.gates = points
    return []
