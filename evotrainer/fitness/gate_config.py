"""The settings of a promotion gate: validity thresholds and the paired test's level and margin."""

from __future__ import annotations

from dataclasses import dataclass

from evotrainer.config import GATE_LEVEL, Config, ValidityConfig

# The validity thresholds' defaults are evolution.validity's (config.py's ValidityConfig says what each
# one means): one place to change them, for a run's config and for a GateConfig built without one.
_VALIDITY = ValidityConfig()


@dataclass
class GateConfig:
    divergence: float = _VALIDITY.divergence     # train correctness (or [0,1] reward) minus held-out accuracy
    min_train_rollouts: int = 8                  # fewer in the last window: divergence not judged
    leak_margin: float = _VALIDITY.leak_margin   # leaked-prompt copy rate minus clean-prompt copy rate
    leak_p: float = _VALIDITY.leak_p             # one-sided Fisher p-value
    min_leak_rollouts: int = 4                   # on each side
    prompt_leak_share: float = _VALIDITY.prompt_leak_share   # prompts that add their own answer, at least
                                                 # this share (and leak_margin above the share that add
                                                 # another task's answer)
    hack_rise: float = _VALIDITY.hack_rise       # shaped reward rise (share of its range) that, with ...
    hack_drop: float = _VALIDITY.hack_drop       # ... correctness falling by this much, is reward hacking
    level: float = GATE_LEVEL                    # paired statistics: CI level ...
    min_delta: float = 0.0                       # ... lower bound must exceed this
    min_tasks: int = 5
    power: float = 0.8                           # the minimum detectable effect each decision states is at this power
    n_resamples: int = 10_000
    seed: int = 0
    window: int = 3                              # last training steps the divergence checks look at
    race_cap: int | None = None                  # racing gate: gate tasks read at most (None: the fixed gate draw)


def gate_config(cfg: Config) -> GateConfig:
    """The gate a run's config describes: its level, margin and seed, and its validity thresholds
    (``evolution.validity``). The one place a loop, a revert, the start and ``evotrainer gate`` get it."""
    ev = cfg.evolution
    return GateConfig(level=ev.gate_level, min_delta=ev.min_delta, seed=cfg.seed, race_cap=ev.race_cap,
                      **ev.validity.model_dump())
