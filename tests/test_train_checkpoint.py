"""`evotrainer train` killed mid-training continues from its checkpoint, as the uninterrupted run.

A one-version training (``evotrainer train``, ``benchmarks/headroom.py``) used to start again from
step 0 after a kill. Each step samples from seeds given by its index, so a resumed training must
end with the uninterrupted one's adapter, bit for bit on a CPU, and the same steps and rollouts.
"""

import json

import pytest
import yaml
from safetensors.torch import load_file

from evotrainer.cli.app import main
from evotrainer.config import parse_config
from evotrainer.loop import crash
from evotrainer.loop.compute.checkpoint import CheckpointMismatch
from evotrainer.loop.compute.train_branch import train_branch
from evotrainer.records.run_dir import RunDirError
from evotrainer.records.version import VersionDir
from tests.loop_runs import MOVING_REWARD_HARNESS, Crashed, die


def config(tmp_path, name, **grpo):
    harness = tmp_path / "harness.py"
    harness.write_text(MOVING_REWARD_HARNESS)
    return {
        "model": "tiny-random", "run_dir": str(tmp_path / name), "harness": str(harness),
        "domain": {"difficulty": 2, "n_train": 16, "n_heldout": 4, "n_test": 4},
        "grpo": {"max_completion_length": 24, "num_generations": 2, "learning_rate": 1e-2, **grpo},
        "train": {"steps": 3, "prompts_per_step": 2, "eval_max_new_tokens": 6, "save_steps": 1},
    }


def weights(run_dir):
    return load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))


def crashed_at(monkeypatch, cfg, point):
    monkeypatch.setattr(crash, "_die", die)
    monkeypatch.setenv(crash.ENV, point)
    with pytest.raises(Crashed):
        train_branch(parse_config(cfg))
    monkeypatch.delenv(crash.ENV)


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("whole")
    result = train_branch(parse_config(config(tmp, "run")))
    return tmp / "run", result


def test_a_killed_training_resumes_at_its_checkpoint_as_the_uninterrupted_one(whole, tmp_path, monkeypatch):
    want_dir, want = whole
    assert want.resumed_from == 0 and len(want.steps) == 3
    cfg = config(tmp_path, "run")
    crashed_at(monkeypatch, cfg, "train:checkpoint-saved:2")
    assert not (tmp_path / "run" / "meta.json").exists()   # nothing moved in: the run is unfinished
    got = train_branch(parse_config(cfg))
    assert got.resumed_from == 2
    a, b = weights(want_dir), weights(tmp_path / "run")
    assert any(a[k].abs().max() > 0 for k in a)
    for k in a:
        assert (a[k] == b[k]).all(), k
    vd, wd = VersionDir(tmp_path / "run"), VersionDir(want_dir)
    assert [s["step"] for s in vd.steps()] == [0, 1, 2]
    assert [s["reward_mean"] for s in vd.steps()] == [s["reward_mean"] for s in wd.steps()]
    assert [r.completion for r in vd.rollouts("train")] == [r.completion for r in wd.rollouts("train")]
    assert got.heldout_before == want.heldout_before and got.heldout_after == want.heldout_after
    assert vd.meta().metrics["resumed_from_step"] == 2
    assert not (tmp_path / "run" / ".partial").exists()
    assert not any(p.name.startswith("checkpoint") for p in (tmp_path / "run").iterdir())


def test_a_kill_while_swapping_checkpoints_resumes_from_the_earlier_one(whole, tmp_path, monkeypatch):
    want_dir, _ = whole
    cfg = config(tmp_path, "run")
    crashed_at(monkeypatch, cfg, "train:checkpoint-swapping")   # the first swap has no old checkpoint to keep
    assert not (tmp_path / "run" / ".partial" / "checkpoint").exists()
    got = train_branch(parse_config(cfg))   # checkpoint.tmp is no checkpoint: from step 0
    assert got.resumed_from == 0
    cfg["run_dir"] = str(tmp_path / "second")
    swaps = []

    def second_swap(label):   # the first swap passes; the kill comes at the second, between its two renames
        swaps.append(label)
        if swaps.count("train:checkpoint-swapping") == 2:
            raise Crashed
    monkeypatch.setattr("evotrainer.loop.compute.checkpoint.crash_point", second_swap)
    with pytest.raises(Crashed):
        train_branch(parse_config(cfg))
    monkeypatch.undo()
    partial = tmp_path / "second" / ".partial"
    assert (partial / "checkpoint.old").is_dir() and not (partial / "checkpoint").exists()
    got = train_branch(parse_config(cfg))
    assert got.resumed_from == 1
    a, b = weights(want_dir), weights(tmp_path / "second")
    for k in a:
        assert (a[k] == b[k]).all(), k


def test_a_checkpoint_of_another_training_is_named_and_kept_unless_restarted(tmp_path, monkeypatch, capsys):
    cfg = config(tmp_path, "run")
    crashed_at(monkeypatch, cfg, "train:checkpoint-saved:1")
    other = config(tmp_path, "run", learning_rate=5e-3)
    with pytest.raises(CheckpointMismatch, match=r"grpo\.learning_rate: 0\.01 in the checkpoint, 0\.005 now"):
        train_branch(parse_config(other))
    assert (tmp_path / "run" / ".partial" / "checkpoint" / "state.json").is_file()   # kept
    # Through the CLI: a clear error, no traceback, and --restart discards it.
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump(other))
    assert main(["train", str(path)]) != 0
    err = capsys.readouterr()
    assert "--restart" in err.out + err.err and "Traceback" not in err.out + err.err
    assert main(["train", str(path), "--restart"]) == 0
    assert "discarding the unfinished training's checkpoint" in capsys.readouterr().out
    meta = VersionDir(tmp_path / "run").meta()
    assert meta.metrics["resumed_from_step"] == 0
    assert json.loads((tmp_path / "run" / "config.json").read_text())["grpo"]["learning_rate"] == 5e-3
    # A field the checkpoint's config lacks (added to evotrainer since it was written) reads at its default.
    cfg3 = config(tmp_path, "run3")
    crashed_at(monkeypatch, cfg3, "train:checkpoint-saved:1")
    state_path = tmp_path / "run3" / ".partial" / "checkpoint" / "state.json"
    state = json.loads(state_path.read_text())
    del state["config"]["train"]["decoder"], state["config"]["evolution"]["probe_patience"]
    state_path.write_text(json.dumps(state))
    assert train_branch(parse_config(cfg3)).resumed_from == 1
    # More steps than the first config asked for continue a checkpoint; fewer than it reached do not.
    cfg2 = config(tmp_path, "run2")
    crashed_at(monkeypatch, cfg2, "train:checkpoint-saved:2")
    cfg2["train"]["steps"] = 1
    with pytest.raises(CheckpointMismatch, match="past train.steps 1"):
        train_branch(parse_config(cfg2))
    cfg2["train"]["steps"] = 4
    assert train_branch(parse_config(cfg2)).resumed_from == 2
    assert [s["step"] for s in VersionDir(tmp_path / "run2").steps()] == [0, 1, 2, 3]


def test_a_kill_after_the_last_step_or_while_moving_in_repeats_no_step(whole, tmp_path, monkeypatch):
    """The last step is checkpointed too (a kill while the trained adapter is verified retrains
    nothing), and a kill while the finished version moves in is completed, not resumed."""
    want_dir, want = whole
    cfg = config(tmp_path, "run")
    crashed_at(monkeypatch, cfg, "train:checkpoint-saved:3")
    got = train_branch(parse_config(cfg))
    assert got.resumed_from == 3 and got.heldout_after == want.heldout_after
    a, b = weights(want_dir), weights(tmp_path / "run")
    for k in a:
        assert (a[k] == b[k]).all(), k
    cfg = config(tmp_path, "moving")
    crashed_at(monkeypatch, cfg, "train:moving-in")   # after the first entry moved
    assert (tmp_path / "moving" / ".partial" / "meta.json").is_file()
    said = []
    with pytest.raises(RunDirError, match="holds a trained version already"):
        train_branch(parse_config(cfg), on_event=said.append)   # the training finished: nothing to resume
    assert any("completing the move" in m for m in said), said
    assert not (tmp_path / "moving" / ".partial").exists()
    vd = VersionDir(tmp_path / "moving")
    assert vd.meta().status == "trained" and vd.meta().metrics["steps"] == 3
    assert [s["step"] for s in vd.steps()] == [0, 1, 2] and (vd.path / "genome.py").is_file()
    b = weights(tmp_path / "moving")
    for k in a:
        assert (a[k] == b[k]).all(), k
