"""A real `mlflow server` on loopback: versions recorded through it are visible through its REST API,
with their lineage tags and artifacts (served by the server itself, --serve-artifacts)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from tests.loop_runs import build_run

MLFLOW = Path(sys.executable).parent / "mlflow"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(base: str, path: str, **query) -> dict:
    with urllib.request.urlopen(f"{base}{path}?{urllib.parse.urlencode(query)}", timeout=30) as r:
        return json.load(r)


def _post(base: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


@pytest.fixture
def server(tmp_path):
    port = _free_port()
    log = (tmp_path / "server.log").open("w")
    # One worker and no background job runner: the server competes with the test for two cores.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(
        [str(MLFLOW), "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--serve-artifacts", "--artifacts-destination", str(tmp_path / "served-artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start:\n{(tmp_path / 'server.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield base
    finally:
        _stop(proc)
        log.close()


def _stop(proc: subprocess.Popen) -> None:
    """The server forks a worker: end its whole process group, politely first, then for sure."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:          # the group is gone already
            break
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            continue
    proc.wait(timeout=15)


@pytest.mark.slow
def test_runs_parents_and_artifacts_through_rest(server, tmp_path):
    from evotrainer.tracking.lineage import LineageTracker

    from evotrainer.records.version import VersionDir

    run_dir = tmp_path / "run"
    versions = build_run(run_dir)
    vdir = VersionDir(run_dir / "versions" / "v002")     # a judged hypothesis, for its tag and column
    judged = vdir.meta()
    judged.hypothesis = {"verdict": "confirmed"}
    vdir.save_meta(judged)
    tracker = LineageTracker(run_dir, tracking_uri=server)
    ids = tracker.record_all()
    assert LineageTracker(run_dir, tracking_uri=server).record_all() == ids     # resumed: no new runs
    summary = tracker.log_plots()

    runs = _post(server, "/api/2.0/mlflow/runs/search", {
        "experiment_ids": [tracker.experiment_id], "filter": "tags.`evotrainer.version_id` != ''",
        "max_results": 100})["runs"]
    tags = {r["info"]["run_id"]: {t["key"]: t["value"] for t in r["data"]["tags"]} for r in runs}
    assert sorted(t["evotrainer.version_id"] for t in tags.values()) == sorted(versions)
    by_version = {t["evotrainer.version_id"]: (rid, t) for rid, t in tags.items()}
    child_run, child = by_version["v004"]
    assert child["evotrainer.parents"] == "v002,v001"
    assert child["mlflow.parentRunId"] == by_version["v002"][0]
    assert by_version["v003"][1]["evotrainer.validity"] == "invalid"
    params = {p["key"]: p["value"] for r in runs if r["info"]["run_id"] == child_run for p in r["data"]["params"]}
    assert params == {k: str(v) for k, v in versions["v004"].knobs.items()}
    history = _get(server, "/api/2.0/mlflow/metrics/get-history", run_id=child_run, metric_key="loss")["metrics"]
    assert sorted(m["step"] for m in history) == [0, 1, 2]

    files = {f["path"] for f in _get(server, "/api/2.0/mlflow/artifacts/list", run_id=child_run).get("files", [])}
    assert {"genome.py", "diff.patch", "intervention.json", "decision.json", "meta.json"} <= files
    plots = {f["path"] for f in _get(server, "/api/2.0/mlflow/artifacts/list", run_id=summary).get("files", [])}
    assert {"genealogy.png", "genealogy.html", "fitness.png"} <= plots
    # the artifacts really are on the server's side, not in the run directory
    assert any((tmp_path / "served-artifacts").rglob("genome.py"))
    assert not (run_dir / "mlartifacts").exists()

    # The genealogy view: names and descriptions say what each version is and what was decided.
    names = {t["evotrainer.version_id"]: r["info"]["run_name"] for r in runs
             for t in [{x["key"]: x["value"] for x in r["data"]["tags"]}]}
    assert names["v002"] == "v002 · gen 1 · knobs:learning_rate · promoted 0.300"
    assert names["v003"].startswith("v003 · gen 1 · llm_diff:reward · INVALID")
    assert names["v000"] == "v000 · gen 0 · seed · promoted 0.200"
    note = by_version["v003"][1]["mlflow.note.content"]
    assert "llm_diff" in note and "hook:reward" in note and "of v001" in note and "leak_used" in note
    assert "**promoted**" in by_version["v002"][1]["mlflow.note.content"]
    exp = _get(server, "/api/2.0/mlflow/experiments/get", experiment_id=tracker.experiment_id)["experiment"]
    page = {t["key"]: t["value"] for t in exp.get("tags", [])}["mlflow.note.content"]
    rows = [line for line in page.splitlines() if line.startswith("| v0")]
    assert [r.split("|")[1].strip() for r in rows] == ["v003", "v004", "v002", "v000", "v001"]   # by held-out
    assert summary in page and "genealogy.png" in page
    assert f"(#/experiments/{tracker.experiment_id}/runs/{summary}/artifacts/genealogy.png" in page

    # What the UI's genealogy view relies on (tracking/view.py): the experiment opens as a classic ML
    # experiment, and the shared table view names columns every version run really has.
    from evotrainer.tracking.view import KIND, VIEW_KEY, ui_url

    exp_tags = {t["key"]: t["value"] for t in exp.get("tags", [])}
    assert exp_tags["mlflow.experimentKind"] == KIND == "custom_model_development"
    view = json.loads(exp_tags[f"mlflow.sharedViewState.{VIEW_KEY}"])
    assert view["orderByKey"] == "metrics.`heldout_accuracy`" and view["orderByAsc"] is False
    assert by_version["v002"][1]["evotrainer.hypothesis"] == "confirmed"
    assert by_version["v000"][1]["evotrainer.hypothesis"] == "none"
    for r in runs:
        have = {"metrics": {m["key"] for m in r["data"].get("metrics", [])},
                "tags": {t["key"] for t in r["data"]["tags"]}}
        for column in view["selectedColumns"]:
            kind, name = column.split(".", 1)
            assert name.strip("`") in have[kind], (column, r["info"]["run_name"])
    url = ui_url(tracker.experiment_id, server)
    assert url.startswith(f"{server}/#/experiments/{tracker.experiment_id}/runs?")
    assert f"viewStateShareKey={VIEW_KEY}" in url and "workflowType=machine_learning" in url
    with urllib.request.urlopen(url.split("#")[0], timeout=30) as r:     # the UI's page itself is served
        assert r.status == 200 and b"<html" in r.read().lower()
