"""The README's Python code is run (the operator snippet as written; the Python API block on the tiny
random model with small sizes, the only changes), so it cannot drift from the API. The harness-contract
block is a signature listing, not a program: the contract tests check those signatures."""

import os
import re
from pathlib import Path

import yaml

from evotrainer.config import parse_config

ROOT = Path(__file__).resolve().parents[1]
README = ROOT.joinpath("README.md").read_text()

# What the API block's configs get on top of the files it names: the tiny model and tiny sizes.
SMALL = {"model": "tiny-random", "domain": {"n_train": 16, "n_heldout": 4, "n_test": 4},
         "grpo": {"num_generations": 2, "max_completion_length": 32},
         "train": {"steps": 1, "prompts_per_step": 2, "eval_max_new_tokens": 6},
         "evolution": {"population_size": 2, "children_per_generation": 1, "generations": 2, "steps_per_generation": 1,
                       "llm": {"model": "tiny-random", "max_tokens": 32}}}


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def test_readme_python_api_block_runs_on_the_tiny_model(tmp_path, monkeypatch):
    code = re.search(r"```python\n(from evotrainer import \(.*?)```", README, re.S).group(1)
    assert code.count('"smollm2-135m"') == 1 and code.count("load_config(") == 2
    code = code.replace('load_base_model("smollm2-135m")', 'load_base_model("tiny-random")')

    def small_config(path):
        data = yaml.safe_load((ROOT / path).read_text())
        over = {**SMALL, "run_dir": str(tmp_path / Path(data["run_dir"]).name)}
        if "evolution" not in data:
            over.pop("evolution")
        return parse_config(_merge(data, over), str(path))

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(ROOT)
    scope = {"__name__": "readme"}
    exec(compile(code.replace("load_config(", "small_config("), "README.md", "exec"),
         {**scope, "small_config": small_config})
    assert (tmp_path / "train_math").is_dir() and (tmp_path / "quickstart" / "state.json").is_file()
    assert os.path.isdir(tmp_path / "quickstart" / "versions")


def test_readme_custom_operator_snippet_works():
    from evotrainer.genome.program import reference_program
    from evotrainer.operators import Evidence, get_operator
    from evotrainer.operators import registry

    code = re.search(r"```python\n(from evotrainer.operators import register_operator.*?)```", README, re.S).group(1)
    try:
        exec(compile(code, "README.md", "exec"), {})
        iv = get_operator("double_lr").propose([reference_program()], Evidence())
        assert iv.factor == "knob:learning_rate" and iv.child().knob_values["learning_rate"] > 1e-4
    finally:
        registry._registered.pop("double_lr", None)  # leave the registry as other tests expect it


def test_readme_names_both_commands_and_the_loop_commands():
    for cmd in ("make demo", "make test", "evotrainer run", "evotrainer resume", "evotrainer status",
                "evotrainer approve", "evotrainer lineage", "evotrainer report", "evotrainer backtest",
                "evotrainer genome check", "evotrainer genome run", "evotrainer mutate", "evotrainer skills"):
        assert cmd in README, cmd


def test_make_demo_runs_the_co_evolution_quickstart_as_the_readme_says():
    """`make demo` is the loop on examples/quickstart.yaml: a population of 4, at least 3 generations,
    a local LLM operator plus knobs and crossover, on the embedded model, with a wall-time cap."""
    from evotrainer.config import load_config

    root = Path(__file__).resolve().parents[1]
    makefile = root.joinpath("Makefile").read_text()
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "evotrainer run examples/quickstart.yaml" in recipe
    assert "evotrainer run examples/quickstart.yaml" in README
    cfg = load_config(root / "examples" / "quickstart.yaml")
    ev = cfg.evolution
    assert cfg.model == "smollm2-135m" and cfg.domain.name == "math" and ev.mode == "evolve"
    assert ev.population_size == 4 and ev.generations >= 3 and ev.llm.base_url is None
    assert {"knobs", "crossover"} <= set(ev.operators) and any(op.startswith("llm_") for op in ev.operators)
    assert ev.budget.wall_time_s is not None
