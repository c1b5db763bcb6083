"""What a person reads in the MLflow UI: run names, run descriptions and the experiment's page.

A run's name says what the version is and what became of it (``v0004 · gen 2 · knobs:
learning_rate · promoted 0.417``), so the runs table reads as a genealogy without opening a run;
its description (MLflow's ``mlflow.note.content``, Markdown) says where it came from, what it
changed and why, and what the gate decided with its reasons. The experiment's description is the
leaderboard and points at the genealogy plot logged to the summary run.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from evotrainer.records.version import BranchVersion

NOTE = "mlflow.note.content"        # MLflow's description field, for runs and experiments alike
# MLflow 3 opens an experiment on a GenAI "Overview" (traces, judges) unless it is a classic ML
# experiment. Older 3.x UIs read this experiment tag; 3.17's UI follows a global workflow switch
# that only the ``workflowType`` query parameter (or the sidebar toggle) sets, so ``ui_url`` adds it.
KIND_TAG, KIND = "mlflow.experimentKind", "custom_model_development"
# The runs table a person should see first: sorted by held-out score, with the columns that read as a
# genealogy. MLflow's "share view" stores a table's state as JSON in the experiment tag
# ``mlflow.sharedViewState.<key>`` and loads it from the URL's ``viewStateShareKey``; recording the
# run writes that tag, so ``ui_url`` opens the table already set up.
VIEW_KEY = "evotrainer"
VIEW_TAG = "mlflow.sharedViewState." + VIEW_KEY
COLUMNS = ("metrics.`heldout_accuracy`", "tags.`evotrainer.generation`", "tags.`evotrainer.operator`",
           "tags.`evotrainer.factor`", "tags.`evotrainer.decision`", "tags.`evotrainer.status`",
           "tags.`evotrainer.hypothesis`", "tags.`evotrainer.validity`")


def table_view() -> str:
    return json.dumps({"orderByKey": COLUMNS[0], "orderByAsc": False, "selectedColumns": list(COLUMNS),
                       "runListHidden": False})


def ui_url(experiment_id: str, base: str = "http://127.0.0.1:5000") -> str:
    """The runs table of one experiment, as a classic ML experiment, with the genealogy view applied."""
    query = urlencode({"viewStateShareKey": VIEW_KEY, "workflowType": "machine_learning"})
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{query}"


def experiment_name(run_dir: str | Path) -> str:
    return f"evotrainer:{Path(run_dir).resolve().name}"


def local_experiment_id(run_dir: str | Path) -> str | None:
    """The experiment id in a run's own ``mlflow.db``, read-only (``status`` writes nothing, and
    opening the store through MLflow would create or migrate it); None when not recorded yet."""
    db = Path(run_dir, "mlflow.db")
    if not db.is_file():
        return None
    try:
        with closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)) as con:
            row = con.execute("SELECT experiment_id FROM experiments WHERE name = ?",
                              (experiment_name(run_dir),)).fetchone()
    except sqlite3.Error:
        return None
    return str(row[0]) if row else None


def run_name(v: BranchVersion) -> str:
    what = f"{v.operator}:{(v.factor or '?').split(':', 1)[-1]}" if v.operator else \
        (v.factor or ("continued" if v.parents else "seed"))
    score = v.heldout_accuracy
    fate = "INVALID" if v.is_invalid else v.status
    return f"{v.id} · gen {v.generation} · {what} · {fate}" + (f" {score:.3f}" if score is not None else "")


def run_description(v: BranchVersion) -> str:
    lines = [f"**{v.id}**, generation {v.generation}: "
             + (f"a child by **{v.operator}** changing `{v.factor or '?'}`" if v.operator else
                "a continuation" if v.parents else "the seed")
             + (f" of {', '.join(v.parents)}" if v.parents else "") + "."]
    iv: dict[str, Any] = v.intervention or {}
    if iv.get("hypothesis"):
        lines.append(f"- hypothesis: {iv['hypothesis']}")
    if iv.get("expected_effect"):
        lines.append(f"- expected: {_effect(iv['expected_effect'])}")
    if v.heldout_accuracy is not None:
        base = v.metrics.get("heldout_accuracy_before")
        lines.append(f"- held-out accuracy: {v.heldout_accuracy:.3f}" + (f" (before {base:.3f})" if isinstance(
            base, (int, float)) else ""))
    lines.append(f"- status: **{'INVALID' if v.is_invalid else v.status}**")
    for r in ((v.decision or {}).get("reasons") or [])[:6]:
        lines.append(f"  - {r}")
    for x in v.violations[:6]:
        lines.append(f"  - violation {x.get('name', '?')}: {x.get('message', '')}")
    return "\n".join(lines)


def _effect(e: Any) -> str:
    if isinstance(e, dict):
        return " ".join(str(e[k]) for k in ("metric", "op", "value") if k in e) or str(e)
    return str(e)


def experiment_description(versions: list[BranchVersion], summary_run: str | None,
                           experiment_id: str | None = None) -> str:
    ranked = sorted(versions, key=lambda v: -(v.heldout_accuracy if v.heldout_accuracy is not None else -1))
    lines = [f"{len(versions)} versions, {sum(v.is_invalid for v in versions)} invalid. "
             "Run names read: id · generation · operator:factor · fate held-out score.", "",
             "| version | gen | change | held-out | status |", "|---|---|---|---|---|"]
    for v in ranked:
        score = f"{v.heldout_accuracy:.3f}" if v.heldout_accuracy is not None else "-"
        change = f"{v.operator}/{v.factor}" if v.operator else (v.factor or ("continued" if v.parents else "seed"))
        lines.append(f"| {v.id} | {v.generation} | {change} | {score} | {'INVALID' if v.is_invalid else v.status} |")
    if summary_run:
        lines += ["", f"Genealogy plot: artifacts `genealogy.png` / `genealogy.html` of the run `genealogy` "
                      f"({summary_run})."]
        if experiment_id:       # a link inside the UI itself (the description is rendered as Markdown)
            lines[-1] += (f" [Open it](#/experiments/{experiment_id}/runs/{summary_run}/artifacts/genealogy.png"
                          "?workflowType=machine_learning).")
    return "\n".join(lines)
