"""validate_resources: what a config names is checked before any compute, and ``sandbox: false``
is allowed only for a harness the user names, never with operators that write code."""

import pytest

from evotrainer.config import ConfigError, parse_config
from evotrainer.genome.contract import check_contract
from evotrainer.genome.errors import ContractError
from evotrainer.genome.harness import Harness
from evotrainer.genome.program import HarnessProgram, reference_program
from evotrainer.loop.tools.validate import validate_resources
from tests.loop_runs import tiny_cfg


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
    warnings = [s for s in said if s.startswith("warning")]   # (the engine choice is said too)
    assert len(warnings) == 1 and "mine.py" in warnings[0] and "unsandboxed" in warnings[0]
    said.clear()
    validate_resources(cfg(tmp_path, sandbox=True, harness=str(harness)), loop=False, say=said.append)
    assert not [s for s in said if s.startswith("warning")]
    harness.write_text(reference_program().source + "\ndata = open('/etc/passwd').read()\n")
    with pytest.raises(ConfigError, match="mine.py.*open"):
        validate_resources(cfg(tmp_path, sandbox=False, harness=str(harness)), loop=False, say=said.append)


def test_in_process_hooks_pass_the_contract_check_first():
    hostile = HarnessProgram(reference_program().source + "\nimport os\nos.system('true')\n")
    with pytest.raises(ContractError, match="import of 'os'"):
        Harness(hostile, sandbox=False)
    with Harness(reference_program(), sandbox=False) as h:   # the trusted reference runs in-process
        assert h.reward([{"visible": {"correct": True}}], [{"id": "t"}]) == [1.0]


# ---- knobs nothing reads (issue 14) ------------------------------------------------------------
OWN_ADVANTAGES = '''
def advantages(groups, rewards):
    return [[r - sum(rs) / len(rs) for r in rs] for rs in rewards]
'''


def test_trainer_config_has_no_field_training_ignores():
    """scale_rewards (only the advantages hook reads it) and gradient_accumulation_steps (micro-batches
    always accumulate into one step) were GRPOConfig fields that training never read."""
    from evotrainer.policy.grpo_config import TRAINER_SETTINGS
    assert "scale_rewards" not in TRAINER_SETTINGS and "gradient_accumulation_steps" not in TRAINER_SETTINGS


def test_a_declared_knob_nothing_reads_is_a_contract_error_naming_it(tmp_path):
    ref = reference_program()
    # A trainer setting, or a knob a (fallback reference) hook reads, is fine.
    check_contract(ref)
    # The genome's own advantages ignores scale_rewards: the knob would be dropped silently.
    dead = HarnessProgram(ref.source + OWN_ADVANTAGES)
    with pytest.raises(ContractError, match="'scale_rewards'.*nothing reads it"):
        check_contract(dead)
    # ... unless its own code reads it.
    check_contract(HarnessProgram(ref.source + OWN_ADVANTAGES.replace(
        "return", "_ = KNOBS['scale_rewards']['value']\n    return")))
    # TRL's gradient_accumulation_steps is no setting of this trainer, and no hook reads it.
    ga = ref.source.replace('KNOBS = {', 'KNOBS = {\n    "gradient_accumulation_steps": {"value": 2, "choices": [1, 2]},', 1)
    with pytest.raises(ContractError, match="gradient_accumulation_steps"):
        check_contract(HarnessProgram(ga))
    # At validation time it is a ConfigError naming the file.
    path = tmp_path / "dead.py"
    path.write_text(dead.source)
    with pytest.raises(ConfigError, match="dead.py.*scale_rewards"):
        validate_resources(cfg(tmp_path, harness=str(path)), loop=False)


def test_a_grpo_override_nothing_would_read_is_refused(tmp_path):
    """grpo.scale_rewards on a harness without that knob reached no hook: it was dropped."""
    path = tmp_path / "noknobs.py"
    path.write_text("def reward(rollouts, tasks):\n    return [1.0 for _ in rollouts]\n")
    c = cfg(tmp_path, harness=str(path))
    c.grpo.scale_rewards = "none"
    with pytest.raises(ConfigError, match="grpo.scale_rewards"):
        validate_resources(c, loop=False)
    c.grpo.scale_rewards, c.grpo.learning_rate = None, 3e-4   # a trainer setting: read by GRPOConfig
    validate_resources(c, loop=False)


def test_a_local_llm_operator_model_this_machine_lacks_is_refused_before_compute(tmp_path):
    c = cfg(tmp_path)
    c.evolution.operators = {"llm_choice": 1.0}
    c.evolution.llm.model = "no-such-model"
    with pytest.raises(ConfigError, match=r"field 'evolution.llm.model': 'no-such-model' is not a local model"):
        validate_resources(c, loop=True)
    c.evolution.llm.base_url = "http://127.0.0.1:9/v1"   # a server names its own models: not checked here
    validate_resources(c, loop=True)
    c.evolution.llm.base_url, c.evolution.operators = None, {"knobs": 1.0}   # no LLM operator drawn
    validate_resources(c, loop=True)


def test_empty_lora_targets_are_refused_before_the_model_loads(tmp_path):
    c = cfg(tmp_path)
    c.lora.target_modules = []
    with pytest.raises(ConfigError, match=r"field 'lora.target_modules': empty"):
        validate_resources(c, loop=False)


def test_ray_workers_on_cuda_must_reserve_a_gpu_and_shared_gpus_must_fit_their_vllm_engines(tmp_path, monkeypatch):
    """Ray hides the GPUs a worker did not reserve: device cuda with ray.num_gpus_per_branch 0 trained
    on no GPU. Two workers on one GPU each start a vLLM engine at vllm.gpu_memory_utilization. The
    driver's own CUDA is not asked (on a cluster it is often a CPU head node)."""
    import evotrainer.loop.tools.validate as validate

    monkeypatch.setattr(validate, "ray_installed", lambda: True)   # the rule under test, not the install
    with pytest.raises(ConfigError, match="ray.num_gpus_per_branch': 0 with device: cuda"):
        validate_resources(cfg(tmp_path, executor="ray", device="cuda"), loop=True)
    shared = {"executor": "ray", "device": "cuda", "engine": "vllm", "ray": {"num_gpus_per_branch": 0.25}}
    with pytest.raises(ConfigError, match="4 workers share a GPU .* 120% before any training memory"):
        validate._executor(cfg(tmp_path, **shared))
    validate._executor(cfg(tmp_path, **shared, vllm={"gpu_memory_utilization": 0.15}))   # 60%: fits
    validate._device(cfg(tmp_path, executor="ray", device="cuda"))   # no CUDA on this driver: not its business
    with pytest.raises(ConfigError, match="not available here"):
        validate._device(cfg(tmp_path, device="cuda"))
