"""The heavy parts of a run: tasks, the base model with its LoRA branches, the rollout engine.

Each is created on first use, so ``evotrainer status`` or a resume that only has bookkeeping left
never loads a model.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

from evotrainer.config import Config
from evotrainer.domains import Domain, Task, build_domain
from evotrainer.domains.sampling import heldout_draws
from evotrainer.loop.budgets import Budgets
from evotrainer.policy.base_model import load_base_model
from evotrainer.policy.engine_choice import build_engine, resolve_engine, tiny_overrides
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.policy.rollout_engine import RolloutEngine
from evotrainer.records.run_dir import RunDirError

log = logging.getLogger(__name__)

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
    def race_tasks(self) -> list[Task]:
        """The racing gate's further rounds, in the order it draws them: the held-out tasks beyond
        ``train.eval_size`` (never in the gate or selection draw), as many as its cap needs."""
        cap = self.cfg.evolution.race_cap
        if cap is None or self.cfg.train.eval_size is None:
            return []
        return self.domain.tasks("heldout")[self.cfg.train.eval_size:][: max(0, cap - len(self.gate_tasks))]

    @functools.cached_property
    def test_tasks(self) -> list[Task]:
        """The test split: only the final pick is verified on it, after the loop (nothing in it sees test)."""
        return self.domain.tasks("test")

    @functools.cached_property
    def engine_name(self) -> str:
        """"transformers" or "vllm" (``engine: auto`` resolved once, the reason logged)."""
        name, why = resolve_engine(self.cfg)
        log.info("rollout engine: %s (%s)", name, why)
        return name

    @functools.cached_property
    def policy(self) -> Policy:
        with self.budgets.timed("load"):
            # (the tiny model takes the vLLM-sized attention heads when vLLM serves it: one model, both engines)
            model, tok = load_base_model(self.cfg.model, dtype=self.cfg.dtype, device=self.cfg.device,
                                         seed=self.cfg.seed, **tiny_overrides(self.cfg, self.engine_name))
            policy = Policy(model, tok, LoraSettings(**self.cfg.lora.model_dump()),
                            gradient_checkpointing=self.cfg.train.gradient_checkpointing, seed=self.cfg.seed)
            policy.create(SCRATCH)
        return policy

    @functools.cached_property
    def engine(self) -> RolloutEngine:
        policy = self.policy
        with self.budgets.timed("load"):
            return build_engine(self.cfg, policy, self.engine_name)

    def load_adapter(self, vid: str, adapter_dir: Path, fresh_ok: bool = False) -> None:
        """Loads a version's adapter under its id; with ``fresh_ok`` (a seed, before its training)
        a missing one is created fresh. A missing adapter anywhere else is refused: silently
        starting from fresh weights would train or score a different policy than the record says."""
        if vid in self.policy.branches:  # (the first use loads the model, timed as "load", not here)
            return
        with self.budgets.timed("adapter"):
            if (adapter_dir / "adapter_config.json").is_file():
                self.policy.load(vid, adapter_dir)
            elif fresh_ok:
                self.policy.create(vid)
            else:
                raise RunDirError(f"{adapter_dir} holds no adapter (adapter_config.json is missing): the version's "
                                  "weights are lost; restore the folder from a backup, or start the run again")

    def unload_adapter(self, vid: str) -> None:
        if "policy" in self.__dict__ and vid in self.policy.branches:
            with self.budgets.timed("adapter"):
                self.policy.model.set_adapter(SCRATCH)
                self.policy.remove(vid)
                if hasattr(self.__dict__.get("engine"), "drop"):   # a serving engine's copy of the adapter
                    self.engine.drop(vid)

    def return_freed_memory(self) -> None:
        """Hands the heap's free pages back to the OS (glibc's ``malloc_trim``) between stages. glibc
        keeps what a stage freed, so a run's resident size stayed at its largest batch so far: a SWE
        run's long episodes ratcheted one process to 12.8 GB while what it held was a fraction, and
        the kernel stopped it beside a second run. Elsewhere (no glibc) there is nothing to trim."""
        if _LIBC is not None:
            _LIBC.malloc_trim(0)


def _glibc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:   # macOS, musl: no glibc heap to trim
        log.debug("no glibc: freed memory is returned as the platform's allocator decides")
        return None


_LIBC = _glibc()
