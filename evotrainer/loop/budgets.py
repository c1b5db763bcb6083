"""Budgets: what a run has spent (steps, tokens, LLM calls and cost, wall time) and the limits.

Spending lives in ``RunState.budget_used`` so that it survives resume; :meth:`Budgets.timed` also
records where the wall time went (``<key>_seconds``), which ``status`` and the summary print.
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Callable

from evotrainer.config import Config
from evotrainer.operators.llm_client import TokenBudget
from evotrainer.records.run_state import RunState


class BudgetReached(Exception):
    pass


# budget_used["<key>_seconds"] as the summary names them
TIME_LABELS = {"gen": "rollouts", "train": "gradient steps", "verify": "held-out verification", "propose": "proposals",
               "backtest": "backtests", "record": "MLflow", "health": "health reports", "gate": "gates",
               "adapter": "adapter load/save", "load": "model load", "finish": "lineage and plots",
               "test": "test split of the final pick", "race": "racing gate rounds"}
LIMITS = ("train_steps", "rollout_tokens", "wall_time_s", "llm_calls", "llm_tokens", "llm_cost_usd")


class Budgets:
    """The run's spending and limits.

    ``train_steps`` is checked before each version starts, never inside one: siblings must train the
    same k steps for the paired gate to compare harnesses, not step counts. So a run stops with at
    most ``budget.train_steps + k - 1`` steps spent (k = ``evolution.steps_per_generation``), and the
    versions that did not start are pruned with the reason. Versions started together (lock-step
    training on vLLM, Ray workers) are decided on ``train_steps`` as one by one (:meth:`steps_reached_with`);
    the other budgets are checked as each starts, so they all start on what was spent before. LLM calls are counted when reserved,
    before the request goes out, and persisted at once through ``persist`` (the run's state save).
    """

    def __init__(self, cfg: Config, state: RunState, persist: Callable[[], None] | None = None):
        self.cfg, self.state, self.persist = cfg, state, persist

    @functools.cached_property
    def llm(self) -> TokenBudget:
        """The LLM budget the operators' clients charge, restored from what the run already spent."""
        b, llm = self.cfg.evolution.budget, self.cfg.evolution.llm
        used = self.state.budget_used
        budget = TokenBudget(b.llm_calls, b.llm_tokens, b.llm_cost_usd, llm.usd_per_1m_prompt_tokens,
                             llm.usd_per_1m_completion_tokens, on_change=self._llm_changed)
        budget.calls, budget.prompt_tokens = int(used.get("llm_calls", 0)), int(used.get("llm_tokens", 0))
        budget.cost_usd = float(used.get("llm_cost_usd", 0.0))
        return budget

    def _llm_changed(self) -> None:
        self.sync_llm()
        if self.persist:
            self.persist()

    def sync_llm(self) -> None:
        """Copies what the LLM clients spent into the run state (saved with it)."""
        if "llm" in self.__dict__:
            self.state.budget_used["llm_calls"] = self.llm.calls
            self.state.budget_used["llm_tokens"] = self.llm.tokens
            self.state.budget_used["llm_cost_usd"] = self.llm.cost_usd

    @contextlib.contextmanager
    def timed(self, key: str):
        """Adds the block's wall seconds to ``budget_used[key_seconds]``: where a run's time went."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.spend(**{f"{key}_seconds": time.perf_counter() - t0})

    def spend(self, **amounts: float) -> None:
        for k, v in amounts.items():
            self.state.budget_used[k] = self.state.budget_used.get(k, 0) + v

    def steps_reached_with(self, planned: int) -> bool:
        """Whether the train_steps budget is spent once ``planned`` more steps are: how an executor that
        starts several versions at once decides each one as starting them one after another would."""
        limit = self.cfg.evolution.budget.train_steps
        return limit is not None and self.state.budget_used.get("train_steps", 0) + planned >= limit

    def guard(self) -> None:
        """Raises BudgetReached when any configured budget is spent."""
        b, used = self.cfg.evolution.budget, self.state.budget_used
        self.sync_llm()
        for name in LIMITS:
            limit = getattr(b, name)
            if limit is not None and used.get(name, 0) >= limit:
                raise BudgetReached(f"{name} budget spent ({used[name]:.4g} of {limit})")
