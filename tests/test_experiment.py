"""The co-evolution loop on the tiny model: generations, gates, lineage, human gate, budgets,
and resume after kill -9 at several points (real subprocesses, real MLflow, real sandbox)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from evotrainer.config import parse_config
from evotrainer.loop.experiment import Experiment
from evotrainer.records.run_state import load_state
from evotrainer.records.version import VersionDir
from evotrainer.records.history import proposal_of
from tests.loop_runs import check_invariants, mlflow_runs, tiny_cfg


def test_loop_runs_gates_and_records(tmp_path):
    run_dir = tmp_path / "run"
    exp = Experiment(parse_config(tiny_cfg(run_dir)))
    state = exp.run()
    assert state.status == "finished" and state.generation == 3
    state, metas = check_invariants(run_dir)
    gens = {g: [m for m in metas.values() if m.generation == g] for g in range(3)}
    assert len(gens[0]) == 1 and gens[0][0].operator is None  # the seed: the reference harness
    children = [m for m in metas.values() if m.operator]
    assert children, "operators proposed children"
    for c in children:
        # A tie with its control lives on ("kept", later "pruned" if selection drops it).
        assert c.factor and c.decision and c.status in ("promoted", "rejected", "invalid", "kept", "pruned")
        # Its claim was judged after training, and the verdict is on the record and in MLflow.
        assert c.hypothesis["verdict"] in ("confirmed", "refuted", "untestable") and c.hypothesis["reason"]
        assert c.decision["hypothesis"] == c.hypothesis
        assert (exp.vdir(c.id).path / "intervention.json").is_file()
        assert (exp.vdir(c.id).path / "backtest.json").is_file()
        paired = c.decision.get("paired") or {}
        assert "ci_low" in json.dumps(paired) or "reason" in paired
        # The child started from its parent's adapter and changed exactly one factor.
        assert len(json.loads((exp.vdir(c.id).path / "intervention.json").read_text())["factors"]) == 1
    assert state.budget_used["train_steps"] == sum(1 for m in metas.values() if m.status != "pending")
    assert (run_dir / "plots").is_dir()
    # Where the wall time went is recorded, and the parts fit inside it (the overhead benchmark reads them).
    used = state.budget_used
    parts = [k for k in used if k.endswith("_seconds")]
    assert {"load_seconds", "adapter_seconds", "gen_seconds", "train_seconds", "verify_seconds", "health_seconds",
            "gate_seconds", "record_seconds", "finish_seconds"} <= set(parts)
    assert 0 < sum(used[k] for k in parts) <= used["wall_time_s"] + 1e-6
    from io import StringIO

    from rich.console import Console

    out = StringIO()
    exp.print_summary(Console(file=out, width=300))
    summary = out.getvalue()
    assert "leaderboard" in summary and "mlflow ui --backend-store-uri sqlite:///" in summary
    assert "where the time went:" in summary and "rollouts" in summary and "MLflow" in summary
    assert "hypothesis" in summary and "hypotheses judged after training" in summary
    tags = {r.data.tags["evotrainer.version_id"]: r.data.tags for r in mlflow_runs(run_dir)}
    assert all(tags[c.id]["evotrainer.hypothesis"] == c.hypothesis["verdict"] for c in children)


def test_budget_stops_cleanly_and_resume_respects_it(tmp_path):
    run_dir = tmp_path / "run"
    cfg = tiny_cfg(run_dir, budget={"train_steps": 2})
    state = Experiment(parse_config(cfg)).run()
    assert state.status == "stopped" and "train_steps" in state.stop_reason
    assert state.budget_used["train_steps"] == 2
    assert Experiment.resume(run_dir).run().status == "stopped"  # nothing more is spent


@pytest.mark.parametrize("budget, key", [({"rollout_tokens": 60}, "rollout_tokens"), ({"wall_time_s": 1.0}, "wall_time_s")])
def test_every_budget_stops_the_run_cleanly_with_everything_recorded(tmp_path, budget, key):
    run_dir = tmp_path / "run"
    state = Experiment(parse_config(tiny_cfg(run_dir, budget=budget))).run()
    assert state.status == "stopped" and key in state.stop_reason, state.stop_reason
    assert state.budget_used[key] >= budget[key]
    check_invariants(run_dir)                                        # nothing lost, every version settled
    assert Experiment.resume(run_dir).run().status == "stopped"      # and resume spends nothing more


def test_an_llm_call_budget_stops_the_run_cleanly(tmp_path):
    """Reaching an LLM budget ends the run like any other budget: stopped, reason named, all recorded."""
    run_dir = tmp_path / "run"
    cfg = tiny_cfg(run_dir, generations=4, operators={"llm_diff": 1.0}, budget={"llm_calls": 1},
                   llm={"model": "tiny-random", "max_tokens": 16})
    state = Experiment(parse_config(cfg)).run()
    assert state.status == "stopped" and "llm_calls budget spent" in state.stop_reason
    assert state.budget_used["llm_calls"] == 1 and state.generation < 4
    check_invariants(run_dir)


def test_human_gate_pauses_until_approve_or_reject(tmp_path):
    from evotrainer.cli.app import main

    run_dir = tmp_path / "run"
    cfg = tiny_cfg(run_dir, human_gate=True, generations=2, operators={"knobs": 1.0})
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["run", str(path)]) == 0
    state = load_state(run_dir)
    pending = [k for k, v in state.approvals.items() if v == "pending"]
    assert state.status == "paused" and len(pending) == 2
    assert main(["approve", str(run_dir), "v9999"]) == 2   # not awaiting approval: the user's to fix
    assert main(["approve", str(run_dir), pending[0]]) == 0
    assert main(["reject", str(run_dir), pending[1], "--reason", "too risky"]) == 0
    assert main(["resume", str(run_dir)]) == 0
    state, metas = check_invariants(run_dir)
    assert state.status == "finished"
    assert metas[pending[0]].status in ("promoted", "rejected", "invalid", "kept", "pruned")  # approved: trained, gated
    assert metas[pending[0]].metrics.get("heldout_accuracy") is not None
    assert metas[pending[1]].status == "rejected" and "too risky" in metas[pending[1]].decision["reasons"][0]
    assert metas[pending[1]].metrics.get("heldout_accuracy") is None   # rejected: never trained
    # `run` again refuses to overwrite the run; `run --resume` (what `make demo` does) shows it as it is.
    assert main(["run", str(path)]) == 2
    assert main(["run", str(path), "--resume"]) == 0
    assert load_state(run_dir).next_id == state.next_id and load_state(run_dir).status == "finished"


def wait_for_file(path, proc, deadline):
    """Returns once ``path`` exists; fails if ``proc`` exits first or the deadline passes."""
    while not path.exists():
        assert proc.poll() is None, f"the run exited ({proc.returncode}) before writing {path}"
        assert time.time() < deadline, f"{path} not written in time"
        time.sleep(0.01)


@pytest.mark.slow
def test_resume_after_kill_9_at_several_points(tmp_path):
    run_dir = tmp_path / "run"
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(tiny_cfg(run_dir)))
    cli = [sys.executable, "-m", "evotrainer.cli.app"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # Each kill lands at a different point: mid-training, mid-verification, after a proposal, and
    # mid-verification a generation later.
    # (Version ids depend on how many ties live on, so the markers name stages; the version the line
    # names must then have written the stage's file, so the kill lands after the stage did work on it,
    # not at its first line, however fast or slow the machine.)
    points = [("gen 1: training v", "steps.jsonl"), ("gen 1: verifying v", "rollouts/heldout.jsonl"),
              ("proposed v", "intervention.json"), ("gen 2: verifying v", "rollouts/heldout.jsonl")]
    args = cli + ["run", str(path)]
    killed = 0
    for marker, stage_file in points:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
        deadline = time.time() + 300
        seen = False
        for line in proc.stdout:
            if marker in line:
                seen = True
                vid = "v" + re.search(re.escape(marker) + r"(\d+)", line).group(1)
                wait_for_file(run_dir / "versions" / vid / stage_file, proc, deadline)
                os.killpg(proc.pid, signal.SIGKILL)
                break
            assert time.time() < deadline
        proc.wait()
        killed += seen
        args = cli + ["resume", str(run_dir)]
    assert killed == len(points), f"killed at {killed} of {len(points)} points"
    done = subprocess.run(cli + ["resume", str(run_dir)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    state, metas = check_invariants(run_dir)
    assert state.status == "finished" and state.generation == 3


def test_resume_after_a_crash_at_each_named_window(tmp_path):
    """Deterministic kill points (EVOTRAINER_CRASH_AT, os._exit(137) like kill -9) inside the windows
    between one effect and the state save that records it: after the gate saved a child's meta (the
    knob study, history and skills were updated after it), after a version directory was created
    (its id allocated only in memory), after the select stage's plan (survivors, reverts, prunes)."""
    run_dir = tmp_path / "run"
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(tiny_cfg(run_dir)))
    cli = [sys.executable, "-m", "evotrainer.cli.app"]
    args = cli + ["run", str(path)]
    for point in ["gate:meta-saved", "version:created", "select:planned", "gate:meta-saved"]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "EVOTRAINER_CRASH_AT": point}
        died = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
        assert died.returncode == 137, (point, died.stdout[-1500:] + died.stderr[-1500:])
        args = cli + ["resume", str(run_dir)]
    env = {k: v for k, v in os.environ.items() if k != "EVOTRAINER_CRASH_AT"}
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    state, metas = check_invariants(run_dir)
    assert state.status == "finished" and state.generation == 3
    for m in metas.values():
        vd = run_dir / "versions" / m.id
        if m.operator is None and not (m.intervention or {}).get("action") == "revert":
            # A continuation never inherits a crashed child's files under a reused id.
            assert not (vd / "intervention.json").exists() and not (vd / "backtest.json").exists(), m.id
        if m.operator and "hypothesis" in (m.decision or {}):
            # The gate's effects past the meta were finished on resume: decision.json and the history.
            assert (vd / "decision.json").is_file()
            h = proposal_of(state.history, m.id)
            assert h.outcome == m.status or (m.status == "pruned" and h.outcome in ("kept", "promoted")), \
                (m.id, m.status, h)
            assert h.hypothesis_verdict == m.hypothesis["verdict"]


def test_a_config_uses_a_user_operator_installed_by_entry_point(tmp_path, monkeypatch):
    """examples/custom_operator's entry point, installed as pip would, selected by name in a config."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    example = root / "examples" / "custom_operator"
    eps = tomllib.loads((example / "pyproject.toml").read_text())["project"]["entry-points"]["evotrainer.operators"]
    dist = tmp_path / "site" / "evotrainer_double_lr-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: evotrainer-double-lr\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[evotrainer.operators]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.syspath_prepend(str(example))
    run_dir = tmp_path / "run"
    cfg = tiny_cfg(run_dir, generations=2, children_per_generation=1, operators={"double_lr": 1.0})
    state = Experiment(parse_config(cfg)).run()
    assert state.status == "finished"
    _, metas = check_invariants(run_dir)
    children = [m for m in metas.values() if m.operator]
    assert [c.operator for c in children] == ["double_lr"] and children[0].factor == "knob:learning_rate"
    monkeypatch.delitem(sys.modules, "double_lr", raising=False)


def test_budget_mid_generation_finishes_the_generation_then_stops(tmp_path):
    run_dir = tmp_path / "run"
    state = Experiment(parse_config(tiny_cfg(run_dir, budget={"train_steps": 2}))).run()
    _, metas = check_invariants(run_dir)
    trained = [m for m in metas.values() if m.metrics.get("heldout_accuracy") is not None]
    untrained = [m for m in metas.values() if m.status == "pruned" and "not trained" in str(m.decision)]
    assert len(trained) == 2 and untrained, {v: m.status for v, m in metas.items()}
    assert all(m.status in ("kept", "promoted", "rejected", "invalid", "pruned") for m in trained)
    assert state.status == "stopped"
    # The log says what was done: a version pruned untrained is never said to be verified.
    for m in untrained:
        assert not any(f"verifying {m.id} " in e for e in state.events), state.events


def test_carry_optimizer_continues_each_lineages_adamw_state(tmp_path):
    """With train.carry_optimizer, a version's AdamW step count is its parent's plus its own updates."""
    import torch

    from evotrainer.genome.program import reference_program

    # A reward that varies with the completion, so the tiny random model's groups are not all dead.
    source = reference_program().source.replace(
        'return [1.0 if r["visible"].get("correct") else 0.0 for r in rollouts]',
        'return [float(len(r["completion"]) % 3) for r in rollouts]')
    (tmp_path / "harness.py").write_text(source)
    cfg = tiny_cfg(tmp_path / "run", operators={"knobs": 1.0})
    cfg["harness"], cfg["train"]["carry_optimizer"] = str(tmp_path / "harness.py"), True
    exp = Experiment(parse_config(cfg))
    exp.run()

    def adam_steps(vid):
        state = torch.load(exp.vdir(vid).adapter_dir / "optimizer.pt", weights_only=True)
        return int(float(state[0]["step"])) if state else 0

    trained = [v for v in exp.versions() if exp.vdir(v).meta().metrics.get("heldout_accuracy") is not None]
    checked = 0
    for vid in trained:
        meta = exp.vdir(vid).meta()
        updates = sum(1 for row in exp.vdir(vid).steps() if not row.get("skipped"))
        inherited = adam_steps(meta.parents[0]) if meta.parents else 0
        assert adam_steps(vid) == inherited + updates, vid
        checked += inherited > 0
    assert checked, "some version inherited a non-empty optimizer state"


def test_an_inherited_optimizer_state_that_does_not_fit_stops_the_run_as_an_engine_error(tmp_path, monkeypatch):
    """load_optimizer_state's shape mismatch is the run directory's problem, not the child's harness:
    it used to be caught as a harness failure and the child rejected with "harness failed in training".
    Now it stops the run with what failed and how to fix it, and no version is blamed."""
    import torch

    from evotrainer.genome.program import reference_program
    from evotrainer.policy.grpo import GRPOTrainer
    from evotrainer.records.run_dir import RunDirError

    real = GRPOTrainer.load_optimizer_state

    def another_shape(self, state):   # as if the parent had another LoRA rank
        state = {i: {**st, "exp_avg": torch.zeros(3, 5)} for i, st in state.items()}
        return real(self, state)

    monkeypatch.setattr(GRPOTrainer, "load_optimizer_state", another_shape)
    # A reward that varies with the completion, so that the seed's update leaves a state to inherit.
    source = reference_program().source.replace(
        'return [1.0 if r["visible"].get("correct") else 0.0 for r in rollouts]',
        'return [float(len(r["completion"]) % 3) for r in rollouts]')
    (tmp_path / "harness.py").write_text(source)
    cfg = tiny_cfg(tmp_path / "run", operators={"knobs": 1.0}, generations=2)
    cfg["harness"], cfg["train"]["carry_optimizer"] = str(tmp_path / "harness.py"), True
    with pytest.raises(RunDirError) as err:
        Experiment(parse_config(cfg)).run()
    message = str(err.value)
    assert "optimizer state does not fit" in message and "optimizer.pt" in message
    assert "train.carry_optimizer: false" in message
    metas = [VersionDir(p).meta() for p in sorted((tmp_path / "run" / "versions").iterdir())]
    assert not any("harness failed" in str(m.decision) for m in metas)


def test_train_steps_budget_overshoots_by_at_most_k_minus_one(tmp_path):
    """The exact rule (loop/budgets.py): a version starts only while steps are left, and a started
    version trains all k steps, so the run spends budget + k - 1 at most; here 3 + 2 - 1 = 4."""
    run_dir = tmp_path / "run"
    state = Experiment(parse_config(tiny_cfg(run_dir, steps_per_generation=2, budget={"train_steps": 3}, probe_steps=0))).run()
    assert state.status == "stopped" and "train_steps" in state.stop_reason
    assert state.budget_used["train_steps"] == 4
    _, metas = check_invariants(run_dir)
    steps = {v: len(VersionDir(run_dir / "versions" / v).steps()) for v in metas}
    assert sorted(steps.values())[-2:] == [2, 2] and sum(steps.values()) == 4   # started: all k steps
    assert all(m.status == "pruned" and "not trained" in m.decision["reasons"][0]
               for v, m in metas.items() if steps[v] == 0)


def test_an_llm_call_is_on_disk_as_soon_as_it_is_reserved(tmp_path):
    """A call made just before a crash used to be lost: the count was saved only with the next stage."""
    run_dir = tmp_path / "run"
    exp = Experiment(parse_config(tiny_cfg(run_dir)))
    exp.save()
    exp.budgets.llm.reserve(10, 10)
    assert load_state(run_dir).budget_used["llm_calls"] == 1
    exp.budgets.llm.charge(12, 3)
    assert load_state(run_dir).budget_used["llm_tokens"] == 15
