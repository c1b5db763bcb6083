"""The README's code is run, so it cannot drift from the API."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1].joinpath("README.md").read_text()


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
