"""``executor: ray`` against ``executor: local`` on the tiny model: the same loop gives the same
versions, statuses and scores; a worker that dies or raises is retried once, or its version is
recorded as rejected with the reason; ray missing is a config error naming the extra.

One local Ray cluster (2 CPUs) for the module: workers are real processes holding real models."""

import os
import subprocess
import sys
import time

import pytest
import yaml

from evotrainer.config import ConfigError, parse_config
from evotrainer.loop.experiment import Experiment
from evotrainer.records.version import VersionDir
from tests.loop_runs import check_invariants, mlflow_runs, tiny_cfg

METRICS = ("heldout_accuracy", "selection_accuracy", "train_reward_mean", "cost")


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install -c constraints.txt -e '.[ray]'")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def run(tmp_path, name, executor, **evolution):
    cfg = tiny_cfg(tmp_path / name, **{"generations": 2, **evolution})
    cfg["executor"] = executor
    exp = Experiment(parse_config(cfg))
    try:
        state = exp.run()
    finally:
        exp.close()
    return exp, state


def outcome(exp):
    out = {}
    for vid in exp.versions():
        m = exp.vdir(vid).meta()
        out[vid] = (m.status, m.parents, m.operator, {k: m.metrics.get(k) for k in METRICS})
    return out


def test_ray_executor_matches_the_local_one(tmp_path, cluster):
    local, ls = run(tmp_path, "local", "local")
    remote, rs = run(tmp_path, "ray", "ray")
    assert rs.status == ls.status == "finished"
    assert outcome(remote) == outcome(local)   # bit-identical: every draw is seeded per version and step
    assert all(m[3]["heldout_accuracy"] is not None for m in outcome(remote).values() if m[0] != "pruned")
    for key in ("train_steps", "rollout_tokens"):   # the workers' spend is merged into the run state
        assert rs.budget_used[key] == ls.budget_used[key] > 0
    assert rs.budget_used["gen_seconds"] > 0 and rs.budget_used["verify_seconds"] > 0
    pids = {int(e.rsplit(" ", 1)[1]) for e in rs.events if " on Ray worker pid " in e}
    assert len(pids) == 2 and os.getpid() not in pids   # in other processes: one worker per CPU, reused
    check_invariants(remote.run_dir)   # one MLflow run per version, recorded by the driver
    assert len(mlflow_runs(remote.run_dir)) == len(remote.versions())


def test_a_train_steps_budget_prunes_the_same_versions(tmp_path, cluster):
    # gen 0: the seed, 1 step; gen 1: its continuation and one child; gen 2: two continuations
    # for the one step left, so the budget runs out inside the generation and one is pruned
    budget = {"budget": {"train_steps": 4}, "generations": 3, "exploit_share": 0.0}
    local, ls = run(tmp_path, "local", "local", **budget)
    remote, rs = run(tmp_path, "ray", "ray", **budget)
    assert rs.status == ls.status == "stopped"
    assert outcome(remote) == outcome(local)
    assert rs.budget_used["train_steps"] == ls.budget_used["train_steps"] == 4
    assert any(m[0] == "pruned" and m[2] is None for m in outcome(local).values())


def test_a_worker_that_dies_once_is_retried(tmp_path, cluster, monkeypatch):
    monkeypatch.setenv("EVOTRAINER_CRASH_AT", "worker:v0000")
    monkeypatch.setenv("EVOTRAINER_CRASH_ONCE", str(tmp_path / "crashed"))
    exp, state = run(tmp_path, "run", "ray", generations=1)
    assert (tmp_path / "crashed").is_file(), "the worker reached the crash point and died"
    assert state.status == "finished"
    assert exp.vdir("v0000").meta().status in ("kept", "promoted")
    said = [e for e in state.events]
    assert any(m.startswith("v0000: its Ray worker died") and "retry 1 of 1" in m for m in said), said


def test_a_worker_that_always_raises_rejects_the_version_with_the_reason(tmp_path, cluster, monkeypatch):
    monkeypatch.setenv("EVOTRAINER_WORKER_RAISE", "v0000")
    exp, state = run(tmp_path, "run", "ray", generations=1)
    meta = exp.vdir("v0000").meta()
    assert meta.status == "rejected"
    assert "worker failed 2 times" in meta.decision["reasons"][0]
    assert "EVOTRAINER_WORKER_RAISE=v0000" in meta.decision["reasons"][0]
    check_invariants(exp.run_dir)   # recorded in MLflow like any rejected version, not lost


def test_a_worker_past_its_time_limit_is_killed_and_the_version_recorded(tmp_path, cluster, monkeypatch):
    monkeypatch.setenv("EVOTRAINER_WORKER_HANG", "v0000")
    cfg = {**tiny_cfg(tmp_path / "run", generations=1), "executor": "ray",
           "ray": {"version_timeout_s": 20, "max_retries": 1}}
    exp = Experiment(parse_config(cfg))
    t0 = time.monotonic()
    try:
        state = exp.run()
    finally:
        exp.close()
    assert time.monotonic() - t0 < 600   # two 20 s attempts and the rest of a tiny run, not a day's sleep
    meta = exp.vdir("v0000").meta()
    assert meta.status == "rejected" and "took more than 20 s (ray.version_timeout_s)" in meta.decision["reasons"][0]
    assert any("took more than 20 s" in e and "retry 1 of 1" in e for e in state.events), state.events
    check_invariants(exp.run_dir)


def test_ray_asked_for_without_ray_names_the_extra(tmp_path, monkeypatch):
    import evotrainer.loop.tools.validate as validate

    monkeypatch.setattr(validate, "ray_installed", lambda: False)   # as on a machine without the extra
    cfg = {**tiny_cfg(tmp_path / "run"), "executor": "ray"}
    with pytest.raises(ConfigError, match=r"field 'executor'.*ray is not installed|field 'executor'.*\.\[ray\]"):
        Experiment(parse_config(cfg))


def test_a_cluster_too_small_for_a_worker_is_a_config_error(tmp_path, cluster):
    cfg = {**tiny_cfg(tmp_path / "run"), "executor": "ray", "ray": {"num_gpus_per_branch": 1}}
    exp = Experiment(parse_config(cfg))
    with pytest.raises(ConfigError, match=r"fit no worker.*num_gpus_per_branch=1"):
        try:
            exp.run()
        finally:
            exp.close()


def test_a_driver_killed_after_a_worker_finished_resumes_without_repeating_it(tmp_path, cluster):
    """The driver dies (os._exit, like kill -9) after a worker finished v0000 and before the driver
    merged it; the resumed run (a new driver on the same cluster) does not train v0000 again."""
    import ray

    run_dir = tmp_path / "run"
    cfg = {**tiny_cfg(run_dir, generations=1), "executor": "ray",
           "ray": {"address": ray.get_runtime_context().gcs_address}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cli = [sys.executable, "-m", "evotrainer.cli.app"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "EVOTRAINER_CRASH_AT": "ray:result"}
    died = subprocess.run(cli + ["run", str(path)], capture_output=True, text=True, env=env, timeout=600)
    assert died.returncode == 137, died.stdout[-1500:] + died.stderr[-1500:]
    steps = run_dir / "versions" / "v0000" / "steps.jsonl"
    assert VersionDir(run_dir / "versions" / "v0000").meta().status == "verified"
    trained_at = steps.stat().st_mtime_ns
    env.pop("EVOTRAINER_CRASH_AT")
    done = subprocess.run(cli + ["resume", str(run_dir)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert steps.stat().st_mtime_ns == trained_at, "v0000 was trained again"
    state, _ = check_invariants(run_dir)
    assert state.status == "finished" and state.generation == 1
