"""A version whose training died at its very end restarts from its parent's adapter.

``finish`` swaps the trained adapter in (remove the copy, rename the new one) before the status
says ``trained``. A process killed after the rename used to leave trained weights under a pending
version, which the resume trained again; killed between the two, it left no adapter, and the resume
silently started from fresh weights. Either way the recorded version was another policy than an
uninterrupted run's. Training must be deterministic for the same seeds, so the adapters compare
bit for bit.
"""

import pytest
from safetensors.torch import load_file

from evotrainer.config import parse_config
from evotrainer.loop import crash
from evotrainer.loop.experiment import Experiment
from tests.loop_runs import MOVING_REWARD_HARNESS, Crashed, die, tiny_cfg


def weights(run_dir, vid):
    return load_file(str(run_dir / "versions" / vid / "adapter" / "adapter_model.safetensors"))


def config(tmp_path, name):
    harness = tmp_path / "harness.py"
    harness.write_text(MOVING_REWARD_HARNESS)
    cfg = tiny_cfg(tmp_path / name, population_size=1, children_per_generation=0, generations=2,
                   steps_per_generation=2)
    cfg["harness"] = str(harness)
    cfg["grpo"]["learning_rate"] = 1e-2
    return parse_config(cfg)


def run(cfg):
    exp = Experiment(cfg)
    try:
        exp.run()
    finally:
        exp.close()


def test_a_kill_at_the_end_of_training_neither_trains_twice_nor_starts_fresh(tmp_path, monkeypatch):
    run(config(tmp_path, "whole"))
    want = weights(tmp_path / "whole", "v0001")
    assert any((want[k] - weights(tmp_path / "whole", "v0000")[k]).abs().max() > 0 for k in want), \
        "v0001's steps must move the weights, or the comparison below proves nothing"
    monkeypatch.setattr(crash, "_die", die)
    for point in ("train:adapter-saved:v0001", "train:adapter-removed:v0001"):
        name = point.split(":")[1]
        monkeypatch.setenv(crash.ENV, point)
        with pytest.raises(Crashed):
            run(config(tmp_path, name))
        monkeypatch.delenv(crash.ENV)
        resumed = Experiment.resume(tmp_path / name)
        try:
            assert resumed.vdir("v0001").meta().status == "pending"
            resumed.run()
        finally:
            resumed.close()
        got = weights(tmp_path / name, "v0001")
        for k in want:
            assert (got[k] == want[k]).all(), (point, k)
        steps = (tmp_path / name / "versions" / "v0001" / "steps.jsonl").read_text().splitlines()
        assert len(steps) == 2, point


def test_a_version_whose_parent_lost_its_adapter_is_refused_with_the_reason(tmp_path):
    from evotrainer.records.run_dir import RunDirError

    cfg = tiny_cfg(tmp_path / "run", population_size=1, children_per_generation=0, generations=2,
                   steps_per_generation=1)
    exp = Experiment(parse_config(cfg))
    exp.run()
    exp.close()
    # Another generation from a parent whose adapter folder is gone (a disk error, a hand-deleted folder).
    import shutil

    from evotrainer.loop.stages.training import train_version
    from evotrainer.loop.versions import new_version

    exp = Experiment.resume(tmp_path / "run")
    parent = exp.vdir("v0001").meta()
    vid = new_version(exp, parent, exp.vdir("v0001").genome_source(), 2)
    shutil.rmtree(exp.vdir("v0001").adapter_dir)
    with pytest.raises(RunDirError, match=r"v0002's parent v0001 holds no adapter"):
        train_version(exp, vid)
    exp.close()
