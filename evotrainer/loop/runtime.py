"""The heavy parts of a run: tasks, the base model with its LoRA branches, the rollout engine.

Each is created on first use, so ``evotrainer status`` or a resume that only has bookkeeping left
never loads a model.
"""

from __future__ import annotations

import functools
from pathlib import Path

from evotrainer.config import Config
from evotrainer.domains import Domain, Task, build_domain
from evotrainer.domains.sampling import heldout_draws
from evotrainer.loop.budgets import Budgets
from evotrainer.policy.base_model import load_base_model
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.policy.rollout_engine import TransformersEngine

SCRATCH = "_scratch"   # an adapter that keeps the PeftModel alive while branches come and go


class Runtime:
    def __init__(self, cfg: Config, budgets: Budgets):
        self.cfg, self.budgets = cfg, budgets

    @functools.cached_property
    def domain(self) -> Domain:
        return build_domain(self.cfg.domain)

    @functools.cached_property
    def train_tasks(self) -> list[Task]:
        return self.domain.tasks("train")

    @functools.cached_property
    def heldout_tasks(self) -> list[Task]:
        return self.domain.tasks("heldout")[: self.cfg.train.eval_size]

    @functools.cached_property
    def draws(self) -> tuple[list[Task], list[Task]]:
        """(gate draw, selection draw) of the held-out pool (``domains.sampling.heldout_draws``)."""
        return heldout_draws(self.heldout_tasks, self.cfg.evolution.selection_share, self.cfg.seed)

    @property
    def gate_tasks(self) -> list[Task]:
        return self.draws[0]

    @property
    def selection_tasks(self) -> list[Task]:
        return self.draws[1]

    @functools.cached_property
    def test_tasks(self) -> list[Task]:
        """The test split: only the final pick is verified on it, after the loop (nothing in it sees test)."""
        return self.domain.tasks("test")

    @functools.cached_property
    def policy(self) -> Policy:
        with self.budgets.timed("load"):
            model, tok = load_base_model(self.cfg.model, dtype=self.cfg.dtype, device=self.cfg.device,
                                         seed=self.cfg.seed)
            policy = Policy(model, tok, LoraSettings(**self.cfg.lora.model_dump()))
            policy.create(SCRATCH)
        return policy

    @functools.cached_property
    def engine(self) -> TransformersEngine:
        return TransformersEngine(self.policy, batch_size=self.cfg.train.rollout_batch_size)

    def load_adapter(self, vid: str, adapter_dir: Path) -> None:
        """Loads a version's adapter (or a fresh one for a seed with none) under its id."""
        if vid in self.policy.branches:  # (the first use loads the model, timed as "load", not here)
            return
        with self.budgets.timed("adapter"):
            if (adapter_dir / "adapter_config.json").is_file():
                self.policy.load(vid, adapter_dir)
            else:
                self.policy.create(vid)

    def unload_adapter(self, vid: str) -> None:
        if "policy" in self.__dict__ and vid in self.policy.branches:
            with self.budgets.timed("adapter"):
                self.policy.model.set_adapter(SCRATCH)
                self.policy.remove(vid)
