"""The operators a run proposes with, built from its config: weights by mode, the LLM client (a
server by URL, else the local model), the knobs operator's Optuna study in the run directory, and
the bandit's counts replayed from the run's history. Each child's proposal, every LLM call and retry
in it, ends by ``evolution.llm.proposal_timeout_s``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from evotrainer.config import MODE_OPERATORS, Config
from evotrainer.operators.entry_prior import prior_weights
from evotrainer.operators.llm_client import LocalClient, OpenAIClient, TokenBudget, proposal_deadline
from evotrainer.operators.registry import OperatorMix
from evotrainer.records.history import GATED, HistoryRecord, Outcome, proposals



class DeadlineMix(OperatorMix):
    """An operator mix whose every proposal (one child, all its draws) shares one LLM deadline."""

    def __init__(self, *args: Any, proposal_timeout_s: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.proposal_timeout_s = proposal_timeout_s

    def propose(self, parents: list, evidence: Any, attempts: int = 1, on_reject=None):
        with proposal_deadline(self.shared.get("client"), self.proposal_timeout_s):
            return super().propose(parents, evidence, attempts, on_reject=on_reject)


def operator_mix(cfg: Config, run_dir: Path, llm_budget: TokenBudget, history: list[HistoryRecord] = (),
                 say: Callable[[str], None] | None = None) -> OperatorMix:
    ev = cfg.evolution
    weights = MODE_OPERATORS.get(ev.mode) or dict(ev.operators)
    llm = ev.llm
    if llm.base_url:
        client = OpenAIClient(llm.base_url, llm.model, api_key_env=llm.api_key_env, timeout=llm.timeout_s,
                              budget=llm_budget, on_wait=say)
    else:
        client = LocalClient(llm.model, budget=llm_budget, seed=cfg.seed)
    shared = {"client": client, "seed": cfg.seed, "max_tokens": llm.max_tokens, "temperature": llm.temperature}
    # The knobs operator's Optuna study lives in the run dir, so a resumed run keeps learning from
    # the paired deltas of earlier knob children instead of starting TPE over.
    fixed = {k: v for k, v in cfg.grpo.model_dump().items() if v is not None}
    by_name: dict[str, dict[str, Any]] = {}
    if "llm_choice" in weights:   # so it offers no knob that cannot change training under this recipe
        by_name["llm_choice"] = {"fixed": fixed}
    if ev.entry_prior is not None:   # what each entry did when screened: library and llm_choice draw by it
        prior = prior_weights(cfg.domain.name, None if ev.entry_prior == "shipped" else ev.entry_prior)
        for name in ("library", "llm_choice"):
            if name in weights:
                by_name.setdefault(name, {})["prior"] = prior
    if "knobs" in weights:
        by_name["knobs"] = {"storage": f"sqlite:///{run_dir.resolve()}/optuna.db", "fixed": fixed,
                            "n_startup_trials": ev.knobs_startup_trials}
    mix = DeadlineMix(weights, seed=cfg.seed, shared=shared, kwargs_by_name=by_name,
                      repair="llm_repair" in weights, proposal_timeout_s=llm.proposal_timeout_s)
    for h in proposals(history):   # the bandit resumes from what earlier generations' gates said
        if h.operator in weights and h.outcome in GATED:
            mix.credit(h.operator, h.outcome == Outcome.PROMOTED, entry=h.entry)
    return mix
