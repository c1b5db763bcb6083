"""The operators a run proposes with, built from its config: weights by mode, the LLM client (a
server by URL, else the local model), and the knobs operator's Optuna study in the run directory."""

from __future__ import annotations

from pathlib import Path

from evotrainer.config import Config
from evotrainer.operators.llm_client import LocalClient, OpenAIClient, TokenBudget
from evotrainer.operators.registry import OperatorMix


def operator_mix(cfg: Config, run_dir: Path, llm_budget: TokenBudget, history: list[dict]) -> OperatorMix:
    ev = cfg.evolution
    weights = {"knobs": 1.0} if ev.mode == "recipe-search" else dict(ev.operators)
    llm = ev.llm
    if llm.base_url:
        client = OpenAIClient(llm.base_url, llm.model, api_key_env=llm.api_key_env, timeout=llm.timeout_s,
                              budget=llm_budget)
    else:
        client = LocalClient(llm.model, budget=llm_budget, seed=cfg.seed)
    shared = {"client": client, "seed": cfg.seed, "max_tokens": llm.max_tokens, "temperature": llm.temperature}
    # The knobs operator's Optuna study lives in the run dir, so a resumed run keeps learning from
    # the fitness of earlier knob settings instead of starting TPE over.
    fixed = {k: v for k, v in cfg.grpo.model_dump().items() if v is not None}
    by_name = {"knobs": {"storage": f"sqlite:///{run_dir.resolve()}/optuna.db", "fixed": fixed,
                         "n_startup_trials": ev.knobs_startup_trials}} if "knobs" in weights else {}
    mix = OperatorMix(weights, seed=cfg.seed, shared=shared, kwargs_by_name=by_name, repair="llm_repair" in weights)
    for h in history:   # the bandit resumes from what earlier generations' gates said
        if h.get("operator") in weights and h.get("outcome") in ("promoted", "kept", "rejected", "invalid"):
            mix.credit(h["operator"], h["outcome"] == "promoted" or h.get("hypothesis_verdict") == "confirmed",
                       entry=h.get("entry"))
    return mix
