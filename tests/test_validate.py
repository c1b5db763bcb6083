"""validate_resources: what a config names is checked before any compute, and ``sandbox: false``
is allowed only for a harness the user names, never with operators that write code."""

import pytest

from evotrainer.config import ConfigError, parse_config
from evotrainer.genome.errors import ContractError
from evotrainer.genome.harness import Harness
from evotrainer.genome.program import HarnessProgram, reference_program
from evotrainer.loop.validate import validate_resources
from tests.test_experiment import tiny_cfg


def cfg(tmp_path, **top):
    return parse_config({**tiny_cfg(tmp_path / "run"), **top})


def test_a_valid_config_passes(tmp_path):
    validate_resources(cfg(tmp_path), loop=True)


def test_no_sandbox_is_refused_with_code_writing_operators(tmp_path):
    c = cfg(tmp_path, sandbox=False)
    c.evolution.operators = {"knobs": 1.0, "llm_diff": 1.0}
    with pytest.raises(ConfigError, match="sandbox.*llm_diff"):
        validate_resources(c, loop=True)
    c.evolution.operators = {"knobs": 1.0, "llm_diff": 0.0}    # weight 0: never drawn, allowed
    validate_resources(c, loop=True)
    c.evolution.operators, c.evolution.mode = {"llm_rewrite": 1.0}, "recipe-search"   # knobs only
    validate_resources(c, loop=True)


def test_no_sandbox_for_a_named_harness_warns_after_the_contract_check(tmp_path):
    harness = tmp_path / "mine.py"
    harness.write_text(reference_program().source)
    said = []
    validate_resources(cfg(tmp_path, sandbox=False, harness=str(harness)), loop=False, say=said.append)
    assert len(said) == 1 and "mine.py" in said[0] and "unsandboxed" in said[0]
    said.clear()
    validate_resources(cfg(tmp_path, sandbox=True, harness=str(harness)), loop=False, say=said.append)
    assert not said
    harness.write_text(reference_program().source + "\ndata = open('/etc/passwd').read()\n")
    with pytest.raises(ConfigError, match="mine.py.*open"):
        validate_resources(cfg(tmp_path, sandbox=False, harness=str(harness)), loop=False, say=said.append)


def test_in_process_hooks_pass_the_contract_check_first():
    hostile = HarnessProgram(reference_program().source + "\nimport os\nos.system('true')\n")
    with pytest.raises(ContractError, match="import of 'os'"):
        Harness(hostile, sandbox=False)
    with Harness(reference_program(), sandbox=False) as h:   # the trusted reference runs in-process
        assert h.reward([{"visible": {"correct": True}}], [{"id": "t"}]) == [1.0]
