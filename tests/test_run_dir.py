"""Nothing lost: a run or version directory is written only by the command of its kind, by one
process at a time, and inspection commands write nothing (real CLI, real second processes)."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from evotrainer.cli.app import main
from evotrainer.config import parse_config
from evotrainer.loop.experiment import Experiment
from evotrainer.loop.versions import new_version
from evotrainer.records import run_dir as rundir
from evotrainer.records.run_state import load_state
from tests.loop_runs import tiny_cfg

ROOT = Path(__file__).resolve().parents[1]


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` with a hash of its bytes (the lock file's holder record aside)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != rundir.LOCK}


def write_cfg(tmp_path: Path, run_dir: Path, **evolution) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(tiny_cfg(run_dir, **evolution)))
    return path


def new_run(run_dir: Path) -> Experiment:
    """A run directory as `evotrainer run` creates it (marker, config, lock), with its seed version."""
    exp = Experiment(parse_config(tiny_cfg(run_dir)))
    exp.state.live = [new_version(exp, None, exp.seed_program().source, 0)]
    exp.save()
    return exp


def test_run_refuses_a_folder_holding_the_users_own_config(tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "config.json").write_text('{"my": "settings"}')
    assert main(["run", str(write_cfg(tmp_path, folder))]) == 2
    err = capsys.readouterr().err
    assert "did not write" in err and "config.json" in err and "Traceback" not in err
    assert (folder / "config.json").read_text() == '{"my": "settings"}'
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]   # nothing added either


def test_train_refuses_a_loop_run_and_leaves_its_config(tmp_path, capsys):
    run = tmp_path / "run"
    new_run(run).close()
    before = snapshot(run)
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump({**tiny_cfg(run), "train": {"steps": 1}}))
    assert main(["train", str(cfg), "--run-dir", str(run)]) == 2
    assert "evotrainer run" in capsys.readouterr().err
    assert main(["train", str(cfg), "--run-dir", str(run / "versions" / "v0000")]) == 2
    assert "inside the loop run" in capsys.readouterr().err
    assert snapshot(run) == before


def trained_version(tmp_path):
    """A version directory written by one `evotrainer train` of the tiny model: (dir, its config dict)."""
    out = tmp_path / "v"
    base = {**tiny_cfg(out), "train": {"steps": 1, "prompts_per_step": 2, "eval_max_new_tokens": 4}}
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(base))
    assert main(["train", str(tmp_path / "good.yaml")]) == 0
    return out, base


def test_a_failed_train_keeps_the_earlier_version_in_its_directory(tmp_path, capsys):
    """Retraining into a version directory replaces the old version only once training succeeded."""
    out, base = trained_version(tmp_path)
    assert rundir.kind_of(out) == "version"
    before = snapshot(out)
    assert (out / "steps.jsonl").read_text().strip()
    from evotrainer.genome.program import reference_program

    broken = reference_program().source.replace(
        'return [1.0 if r["visible"].get("correct") else 0.0 for r in rollouts]', 'return [1.0 / 0.0]')
    assert broken != reference_program().source
    (tmp_path / "broken.py").write_text(broken)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**base, "harness": str(tmp_path / "broken.py")}))
    code = main(["train", str(bad), "--overwrite"])
    err = capsys.readouterr().err
    assert code == 1 and "ZeroDivisionError" in err and "Traceback" not in err
    after = snapshot(out)
    assert {k: v for k, v in after.items() if not k.startswith(".partial")} == before


def test_train_into_a_trained_version_is_refused_unless_overwrite(tmp_path, capsys):
    out, base = trained_version(tmp_path)
    cfg = tmp_path / "good.yaml"
    before = snapshot(out)
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "holds a trained version already" in err and "--overwrite" in err and "Traceback" not in err
    assert snapshot(out) == before                      # nothing recorded was touched
    cfg.write_text(yaml.safe_dump({**base, "train": {**base["train"], "steps": 2}}))
    assert main(["train", str(cfg), "--overwrite"]) == 0
    assert "replacing the version" in capsys.readouterr().out
    assert len((out / "steps.jsonl").read_text().splitlines()) == 2     # the new version, whole
    assert not (out / ".partial").exists() and json.loads((out / "meta.json").read_text())["metrics"]["steps"] == 2


def test_a_run_without_its_state_is_refused_not_restarted(tmp_path, capsys):
    run = tmp_path / "run"
    exp = new_run(run)
    exp.close()
    (run / "state.json").unlink()
    before = snapshot(run)
    with pytest.raises(rundir.RunDirError, match="state.json is missing"):
        Experiment(parse_config(tiny_cfg(run)))
    assert main(["run", str(write_cfg(tmp_path, run)), "--resume"]) == 2
    assert "state.json is missing" in capsys.readouterr().err
    assert snapshot(run) == before      # v0000's meta and genome, the config: untouched


def test_a_run_written_before_markers_is_adopted_by_resume(tmp_path):
    run = tmp_path / "run"
    new_run(run).close()
    (run / rundir.MARKER).unlink()
    assert rundir.kind_of(run) == "run"            # recognised by its files
    exp = Experiment.resume(run)
    assert rundir.read_marker(run)["kind"] == "run" and rundir.read_marker(run)["adopted"] is True
    assert exp.state.live == ["v0000"]
    exp.close()


HOLDER = textwrap.dedent("""
    import sys, time
    from evotrainer.loop.experiment import Experiment
    exp = Experiment.resume(sys.argv[1])
    print("holding", flush=True)
    time.sleep(120)
""")


def test_one_process_at_a_time_and_a_dead_holders_lock_is_taken_over(tmp_path, capsys):
    run = tmp_path / "run"
    new_run(run).close()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(rundir.RunDirError, match=f"pid {holder.pid}"):
            Experiment.resume(run)
        state = (run / "state.json").read_text()
        assert main(["resume", str(run)]) == 2
        err = capsys.readouterr().err
        assert f"pid {holder.pid}" in err and "one process at a time" in err
        assert main(["approve", str(run)]) == 2
        assert (run / "state.json").read_text() == state
        assert main(["status", str(run)]) == 0   # reading a live run needs no lock
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The dead process's lock file is still there, naming it; the kernel dropped its lock.
    assert json.loads((run / rundir.LOCK).read_text())["pid"] == holder.pid
    exp = Experiment.resume(run)
    assert json.loads((run / rundir.LOCK).read_text())["pid"] == os.getpid()
    exp.close()


def test_inspection_commands_write_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    exp = new_run(run)
    exp.close()
    before = snapshot(run)
    assert main(["status", str(run)]) == 0
    assert main(["lineage", str(run)]) == 0
    assert main(["skills", "--run", str(run)]) == 0
    assert main(["strategies", str(run)]) == 0
    capsys.readouterr()
    assert snapshot(run) == before


def test_gate_without_record_leaves_the_labels_alone(tmp_path):
    from evotrainer.testing.planted import build_scenario

    dirs = build_scenario(tmp_path / "planted")
    labels = Path(dirs["leaky"]).parent / "labels.json"
    empty = '{"branches": [], "rollouts": [], "gaps": []}'
    labels.write_text(empty)
    before = snapshot(tmp_path)
    assert main(["gate", str(dirs["leaky"]), "--parent", str(dirs["honest"])]) == 1
    assert main(["report", str(dirs["leaky"])]) == 0
    assert main(["backtest", str(Path(dirs["honest"]) / "genome.py"), "--on", str(dirs["honest"])]) in (0, 1)
    assert snapshot(tmp_path) == before
    assert main(["gate", str(dirs["leaky"]), "--parent", str(dirs["honest"]), "--record"]) == 1
    assert json.loads(labels.read_text())["branches"], "--record does record the verdict"


def test_approve_with_nothing_pending_leaves_a_finished_run_finished(tmp_path, capsys):
    run = tmp_path / "run"
    exp = new_run(run)
    exp.state.status = "finished"
    exp.save()
    exp.close()
    assert main(["approve", str(run)]) == 1
    assert "nothing awaits a decision" in " ".join(capsys.readouterr().out.split())
    assert load_state(run).status == "finished"


def test_claim_rules(tmp_path):
    """New and empty directories are claimed; a directory of the other kind or a garbled marker is refused."""
    assert rundir.claim(tmp_path / "new", "version") is True
    assert rundir.claim(tmp_path / "new", "version") is False        # ours: fine
    with pytest.raises(rundir.RunDirError, match="evotrainer version directory"):
        rundir.claim(tmp_path / "new", "run")
    (tmp_path / "empty").mkdir()
    assert rundir.claim(tmp_path / "empty", "run") is True
    (tmp_path / "new" / rundir.MARKER).write_text("{trunc")
    with pytest.raises(rundir.RunDirError, match="not a valid evotrainer marker"):
        rundir.claim(tmp_path / "new", "version")
    with pytest.raises(rundir.RunDirError, match="not a directory evotrainer wrote"):
        rundir.require(tmp_path, "run")
