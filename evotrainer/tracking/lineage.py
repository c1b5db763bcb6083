"""Lineage in MLflow: one experiment per run directory, one MLflow run per branch version.

``LineageTracker(run_dir).record(version_dir)`` mirrors a version directory into MLflow:

* params = the version's knobs; metrics = every numeric field of ``steps.jsonl`` at its step, and the
  version's own metrics (held-out accuracy, ...) at the last step;
* tags = ``evotrainer.*`` lineage (generation, operator, factor, validity, decision, status, all parents)
  and ``mlflow.parentRunId`` = the first parent's run, so the MLflow UI nests children under parents;
* artifacts = genome.py, meta.json and the optional records (diff, intervention, health, backtest, decision);
* a run name and description (``tracking/view.py``) that say what the version is and what was decided,
  and, with the plots, an experiment description holding the leaderboard.

Recording is idempotent because a resumed loop calls it again for versions it recorded before a crash:
the run is found by its ``evotrainer.version_id`` tag (set in the same call that creates the run, so a
crash can never leave a run without it), params already there are not re-sent, step metrics carry
deterministic timestamps and a watermark tag (re-sending a step is a no-op in MLflow's SQL store), and a
version metric is only logged when its value changed. Only ``MlflowClient`` is used: no global active
run, so the loop may record any number of versions in any order.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from evotrainer.records.version import BranchVersion, VersionDir
from evotrainer.tracking.plots import fitness_plot, genealogy_plot, load_versions
from evotrainer.tracking.store import ensure_sqlite_store
from evotrainer.tracking.view import (KIND, KIND_TAG, NOTE, VIEW_TAG, experiment_description, run_description,
                                      run_name, table_view)
from evotrainer.tracking.view import experiment_name as view_experiment_name

TAG = "evotrainer."
VERSION_TAG = TAG + "version_id"
SUMMARY_TAG = TAG + "summary"
ARTIFACTS = ("genome.py", "meta.json", "diff.patch", "intervention.json", "health.md", "health.json",
             "backtest.json", "decision.json")
_BATCH = 900            # MLflow accepts at most 1000 metrics per log_batch

# Creating the sqlite store prints alembic migration lines; they say nothing to a user of a run.
for _name in ("alembic", "alembic.runtime.migration", "mlflow.store.db.utils"):
    logging.getLogger(_name).setLevel(logging.WARNING)


def decision_label(decision: dict[str, Any] | None) -> str:
    """One word for the gate's decision record (the full record is the decision.json artifact)."""
    if not decision:
        return "pending"
    for key in ("action", "decision", "verdict"):
        if isinstance(decision.get(key), str):
            return decision[key]
    if "promote" in decision:
        if decision["promote"]:
            return "promote"
        return "invalid" if decision.get("valid") is False else "refuse"
    return "recorded"


def _key(name: str) -> str:
    """MLflow names allow letters, digits, ``_ - . / :`` and spaces only."""
    return re.sub(r"[^\w\-./: ]", "_", str(name))[:250]


def _number(x: Any) -> float | None:
    if isinstance(x, bool):
        return float(x)
    if isinstance(x, (int, float)) and math.isfinite(float(x)):   # NaN/inf stay in steps.jsonl
        return float(x)
    return None


class LineageTracker:
    def __init__(self, run_dir: str | Path, experiment_name: str | None = None, tracking_uri: str | None = None,
                 say: Callable[[str], None] = lambda msg: None):
        # mlflow takes seconds to import: only when a run is recorded
        from mlflow import MlflowClient

        # Against a server MLflow prints "View run at <url>" to stdout on every finished run, which
        # would interleave with the loop's progress output; a user who wants it can set the variable.
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        self.run_dir = Path(run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if tracking_uri is None:
            ensure_sqlite_store(self.run_dir / "mlflow.db", say)
        self.tracking_uri = tracking_uri or f"sqlite:///{self.run_dir / 'mlflow.db'}"
        self.experiment_name = experiment_name or view_experiment_name(self.run_dir)
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self._runs: dict[str, str] = {}          # version id -> run id (cache of tag look-ups)
        self._recording: set[str] = set()
        exp = self.client.get_experiment_by_name(self.experiment_name)
        if exp is None:
            # A local store keeps artifacts inside the run directory; a server decides for itself.
            local = self.tracking_uri.startswith(("sqlite:", "file:")) or "://" not in self.tracking_uri
            location = (self.run_dir / "mlartifacts").as_uri() if local else None
            self.experiment_id = self.client.create_experiment(
                self.experiment_name, artifact_location=location,
                tags={TAG + "run_dir": str(self.run_dir), KIND_TAG: KIND, VIEW_TAG: table_view()})
        else:
            self.experiment_id = exp.experiment_id
            # an experiment recorded before these tags existed, or a view the code has changed since
            for key, value in ((KIND_TAG, KIND), (VIEW_TAG, table_view())):
                if exp.tags.get(key) != value:
                    self.client.set_experiment_tag(self.experiment_id, key, value)

    # ---- look-ups ------------------------------------------------------------------------------------
    def _find(self, tag: str, value: str) -> str | None:
        runs = self.client.search_runs([self.experiment_id], filter_string=f"tags.`{tag}` = '{value}'",
                                       max_results=2)
        return runs[0].info.run_id if runs else None

    def run_id(self, version_id: str) -> str | None:
        """The MLflow run of a version, or None when it was never recorded."""
        if version_id not in self._runs:
            found = self._find(VERSION_TAG, version_id)
            if found is None:
                return None
            self._runs[version_id] = found
        return self._runs[version_id]

    # ---- recording -----------------------------------------------------------------------------------
    def record(self, version_dir: str | Path) -> str:
        """Create or update the MLflow run of one version directory; returns its run id."""
        vdir = VersionDir(version_dir)
        v = vdir.meta()
        if v.id in self._recording:      # a malformed meta.json naming itself as an ancestor
            raise ValueError(f"version {v.id} is its own ancestor")
        self._recording.add(v.id)
        try:
            return self._record(vdir, v)
        finally:
            self._recording.discard(v.id)

    def _record(self, vdir: VersionDir, v: BranchVersion) -> str:
        # The first parent must have a run for the UI to nest under: record it first when we can.
        parent_runs = []
        for pid in v.parents:
            run = self.run_id(pid)
            if run is None and (vdir.path.parent / pid / "meta.json").is_file():
                run = self.record(vdir.path.parent / pid)
            parent_runs.append(run)
        run_id = self.run_id(v.id)
        if run_id is None:
            run = self.client.create_run(self.experiment_id, run_name=v.id, start_time=int(v.created * 1000),
                                         tags={VERSION_TAG: v.id})
            run_id = self._runs[v.id] = run.info.run_id
        existing = self.client.get_run(run_id).data
        steps = vdir.steps()
        tags = {VERSION_TAG: v.id, TAG + "generation": str(v.generation), TAG + "operator": v.operator or "seed",
                TAG + "factor": v.factor or "none", TAG + "validity": "invalid" if v.is_invalid else "valid",
                TAG + "status": v.status, TAG + "hypothesis": (v.hypothesis or {}).get("verdict", "none"),
                TAG + "decision": decision_label(v.decision), TAG + "parents": ",".join(v.parents),
                TAG + "base_model": v.base_model, TAG + "genome_hash": v.genome_hash}
        if v.violations:
            tags[TAG + "violations"] = "; ".join(str(x.get("name", x)) for x in v.violations)[:4000]
        if parent_runs and parent_runs[0]:
            tags["mlflow.parentRunId"] = parent_runs[0]
        tags[NOTE] = run_description(v)
        name = run_name(v)
        if existing.tags.get("mlflow.runName") != name:   # the name follows the version's fate
            self.client.update_run(run_id, name=name)
        self._log_params(run_id, v.knobs, existing.params)
        self._log_steps(run_id, steps, v, existing.tags)
        self._log_version_metrics(run_id, v, existing.metrics, len(steps))
        self._set_tags(run_id, tags)
        self._log_artifacts(run_id, vdir, v)
        # The run spans the version's training: its start plus the seconds its steps took, when known.
        seconds = sum(x for row in steps if (x := _number(row.get("step_seconds"))) is not None)
        end = int((v.created + seconds) * 1000) if seconds else None
        self.client.set_terminated(run_id, "FINISHED", end_time=end)
        return run_id

    def record_all(self) -> dict[str, str]:
        """Record every version directory of the run (parents first); version id -> run id."""
        out = {}
        for path in sorted((self.run_dir / "versions").glob("*/meta.json")):
            out[path.parent.name] = self.record(path.parent)
        return out

    def update_status(self, version_id: str, status: str, decision: dict[str, Any] | None = None) -> str:
        """A later gate changed a version's fate: retag its run and store the decision record."""
        run_id = self.run_id(version_id)
        if run_id is None:
            vdir = self.run_dir / "versions" / version_id
            if not (vdir / "meta.json").is_file():
                raise KeyError(f"version {version_id} has no MLflow run and no version directory")
            run_id = self.record(vdir)
        tags = {TAG + "status": status}
        if status == "invalid":
            tags[TAG + "validity"] = "invalid"
        if decision is not None:
            tags[TAG + "decision"] = decision_label(decision)
            self.client.log_dict(run_id, decision, "decision.json")
        self._set_tags(run_id, tags)
        return run_id

    def mark_final(self, version_id: str, final: dict[str, Any]) -> None:
        """Tags the final pick's run (its ``test_accuracy`` is one of its metrics) and the experiment
        (``evotrainer.final_pick``, ``evotrainer.final_test_accuracy``), so the UI shows which version a
        run ended with and its test-split score."""
        if (self.run_dir / "versions" / version_id).is_dir():   # not the untrained model (loop/stages/start.py)
            run_id = self.run_id(version_id) or self.record(self.run_dir / "versions" / version_id)
            self._set_tags(run_id, {TAG + "final_pick": "true"})
        for key, value in (("final_pick", version_id), ("final_test_accuracy", f"{final['test_accuracy']:.4f}"),
                           ("final_test_tasks", str(final.get("test_tasks")))):
            self.client.set_experiment_tag(self.experiment_id, TAG + key, value)

    def log_plots(self) -> str:
        """Draw the genealogy and fitness plots of the whole run and log them to the summary run."""
        out = self.run_dir / "plots"
        files = [*genealogy_plot(self.run_dir, out), fitness_plot(self.run_dir, out / "fitness.png")]
        run_id = self._find(SUMMARY_TAG, "true")
        if run_id is None:
            run_id = self.client.create_run(self.experiment_id, run_name="genealogy",
                                            tags={SUMMARY_TAG: "true"}).info.run_id
        for f in files:
            self.client.log_artifact(run_id, str(f))
        self.client.set_terminated(run_id, "FINISHED")
        self.client.set_experiment_tag(self.experiment_id, NOTE,
                                       experiment_description(load_versions(self.run_dir), run_id,
                                                              self.experiment_id))
        return run_id

    # ---- pieces --------------------------------------------------------------------------------------
    def _set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(k, str(val)) for k, val in tags.items()])

    def _log_params(self, run_id: str, knobs: dict[str, Any], existing: dict[str, str]) -> None:
        # (mlflow: see __init__)
        from mlflow.entities import Param

        # MLflow params are write-once: send only the new ones (a version's knobs never change).
        new = [Param(_key(k), str(val)[:6000]) for k, val in sorted(knobs.items()) if _key(k) not in existing]
        for i in range(0, len(new), 100):
            self.client.log_batch(run_id, params=new[i:i + 100])

    def _log_steps(self, run_id: str, steps: list[dict[str, Any]], v: BranchVersion, tags: dict[str, str]) -> None:
        # (mlflow: see __init__)
        from mlflow.entities import Metric

        done = int(tags.get(TAG + "steps_logged", "0"))
        base = int(v.created * 1000)
        metrics = []
        for i, row in enumerate(steps[done:], start=done):
            step = int(row.get("step", i))
            for key, val in row.items():
                x = _number(val)
                if key != "step" and x is not None:
                    metrics.append(Metric(_key(key), x, base + step, step))
        for i in range(0, len(metrics), _BATCH):
            self.client.log_batch(run_id, metrics=metrics[i:i + _BATCH])
        if len(steps) != done:
            self._set_tags(run_id, {TAG + "steps_logged": str(len(steps))})

    def _log_version_metrics(self, run_id: str, v: BranchVersion, existing: dict[str, float], n_steps: int) -> None:
        # (mlflow: see __init__)
        from mlflow.entities import Metric

        # Logged only when changed, stamped now: a value re-measured later must become the latest one.
        now = int(time.time() * 1000)
        new = [Metric(_key(k), x, now, n_steps) for k, val in sorted(v.metrics.items())
               if (x := _number(val)) is not None and existing.get(_key(k)) != x]
        if new:
            self.client.log_batch(run_id, metrics=new)

    def _log_artifacts(self, run_id: str, vdir: VersionDir, v: BranchVersion) -> None:
        present = {name for name in ARTIFACTS if (vdir.path / name).is_file()}
        for name in sorted(present):
            self.client.log_artifact(run_id, str(vdir.path / name))
        # The gate's record may live only in meta.json; give it its own artifact all the same.
        with tempfile.TemporaryDirectory() as tmp:
            for name, record in (("decision.json", v.decision), ("intervention.json", v.intervention)):
                if record and name not in present:
                    path = Path(tmp) / name
                    path.write_text(json.dumps(record, indent=2, default=str))
                    self.client.log_artifact(run_id, str(path))
