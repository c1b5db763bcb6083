"""`evotrainer rerun RUN_DIR VERSION` on a real tiny run (tiny-random model, real peft LoRA, real
sandbox, real MLflow sqlite): a version trained again from the run's records reproduces them bit for
bit on the CPU, the run is never written, reruns never overwrite each other, and bad input is refused."""

import hashlib
import json
import os
import shutil
import time

import pytest
import torch
from safetensors.torch import load_file

from evotrainer.cli.app import main
from evotrainer.config import parse_config
from evotrainer.genome.program import reference_program
from evotrainer.loop.experiment import Experiment
from evotrainer.loop.tools.rerun import RERUN_FILE, starting_weights
from evotrainer.loop.tools.version_compare import compare_versions
from evotrainer.records.version import VersionDir
from tests.loop_runs import mlflow_runs, tiny_cfg


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Two generations of two steps; a reward that varies with the completion (so the tiny random
    model's groups are not all dead and every step moves the weights) and carried AdamW state."""
    root = tmp_path_factory.mktemp("rerun")
    source = reference_program().source.replace(
        'return [1.0 if r["visible"].get("correct") else 0.0 for r in rollouts]',
        'return [float(len(r["completion"]) % 3) for r in rollouts]')
    (root / "harness.py").write_text(source)
    cfg = tiny_cfg(root / "run", generations=2, steps_per_generation=2, operators={"knobs": 1.0})
    cfg["harness"], cfg["train"]["carry_optimizer"] = str(root / "harness.py"), True
    cfg["seed"] = 2   # a seed whose every step has a live group on the tiny model (seeds 0 and 1 have a dead step)
    exp = Experiment(parse_config(cfg))
    exp.run()
    exp.close()
    return root / "run"


def tree(root, skip=("reruns",)):
    """sha256 of every file under root (its top-level ``skip`` folders left out)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).parts[0] not in skip}


def rerun_tags(out):
    return {r.data.tags["evotrainer.rerun_of"]: r for r in mlflow_runs(out)}


def test_a_rerun_reproduces_the_record_bit_for_bit_and_never_writes_the_run(run, capsys):
    before = tree(run)
    recorded = VersionDir(run / "versions" / "v0001")
    meta = recorded.meta()
    assert meta.parents == ["v0000"] and meta.generation == 1

    assert main(["rerun", str(run), "v0001"]) == 0
    out = run / "reruns" / "v0001-1"
    printed = capsys.readouterr().out
    assert "v0001 reproduced bit for bit" in printed and "recorded vs rerun" in printed
    assert "v0000's adapter" in printed and "unchanged since v0001 copied it" in printed
    assert tree(run) == before, "the rerun wrote into the original run"

    # What was recorded, read straight from the two directories (not through the comparison code).
    again = VersionDir(out / "versions" / "v0001")
    old_steps, new_steps = recorded.steps(), again.steps()
    assert len(new_steps) == 2 and [s["step"] for s in new_steps] == [2, 3]   # generation 1's step numbers
    for key in ("loss", "grad_norm", "reward_mean", "reward_std", "mean_logprob", "kept_groups"):
        assert [s[key] for s in new_steps] == [s[key] for s in old_steps], key
    assert all(s["grad_norm"] > 0 for s in new_steps), "the steps trained (the comparison is not of no-ops)"
    for split in ("train", "heldout", "selection"):
        old, new = recorded.rollouts(split), again.rollouts(split)
        assert [(r.task_id, r.seed, r.completion_ids, r.reward, r.advantage, r.hidden) for r in new] == \
               [(r.task_id, r.seed, r.completion_ids, r.reward, r.advantage, r.hidden) for r in old], split
    for key in ("heldout_accuracy", "selection_accuracy", "train_reward_mean", "cost"):
        assert again.meta().metrics[key] == meta.metrics[key], key
    old_w, new_w = load_file(str(recorded.adapter_dir / "adapter_model.safetensors")), \
        load_file(str(again.adapter_dir / "adapter_model.safetensors"))
    parent_w = load_file(str(run / "versions" / "v0000" / "adapter" / "adapter_model.safetensors"))
    assert all(torch.equal(old_w[k], new_w[k]) for k in old_w)
    assert any(not torch.equal(parent_w[k], new_w[k]) for k in new_w), "training moved the weights"
    old_opt = torch.load(recorded.adapter_dir / "optimizer.pt", weights_only=True)
    new_opt = torch.load(again.adapter_dir / "optimizer.pt", weights_only=True)
    assert all(torch.equal(old_opt[i]["exp_avg"], new_opt[i]["exp_avg"]) for i in old_opt)

    # The comparison says which quantities it holds exact and which are floats, and every one is exact here.
    report = json.loads((out / RERUN_FILE).read_text())
    assert report["verdict"] == "exact" and report["start"]["recorded"] is True
    kinds = {c["name"]: c["kind"] for c in report["comparisons"]}
    assert kinds["train completions (token ids)"] == kinds["heldout_accuracy"] == "exact"
    assert kinds["step metric loss"] == kinds["adapter weights"] == kinds["optimizer state"] == "float"
    assert all(c["verdict"] == "exact" for c in report["comparisons"])

    # A second rerun goes to a new directory; the first is left as it was.
    first = tree(out)
    assert main(["rerun", str(run), "v0001"]) == 0
    assert (run / "reruns" / "v0001-2" / RERUN_FILE).is_file() and tree(out) == first
    assert tree(run) == before

    # In MLflow: the rerun's own store, a run tagged as a rerun of the version's run in the original.
    original = {r.data.tags["evotrainer.version_id"]: r.info.run_id for r in mlflow_runs(run)}
    tagged = rerun_tags(out)["v0001"]
    assert tagged.data.tags["evotrainer.rerun_of_run"] == original["v0001"] == report["recorded_run_id"]
    assert tagged.data.tags["evotrainer.rerun"] == "exact"
    assert tagged.data.metrics["loss"] == old_steps[-1]["loss"]
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{out}/mlflow.db")
    assert RERUN_FILE in {a.path for a in client.list_artifacts(tagged.info.run_id)}


def test_a_seed_version_reruns_from_a_fresh_adapter_and_says_it_is_not_recorded(run, tmp_path, capsys):
    before = tree(run, skip=())
    out = tmp_path / "seed-rerun"
    code = main(["rerun", str(run), "v0000", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "the run does not save it" in printed and "did not start from recorded weights" in printed
    report = json.loads((out / RERUN_FILE).read_text())
    assert report["start"]["recorded"] is False
    # The fresh adapter is drawn as the loop drew it (same seed, same order): it reproduces here.
    assert code == 0 and report["verdict"] == "exact"
    assert tree(run, skip=()) == before, "a rerun with --out wrote nothing at all into the run"


def test_a_record_that_differs_is_reported_quantity_by_quantity_and_exits_1(run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("reruns"))   # copy2: file times kept
    vd = VersionDir(copy / "versions" / "v0002")
    steps = vd.steps()
    steps[0]["loss"] = steps[0]["loss"] * (1 + 1e-9) if steps[0]["loss"] else 1e-12   # float noise: within tolerance
    (vd.path / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    meta = vd.meta()
    meta.metrics["heldout_accuracy"] = 1.0                                        # a recorded score it cannot reach
    vd.save_meta(meta)

    assert main(["rerun", str(copy), "v0002"]) == 1
    printed = capsys.readouterr().out
    assert "v0002 does not reproduce" in printed and "heldout_accuracy" in printed
    verdicts = {c["name"]: c["verdict"] for c in
                json.loads((copy / "reruns" / "v0002-1" / RERUN_FILE).read_text())["comparisons"]}
    assert verdicts["step metric loss"] == "within tolerance" and verdicts["heldout_accuracy"] == "differs"
    assert {v for k, v in verdicts.items() if k not in ("step metric loss", "heldout_accuracy")} == {"exact"}
    assert rerun_tags(copy / "reruns" / "v0002-1")["v0002"].data.tags["evotrainer.rerun"] == "differs"


def test_compare_versions_holds_discrete_quantities_exact_and_floats_within_tolerance(run, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(run / "versions" / "v0001", a)
    shutil.copytree(run / "versions" / "v0001", b)
    rows = {c.name: c for c in compare_versions(VersionDir(a), VersionDir(b))}
    assert all(c.verdict == "exact" for c in rows.values())
    lines = (b / "rollouts" / "train.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["completion_ids"][0] += 1                       # one token: discrete, never "close"
    first["logprobs"][0] += 1e-9                          # a float within tolerance
    (b / "rollouts" / "train.jsonl").write_text("\n".join([json.dumps(first)] + lines[1:]) + "\n")
    rows = {c.name: c for c in compare_versions(VersionDir(a), VersionDir(b))}
    assert rows["train completions (token ids)"].verdict == "differs"
    assert rows["train sampler log-probs"].verdict == "within tolerance"
    assert rows["train sampler log-probs"].max_abs_diff == pytest.approx(1e-9, rel=1e-3)
    assert rows["train rewards"].verdict == "exact"


def test_evotrainer_train_trains_a_branch_as_the_loop_trained_its_seed(run, tmp_path):
    """`evotrainer train` runs the loop's own training of a version (BranchTraining): with the run's
    config and as many steps, the branch it writes is the run's seed version v0000 again."""
    from evotrainer.loop.compute.train_branch import train_branch

    cfg = parse_config(json.loads((run / "config.json").read_text()))
    cfg = cfg.model_copy(update={"run_dir": str(tmp_path / "alone")})
    cfg.train.steps = cfg.evolution.steps_per_generation
    said = []
    result = train_branch(cfg, on_step=lambda m: said.append(m["step"]))
    seed, alone = VersionDir(run / "versions" / "v0000"), VersionDir(result.version_dir)
    assert said == [0, 1] and [s["step"] for s in result.steps] == [s["step"] for s in alone.steps()] == [0, 1]
    assert all(s["grad_norm"] > 0 for s in alone.steps()), "the steps trained (the comparison is not of no-ops)"
    assert alone.meta().genome_hash == seed.meta().genome_hash and alone.meta().parents == ["base"]
    rows = {c.name: c for c in compare_versions(seed, alone)}
    trained = [n for n in rows if n.startswith(("train ", "training steps", "step metric", "adapter", "optimizer"))]
    assert {"train completions (token ids)", "step metric loss", "adapter weights", "optimizer state"} <= set(trained)
    assert {n: rows[n].verdict for n in trained} == {n: "exact" for n in trained}
    # Held out: all of train's eval tasks, before and after (the loop splits them into gate and selection draws).
    assert len(alone.rollouts("heldout")) == len(alone.rollouts("heldout_base")) == \
        len(seed.rollouts("heldout")) + len(seed.rollouts("selection"))
    assert not (result.version_dir / ".partial").exists()


def test_a_parent_adapter_written_after_the_child_was_created_is_not_trusted(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("reruns"))
    meta = VersionDir(copy / "versions" / "v0001").meta()
    assert starting_weights(copy, meta)["recorded"] is True
    later = time.time() + 60
    os.utime(copy / "versions" / "v0000" / "adapter" / "adapter_model.safetensors", (later, later))
    start = starting_weights(copy, meta)
    assert start["recorded"] is False and "cannot be confirmed" in start["note"]


@pytest.mark.parametrize("argv, message", [
    (lambda run, tmp: ["rerun", str(run), "v0099"], "has no version 'v0099'; its versions: v0000, v0001"),
    (lambda run, tmp: ["rerun", str(tmp), "v0001"], "not a directory evotrainer wrote"),
    (lambda run, tmp: ["rerun", str(tmp / "missing"), "v0001"], "does not exist"),
    (lambda run, tmp: ["rerun", str(run), "v0001", "--out", str(run / "versions" / "x")], "lies inside the run"),
    (lambda run, tmp: ["rerun", str(run), "v0001", "--out", str(run.parent / "harness.py")], "is not empty"),
])
def test_bad_input_is_refused_with_the_reason_and_nothing_written(run, tmp_path, capsys, argv, message):
    before = tree(run, skip=())
    assert main(argv(run, tmp_path)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert tree(run, skip=()) == before


def test_a_version_that_was_never_trained_is_refused(run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("reruns"))
    (copy / "versions" / "v0003" / "steps.jsonl").unlink()
    assert main(["rerun", str(copy), "v0003"]) == 2
    assert "v0003 was never trained and verified" in capsys.readouterr().err
    assert not (copy / "reruns").exists()


def test_train_can_start_from_a_saved_adapter(run, tmp_path):
    """`train_branch(init_adapter=...)` trains on from a version's adapter, not from fresh weights (whose
    LoRA B matrices are zero): with no steps the version it writes holds the saved weights exactly, the
    source folder is left as it was, and the version says where it started."""
    from evotrainer.loop.compute.train_branch import train_branch

    source = run / "versions" / "v0000" / "adapter"
    saved, before = load_file(source / "adapter_model.safetensors"), tree(source, skip=())
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in saved.items()), "a trained adapter"
    cfg = parse_config(json.loads((run / "config.json").read_text()))
    cfg = cfg.model_copy(update={"run_dir": str(tmp_path / "cont")})
    cfg.train.steps = 0
    result = train_branch(cfg, init_adapter=source)
    got = load_file(result.version_dir / "adapter" / "adapter_model.safetensors")
    assert got.keys() == saved.keys() and all(torch.equal(got[k], saved[k]) for k in saved)
    assert json.loads((result.version_dir / "init_adapter.json").read_text())["from"] == str(source.resolve())
    assert tree(source, skip=()) == before


@pytest.mark.parametrize("spoil, message", [
    (lambda a: (a / "adapter_config.json").unlink(), "holds no adapter_config.json"),
    (lambda a: (a / "adapter_config.json").write_text(
        json.dumps({**json.loads((a / "adapter_config.json").read_text()), "r": 4})), "r 4 (config: 16)"),
])
def test_train_from_an_adapter_it_cannot_use_is_refused_before_any_compute(run, tmp_path, capsys, spoil, message):
    adapter = tmp_path / "adapter"
    shutil.copytree(run / "versions" / "v0000" / "adapter", adapter)
    spoil(adapter)
    out = tmp_path / "out"
    assert main(["train", str(run / "config.json"), "--run-dir", str(out), "--init-adapter", str(adapter)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: init adapter") and message in err and "Traceback" not in err
    assert not out.exists()
