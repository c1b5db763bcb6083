"""Config validation and `evotrainer train` end to end on the tiny model (real sandbox, real LoRA)."""

import json
from pathlib import Path

import pytest
import yaml

from evotrainer.records.version import VersionDir
from evotrainer.cli.app import main
from evotrainer.config import ConfigError, load_config, parse_config


def test_unknown_field_names_field_and_allowed_values():
    with pytest.raises(ConfigError) as e:
        parse_config({"grpo": {"loss_typ": "dapo"}}, "my.yaml")
    msg = str(e.value)
    assert "my.yaml" in msg and "grpo.loss_typ" in msg and "loss_type" in msg


def test_wrong_choice_lists_the_allowed_values():
    with pytest.raises(ConfigError, match=r"grpo.loss_type.*'grpo', 'bnpo', 'dr_grpo' or 'dapo'.*'ppo'"):
        parse_config({"grpo": {"loss_type": "ppo"}})


def test_wrong_type_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="train.steps"):
        parse_config({"train": {"steps": "many"}})
    bad = tmp_path / "bad.yaml"
    bad.write_text("grpo: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_examples_and_benchmark_configs_are_valid_configs():
    root = Path(__file__).resolve().parents[1]
    paths = sorted((root / "examples").glob("*.yaml")) + sorted((root / "benchmarks" / "configs").glob("*.yaml"))
    assert len(paths) >= 8
    for path in paths:
        load_config(path)   # raises ConfigError naming the field


def test_train_command_end_to_end_on_tiny_model(tmp_path, capsys):
    run_dir = tmp_path / "run"
    cfg = {
        "model": "tiny-random", "run_dir": str(run_dir),
        "domain": {"difficulty": 2, "n_train": 12, "n_heldout": 4, "n_test": 4},
        "grpo": {"max_completion_length": 32, "num_generations": 2, "learning_rate": 1e-3},
        "train": {"steps": 2, "prompts_per_step": 2, "eval_max_new_tokens": 6},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path)]) == 0
    out = capsys.readouterr().out
    assert "held-out accuracy" in out and "dead_group_" in out
    v = VersionDir(run_dir)
    meta = v.meta()
    assert meta.base_model == "tiny-random" and meta.genome_hash
    assert 0.0 <= meta.metrics["heldout_accuracy"] <= 1.0
    train = v.rollouts("train")
    assert len(train) == 2 * 2 * 2  # steps × prompts × generations
    assert all(r.reward is not None and r.visible and not r.hidden for r in train)
    heldout = v.rollouts("heldout")
    assert len(heldout) == 4 and all("correct" in r.hidden and "correct" not in r.visible for r in heldout)
    steps = v.steps()
    assert [s["step"] for s in steps] == [0, 1]
    assert {"reward_mean", "dead_group_ratio", "grad_norm", "clip_ratio", "kl"} <= set(steps[0])
    assert (v.adapter_dir / "adapter_config.json").is_file()
    assert json.loads((run_dir / "config.json").read_text())["model"] == "tiny-random"


def test_train_command_reports_config_errors(tmp_path, capsys):
    path = tmp_path / "cfg.yaml"
    path.write_text("grpo: {loss_type: ppo}\n")
    assert main(["train", str(path)]) == 2
    assert "grpo.loss_type" in capsys.readouterr().err


def test_config_reference_documents_every_field():
    """The docs' config reference (generated from the model by docs/gen_reference.py at every site build)
    has a row, with a meaning, for every field path, optional sections included: a new field without a
    description fails here until it has one."""
    import importlib.util
    import re
    from pathlib import Path
    from typing import get_args

    from pydantic import BaseModel

    from evotrainer.config import Config

    hook = Path(__file__).resolve().parents[1] / "docs" / "gen_reference.py"
    spec = importlib.util.spec_from_file_location("gen_reference", hook)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    rows = {}
    for line in gen.config_reference().splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        rows[cells[0]] = cells

    def paths(model, prefix=""):
        for name, f in model.model_fields.items():
            sections = [m for m in (f.annotation, *get_args(f.annotation))
                        if isinstance(m, type) and issubclass(m, BaseModel)]
            if sections:
                yield from paths(sections[0], f"{prefix}{name}.")
            else:
                yield f"{prefix}{name}"

    expected = list(paths(Config))
    assert "domain.episode.max_turns" in expected and "evolution.budget.wall_time_s" in expected
    missing = [p for p in expected if f"`{p}`" not in rows]
    assert not missing, f"the config reference lacks rows for: {missing}"
    undescribed = [p for p in expected if not rows[f"`{p}`"][3]]
    assert not undescribed, f"config fields with no meaning (add a description= or a note): {undescribed}"
    assert len(rows) == len(expected), f"rows for no field: {sorted(set(rows) - {f'`{p}`' for p in expected})}"


def test_knob_override_outside_the_harness_space_is_a_config_error(tmp_path, capsys):
    from evotrainer.cli.app import main

    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({"model": "tiny-random", "run_dir": str(tmp_path / "r"),
                                    "grpo": {"max_completion_length": 7}}))
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert "max_completion_length" in err and "[32, 64, 128, 256]" in err
