"""The README is the front door: its Python quickstart is run (on the tiny random model with small sizes,
the only changes), its commands are parsed by the real CLI parser, its links lead somewhere, and it
stays short enough to read (everything else lives in the docs site, docs/)."""

import os
import re
from pathlib import Path

import yaml

from evotrainer.config import parse_config
from tests.markdown_blocks import assert_commands_parse, python_quickstart

ROOT = Path(__file__).resolve().parents[1]
README = ROOT.joinpath("README.md").read_text()

# What the quickstart's configs get on top of the files it names: the tiny model and tiny sizes.
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


def run_quickstart(code: str, tmp_path, monkeypatch, source: str) -> None:
    """Runs the quickstart block with every `load_config(FILE)` given the tiny model and sizes."""
    assert code.count("load_config(") == 2

    def small_config(path):
        data = yaml.safe_load((ROOT / path).read_text())
        over = {**SMALL, "run_dir": str(tmp_path / Path(data["run_dir"]).name)}
        if "evolution" not in data:
            over.pop("evolution")
        return parse_config(_merge(data, over), str(path))

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(ROOT)
    exec(compile(code.replace("load_config(", "small_config("), source, "exec"),
         {"__name__": "quickstart", "small_config": small_config})
    assert (tmp_path / "train_math").is_dir() and (tmp_path / "quickstart" / "state.json").is_file()
    assert os.path.isdir(tmp_path / "quickstart" / "versions")


def test_readme_python_quickstart_runs_on_the_tiny_model(tmp_path, monkeypatch):
    run_quickstart(python_quickstart(README), tmp_path, monkeypatch, "README.md")


def test_readme_commands_parse_and_name_the_files_that_exist():
    parsed = assert_commands_parse(README, "README.md")
    commands = {argv[0] for argv in parsed}
    assert {"run", "status", "lineage", "resume", "train", "report"} <= commands
    for argv in parsed:
        for arg in argv:
            if arg.endswith(".yaml"):
                assert (ROOT / arg).is_file(), f"README names {arg}, which does not exist"


def test_readme_names_the_two_commands_and_links_to_the_docs():
    assert "make demo" in README and "make test" in README
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if "://" not in link]
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"
    for page in ("docs/architecture.md", "docs/getting-started/quickstart.md", "docs/reference/config.md",
                 "docs/reference/cli.md", "docs/benchmarks.md"):
        assert page in local, f"README does not link to {page}"


def test_readme_stays_a_front_door():
    """The manual lives in docs/; the README says what it is, how to start, and where to read on."""
    assert len(README.splitlines()) <= 200


def test_make_demo_runs_the_co_evolution_quickstart_as_the_readme_says():
    """`make demo` is the loop on examples/quickstart.yaml: a population of 4, at least 3 generations,
    a local LLM operator plus knobs and crossover, on the embedded model, with a wall-time cap."""
    from evotrainer.config import load_config

    makefile = ROOT.joinpath("Makefile").read_text()
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "evotrainer run examples/quickstart.yaml" in recipe
    assert "evotrainer run examples/quickstart.yaml" in README
    cfg = load_config(ROOT / "examples" / "quickstart.yaml")
    ev = cfg.evolution
    assert cfg.model == "smollm2-135m" and cfg.domain.name == "math" and ev.mode == "evolve"
    assert ev.population_size == 4 and ev.generations >= 3 and ev.llm.base_url is None
    assert {"knobs", "crossover"} <= set(ev.operators) and any(op.startswith("llm_") for op in ev.operators)
    assert ev.budget.wall_time_s is not None


def test_the_front_pages_claim_on_gpus_only_what_was_measured():
    """The opening paragraph of the README and of the docs' home says what ran on a GPU (the transformers
    engine, one H200, random-init weights) and that vLLM on CUDA is not measured, never "unchanged"."""
    for name, text in (("README.md", README), ("docs/index.md", ROOT.joinpath("docs", "index.md").read_text())):
        intro = " ".join(text.split("```", 1)[0].split())
        assert "unchanged" not in intro, name
        assert "transformers engine has run the loop on one H200 with random-init weights" in intro, name
        assert "vLLM on CUDA is not measured" in intro, name
