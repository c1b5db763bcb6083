"""Lineage in MLflow: one run per version, idempotent, with parents, params, step metrics and artifacts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evotrainer.records.version import VersionDir
from tests.loop_runs import build_run


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A run recorded twice by two trackers (the second one plays a resumed loop)."""
    from evotrainer.tracking.lineage import LineageTracker

    run_dir = tmp_path_factory.mktemp("run")
    versions = build_run(run_dir)
    first = LineageTracker(run_dir).record_all()
    tracker = LineageTracker(run_dir)                   # fresh instance: no in-memory cache
    second = tracker.record_all()
    for vid in versions:
        tracker.record(run_dir / "versions" / vid)
    return run_dir, versions, tracker, first, second


def _runs(tracker):
    return tracker.client.search_runs([tracker.experiment_id], filter_string="tags.`evotrainer.version_id` != ''")


def test_record_is_idempotent_one_run_per_version(recorded):
    run_dir, versions, tracker, first, second = recorded
    assert first == second
    runs = _runs(tracker)
    assert sorted(r.data.tags["evotrainer.version_id"] for r in runs) == sorted(versions)
    assert len({r.info.run_id for r in runs}) == len(versions)
    assert (run_dir / "mlflow.db").is_file()
    assert all(r.info.artifact_uri.startswith((run_dir / "mlartifacts").as_uri()) for r in runs)
    assert all(r.info.status == "FINISHED" for r in runs)


def test_lineage_tags_and_parent_runs(recorded):
    _, _, tracker, runs, _ = recorded
    child = tracker.client.get_run(runs["v004"]).data.tags
    assert child["evotrainer.parents"] == "v002,v001"            # every parent of the crossover
    assert child["mlflow.parentRunId"] == runs["v002"]           # the first parent nests it in the UI
    assert child["evotrainer.operator"] == "crossover"
    assert child["evotrainer.factor"] == "hook:keep_groups"
    assert child["evotrainer.generation"] == "2"
    seed = tracker.client.get_run(runs["v000"]).data.tags
    assert "mlflow.parentRunId" not in seed and seed["evotrainer.parents"] == ""
    assert seed["evotrainer.operator"] == "seed" and seed["evotrainer.status"] == "promoted"
    bad = tracker.client.get_run(runs["v003"]).data.tags
    assert bad["evotrainer.validity"] == "invalid" and bad["evotrainer.decision"] == "invalid"
    assert "leak_used" in bad["evotrainer.violations"]
    assert tracker.client.get_run(runs["v002"]).data.tags["evotrainer.decision"] == "promote"


def test_params_are_knobs_and_metrics_have_steps(recorded):
    _, versions, tracker, runs, _ = recorded
    data = tracker.client.get_run(runs["v002"]).data
    assert data.params == {k: str(v) for k, v in versions["v002"].knobs.items()}
    history = tracker.client.get_metric_history(runs["v002"], "loss")
    assert sorted((m.step, round(m.value, 6)) for m in history) == [(0, 1.0), (1, 0.9), (2, 0.8)]  # no duplicates
    assert data.metrics["heldout_accuracy"] == pytest.approx(0.30)
    assert "note" not in data.metrics                           # strings are not metrics


def test_artifacts_present(recorded):
    _, _, tracker, runs, _ = recorded
    names = {a.path for a in tracker.client.list_artifacts(runs["v002"])}
    assert {"genome.py", "meta.json", "diff.patch", "health.md", "intervention.json", "decision.json"} <= names
    genome = tracker.client.download_artifacts(runs["v002"], "genome.py")
    assert Path(genome).read_text().endswith("# v002\n")
    assert {a.path for a in tracker.client.list_artifacts(runs["v000"])} == {"genome.py", "meta.json"}


def test_new_steps_and_later_gate_update_the_same_run(recorded):
    run_dir, versions, tracker, runs, _ = recorded
    vdir = VersionDir(run_dir / "versions" / "v004")
    vdir.append_step({"step": 3, "loss": 0.6})
    assert tracker.record(vdir.path) == runs["v004"]
    assert tracker.record(vdir.path) == runs["v004"]
    steps = sorted(m.step for m in tracker.client.get_metric_history(runs["v004"], "loss"))
    assert steps == [0, 1, 2, 3]
    meta = vdir.meta()
    meta.metrics["heldout_accuracy"] = 0.33                      # re-measured lower: must become the latest
    vdir.save_meta(meta)
    tracker.record(vdir.path)
    assert tracker.client.get_run(runs["v004"]).data.metrics["heldout_accuracy"] == pytest.approx(0.33)
    decision = {"promote": True, "valid": True, "paired": {"mean_delta": 0.05, "ci_low": 0.01, "ci_high": 0.09}}
    assert tracker.update_status("v004", "promoted", decision) == runs["v004"]
    tags = tracker.client.get_run(runs["v004"]).data.tags
    assert tags["evotrainer.status"] == "promoted" and tags["evotrainer.decision"] == "promote"
    path = tracker.client.download_artifacts(runs["v004"], "decision.json")
    assert json.loads(Path(path).read_text())["paired"]["mean_delta"] == 0.05
    assert len(_runs(tracker)) == len(versions)


def test_child_recorded_first_records_its_parents(recorded, tmp_path):
    from evotrainer.tracking.lineage import LineageTracker

    build_run(tmp_path)
    # Another run in the already-migrated store (creating a sqlite store costs seconds).
    tracker = LineageTracker(tmp_path, experiment_name="child-first", tracking_uri=recorded[2].tracking_uri)
    child_run = tracker.record(tmp_path / "versions" / "v004")
    tags = tracker.client.get_run(child_run).data.tags
    assert tags["mlflow.parentRunId"] == tracker.run_id("v002")
    assert {"v000", "v001", "v002", "v004"} <= {r.data.tags["evotrainer.version_id"] for r in _runs(tracker)}


def test_log_plots_to_one_summary_run(recorded):
    run_dir, _, tracker, _, _ = recorded
    first, second = tracker.log_plots(), tracker.log_plots()
    assert first == second
    summary = tracker.client.search_runs([tracker.experiment_id], filter_string="tags.`evotrainer.summary` = 'true'")
    assert [r.info.run_id for r in summary] == [first]
    assert {"genealogy.png", "genealogy.html", "fitness.png"} <= {a.path for a in tracker.client.list_artifacts(first)}
    assert (run_dir / "plots" / "genealogy.png").stat().st_size > 1000
