"""EvoTrainer: train LLM policies with RL while evolving the training harness itself.

The public API is imported lazily (``from evotrainer import train_branch``) so that light
commands and the sandbox worker do not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = {
    "Config": "evotrainer.config", "load_config": "evotrainer.config", "parse_config": "evotrainer.config",
    "ConfigError": "evotrainer.config",
    "Task": "evotrainer.domains.task", "get_domain": "evotrainer.domains",
    "Rollout": "evotrainer.records.rollout", "Group": "evotrainer.records.rollout",
    "load_base_model": "evotrainer.policy.base_model", "Policy": "evotrainer.policy.lora",
    "LoraSettings": "evotrainer.policy.lora", "TransformersEngine": "evotrainer.policy.rollout_engine",
    "SamplingParams": "evotrainer.policy.rollout_engine", "GRPOConfig": "evotrainer.policy.grpo",
    "GRPOTrainer": "evotrainer.policy.grpo", "train_branch": "evotrainer.loop.compute.train_branch",
    "HarnessProgram": "evotrainer.genome.program", "Harness": "evotrainer.genome.harness",
    "BranchVersion": "evotrainer.records.version", "VersionDir": "evotrainer.records.version",
    "Experiment": "evotrainer.loop.experiment",
}

__all__ = sorted(_API) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'evotrainer' has no attribute {name!r}")
