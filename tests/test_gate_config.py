"""The gate's settings: the validity thresholds have one source, config.py's ValidityConfig."""

import ast
import dataclasses
from pathlib import Path

from evotrainer.config import GATE_LEVEL, ValidityConfig, parse_config
from evotrainer.fitness import gate_config as gate_config_module
from evotrainer.fitness.gate_config import GateConfig, gate_config


def test_every_validity_threshold_is_a_gate_setting_with_the_configs_default():
    fields = {f.name: f.default for f in dataclasses.fields(GateConfig)}
    defaults = ValidityConfig().model_dump()
    assert set(defaults) <= set(fields)
    assert {k: fields[k] for k in defaults} == defaults
    assert GateConfig().level == GATE_LEVEL


def test_gate_config_writes_no_threshold_of_its_own():
    """GateConfig reads each validity default from ValidityConfig instead of repeating the number, so
    changing a threshold in config.py changes both; a literal here would be a second source."""
    tree = ast.parse(Path(gate_config_module.__file__).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GateConfig")
    literal = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.value, ast.Constant)}
    assert not literal & set(ValidityConfig.model_fields), literal & set(ValidityConfig.model_fields)


def test_a_runs_validity_settings_reach_its_gate():
    cfg = parse_config({"evolution": {"validity": {"divergence": 0.8, "leak_p": 0.01}, "gate_level": 0.7}, "seed": 4})
    g = gate_config(cfg)
    assert (g.divergence, g.leak_p, g.level, g.seed) == (0.8, 0.01, 0.7, 4)
    assert g.hack_rise == ValidityConfig().hack_rise
