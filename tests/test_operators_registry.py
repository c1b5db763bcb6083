"""Registry (built-ins, decorator, entry points, the example plugin), OperatorMix, structural
crossover, and the `mutate` command."""

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import tomllib

from evotrainer.genome import reference_program
from evotrainer.genome.edits import rewrite_hook
from evotrainer.operators import (
    Evidence,
    OperatorError,
    OperatorMix,
    available_operators,
    get_operator,
    register_operator,
    registry,
    run_operator,
)
from evotrainer.cli.mutate import main as mutate_main

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_FILE = ROOT / "evotrainer" / "genome" / "reference_harness.py"


def reference():
    return reference_program()


@pytest.fixture
def clean_registry(monkeypatch):
    monkeypatch.setattr(registry, "_registered", {})


def test_builtins_are_available_by_name():
    names = available_operators()
    for name in ("llm_diff", "llm_rewrite", "llm_crossover", "llm_repair", "knobs", "crossover"):
        assert name in names
        assert get_operator(name).name == name


def test_unknown_operator_lists_the_known_ones():
    with pytest.raises(KeyError, match="unknown operator 'nope'; known operators: .*knobs.*llm_diff"):
        get_operator("nope")
    with pytest.raises(KeyError, match="unknown operator.*nope"):
        OperatorMix({"knobs": 1.0, "nope": 1.0})


def test_decorator_registration(clean_registry):
    @register_operator("always_fails")
    class AlwaysFails:
        name = "always_fails"

        def __init__(self, why="no idea"):
            self.why = why

        def propose(self, parents, evidence):
            raise OperatorError(self.why, "input")

    op = get_operator("always_fails", why="testing")
    assert "always_fails" in available_operators() and op.why == "testing"
    with pytest.raises(ValueError, match="already registered"):
        register_operator("knobs")(AlwaysFails)


def test_user_operator_from_an_entry_point(tmp_path, monkeypatch):
    (tmp_path / "my_ops.py").write_text(
        "from evotrainer.operators import OperatorError\n"
        "class Halve:\n"
        "    name = 'halve_lr'\n"
        "    def __init__(self, factor=0.5):\n"
        "        self.factor = factor\n"
        "    def propose(self, parents, evidence):\n"
        "        raise OperatorError('not today', 'input')\n"
    )
    dist = tmp_path / "my_ops-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-ops\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[evotrainer.operators]\nhalve_lr = my_ops:Halve\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "halve_lr" in available_operators()
    op = get_operator("halve_lr", factor=0.25)
    assert op.name == "halve_lr" and op.factor == 0.25
    monkeypatch.delitem(sys.modules, "my_ops", raising=False)


def test_the_example_plugin_declares_a_working_entry_point(tmp_path, monkeypatch):
    """examples/custom_operator: its pyproject's entry point, installed as pip would, gives a working operator."""
    example = ROOT / "examples" / "custom_operator"
    eps = tomllib.loads((example / "pyproject.toml").read_text())["project"]["entry-points"]["evotrainer.operators"]
    dist = tmp_path / "evotrainer_double_lr-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: evotrainer-double-lr\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[evotrainer.operators]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(example))
    parent = reference()
    iv = get_operator("double_lr", seed=0).propose([parent], Evidence())
    lr = parent.knobs["learning_rate"]["value"]
    assert iv.factor == "knob:learning_rate" and iv.details["new"] in (lr * 2, lr / 2)
    again = get_operator("double_lr", seed=0).propose([parent], Evidence(known_hashes={iv.child_hash}))
    assert again.details["new"] != iv.details["new"]     # the other direction when one is known
    monkeypatch.delitem(sys.modules, "double_lr", raising=False)


def test_run_operator_turns_a_crashing_plugin_into_a_rejection(clean_registry):
    @register_operator("crashes")
    class Crashes:
        name = "crashes"

        def propose(self, parents, evidence):
            return {}["missing"]

    stats = {}
    with pytest.raises(OperatorError, match="KeyError"):
        run_operator(get_operator("crashes"), [reference()], Evidence(), stats)
    assert stats["crashes"].proposals == 1 and stats["crashes"].rejections == {"input": 1}


def test_mix_draws_by_weight_and_skips_two_parent_operators_for_one_parent():
    mix = OperatorMix({"knobs": 3.0, "crossover": 1.0, "llm_diff": 0.0}, seed=0)
    draws = Counter(mix.choose_name(n_parents=2) for _ in range(400))
    assert draws["llm_diff"] == 0 and 2.2 < draws["knobs"] / draws["crossover"] < 4.2
    assert {mix.choose_name(n_parents=1) for _ in range(50)} == {"knobs"}
    with pytest.raises(ValueError, match="at least one > 0"):
        OperatorMix({"knobs": 0.0})


def test_mix_is_reproducible_by_seed():
    a = OperatorMix({"knobs": 1.0, "crossover": 1.0}, seed=7)
    b = OperatorMix({"knobs": 1.0, "crossover": 1.0}, seed=7)
    assert [a.choose_name(2) for _ in range(30)] == [b.choose_name(2) for _ in range(30)]


def two_factor_parent(a):
    reward = '''def reward(rollouts, tasks):
    return [1.0 if r["visible"].get("correct") else 0.2 for r in rollouts]'''
    return rewrite_hook(a.with_knobs(temperature=1.3, beta=0.05), "reward", reward)


def test_structural_crossover_takes_one_factor_from_the_second_parent():
    a = reference()
    b = two_factor_parent(a)
    taken = set()
    for seed in range(4):
        iv = get_operator("crossover", seed=seed).propose([a, b], Evidence())
        assert iv.parent_hashes == [a.hash, b.hash] and iv.factors == [iv.factor]
        assert iv.factor in ("knob:temperature", "knob:beta", "hook:reward")
        taken.add(iv.factor)
    assert len(taken) >= 2
    # Alerts that name a factor make it the first choice.
    ev = Evidence(health_report={"alerts": [{"name": "insufficient_signal", "suggestion": "change the reward"}]})
    assert get_operator("crossover", seed=0).propose([a, b], ev).factor == "hook:reward"
    assert get_operator("crossover", factor="knob:beta").propose([a, b], Evidence()).child().knobs["beta"]["value"] == 0.05


def test_structural_crossover_skips_known_children_and_reports_when_none_is_left():
    a = reference()
    b = a.with_knobs(temperature=1.3)
    # b differs from a in one factor, so the only child is b itself: a duplicate of a parent.
    with pytest.raises(OperatorError) as err:
        get_operator("crossover").propose([a, b], Evidence())
    assert err.value.kind == "duplicate"
    with pytest.raises(OperatorError, match="do not differ"):
        get_operator("crossover").propose([a, a], Evidence())
    with pytest.raises(OperatorError, match="needs two parents"):
        get_operator("crossover").propose([a], Evidence())
    c = two_factor_parent(a)
    known = {get_operator("crossover", factor=f).propose([a, c], Evidence()).child_hash
             for f in ("knob:temperature", "knob:beta")}
    assert get_operator("crossover", seed=1).propose([a, c], Evidence(known_hashes=known)).factor == "hook:reward"


def test_mutate_command_prints_an_intervention(capsys):
    assert mutate_main(["mutate", str(REFERENCE_FILE), "--operator", "knobs", "--seed", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["operator"] == "knobs" and out["factor"].startswith("knob:") and out["diff"].startswith("--- a/")


def test_mutate_command_rejections_exit_1(tmp_path, capsys):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"metrics": {"dead_group_ratio": 0.9}, "alerts": []}))
    assert mutate_main(["mutate", str(REFERENCE_FILE), "--operator", "crossover", "--evidence", str(report)]) == 1
    err = json.loads(capsys.readouterr().err)
    assert err == {"rejected": True, "operator": "crossover", "kind": "input", "reason": "crossover needs two parents"}
    assert mutate_main(["mutate", str(REFERENCE_FILE), "--operator", "nope"]) == 2   # a usage error
    assert "known operators" in capsys.readouterr().err
