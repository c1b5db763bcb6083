"""What a person reads at a human gate (``loop/human/human_gate.py``): for each decision that is open, the
material of its point and the commands that take it, as markdown for ``RUN_DIR/awaiting_decision.md``
and ``evotrainer status``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from evotrainer.config import HUMAN_GATE_POINTS
from evotrainer.loop.stages.gating import gate_line
from evotrainer.records.history import human_records

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment

REQUEST_FILE = "awaiting_decision.md"


@dataclass
class Pending:
    """One open decision: the version it is about, the point it waits at, the generation."""
    version: str
    point: str
    generation: int


def notes_for(exp: Experiment, vid: str) -> list[str]:
    """A person's notes on ``vid``'s diagnosis (revise at diagnosis): operators see them as alerts."""
    return [h.note for h in human_records(exp.state.history)
            if h.point == "diagnosis" and h.version == vid and h.note]


COMMANDS = {
    "diagnosis": "revise RUN ID --note TEXT (a hint the operators see); abort RUN [IDS] --reason TEXT (no "
                 "children from them; all: the run stops)",
    "design": "revise RUN ID --genome FILE [--hypothesis TEXT]; abort RUN [IDS] --reason TEXT",
    "backtest": "revise RUN ID --genome FILE [--hypothesis TEXT] (re-checked and re-backtested); "
                "abort RUN [IDS] --reason TEXT",
    "completion": "revise RUN ID --outcome kept|rejected --reason TEXT (hold back the gate's verdict); "
                  "abort RUN [IDS] --reason TEXT",
}


def request_text(exp: Experiment, waiting: list[Pending]) -> str:
    out = [f"# Awaiting a decision: {exp.run_dir}", ""]
    for point in HUMAN_GATE_POINTS:
        ids = [p for p in waiting if p.point == point]
        if not ids:
            continue
        out += [f"## {point} (generation {ids[0].generation}): {', '.join(p.version for p in ids)}", "",
                f"`evotrainer approve RUN [IDS]`; `evotrainer {COMMANDS[point]}`; then `evotrainer resume RUN` "
                f"(RUN = {exp.run_dir})", ""]
        for p in ids:
            out += [material(exp, p.version, point), ""]
    return "\n".join(out)


def material(exp: Experiment, vid: str, point: str) -> str:
    """What a person needs to decide on ``vid`` at ``point`` (markdown)."""
    vd = exp.vdir(vid)
    meta = vd.meta()
    head = f"### {vid} ({meta.status}; parents {', '.join(meta.parents) or 'none'}; held-out " \
           f"{meta.metrics.get('heldout_accuracy', 'n/a')})"
    if point == "diagnosis":
        health = vd.path / "health.md"
        body = health.read_text()[:4000] if health.is_file() else "(no health report)"
        notes = notes_for(exp, vid)
        return "\n".join([head, "", body] + [f"- person's note: {n}" for n in notes])
    iv = meta.intervention or {}
    lines = [head, "", f"- operator: {meta.operator}; factor: {meta.factor}",
             f"- hypothesis: {iv.get('hypothesis')}",
             f"- expected effect: {json.dumps(iv.get('expected_effect'), default=str)}"]
    if point == "design":
        lines += ["", "```diff", (vd.path / "diff.patch").read_text()[:6000] if (vd.path / "diff.patch").is_file()
                  else iv.get("diff", ""), "```"]
    elif point == "backtest":
        backtest_file = vd.path / "backtest.json"
        if backtest_file.is_file():
            d = json.loads(backtest_file.read_text())
            lines += [f"- backtest: {'ACCEPT' if d.get('accept') else 'REJECT'} (expectation {d.get('expectation_status')})"]
            lines += [f"  - {r}" for r in d.get("reasons") or []]
            keys = list(d.get("after") or {})
            lines += [f"  - {k}: parent {d['before'].get(k)} → child {d['after'].get(k)}" for k in keys[:12]]
        else:
            lines += ["- backtest: none (evolution.backtest is off)"]
    else:   # completion
        d = meta.decision or {}
        lines += [f"- the gate's outcome: {meta.status}; {gate_line(d.get('paired'))}"]
        lines += [f"  - {r}" for r in d.get("reasons") or []]
        lines += [f"- hypothesis verdict: {(meta.hypothesis or {}).get('verdict')}: "
                  f"{(meta.hypothesis or {}).get('reason', '')}"]
    return "\n".join(lines)
