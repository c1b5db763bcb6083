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
