"""The harness a run or a one-branch training starts from: the config's harness file (or the
reference harness) with the config's ``grpo`` knob overrides written into its KNOBS.

Light on purpose (no torch): ``validate_resources`` builds it to check the overrides before the
training stack is imported.
"""

from __future__ import annotations

import logging

from evotrainer.config import Config, ConfigError
from evotrainer.genome.errors import ContractError
from evotrainer.genome.program import REFERENCE_PATH, HarnessProgram, reference_program
from evotrainer.policy.grpo_config import TRAINER_SETTINGS

log = logging.getLogger(__name__)

# The reference harness of a domain whose recipe differs from the math one (used when `harness` is not set).
DOMAIN_HARNESSES = {"code": REFERENCE_PATH.with_name("reference_code_harness.py"),
                    "swe": REFERENCE_PATH.with_name("reference_swe_harness.py")}


def seed_program(cfg: Config) -> HarnessProgram:
    """The harness a run starts from, with the config's ``grpo`` knob overrides written into KNOBS."""
    program = load_program(cfg.harness, cfg.domain.name)
    overrides = {k: v for k, v in cfg.grpo.model_dump().items() if v is not None}
    # An override of a setting only a hook reads (scale_rewards) reaches training only through the
    # genome's KNOBS: without that knob nothing would read it, so it is refused rather than ignored.
    unread = sorted(k for k in overrides if k not in program.knobs and k not in TRAINER_SETTINGS)
    if unread:
        raise ConfigError(f"field 'grpo.{unread[0]}': the harness declares no knob {unread[0]!r} and it is not a "
                          "trainer setting, so nothing would read it; declare the knob in the harness's KNOBS "
                          "and read it in a hook, or remove the override")
    values = {k: v for k, v in overrides.items() if k in program.knobs}
    if cfg.harness is None:
        program = _scaled_choices(program, values)
    try:
        return program.with_knobs(**values) if values else program
    except ContractError as e:
        raise ConfigError(f"grpo override outside the harness's declared knob space: {e}; "
                          "choose an allowed value or widen the knob in the harness's KNOBS") from None


def _scaled_choices(program: HarnessProgram, values: dict) -> HarnessProgram:
    """The built-in harnesses' choices are sized for the embedded 135M model (completions of 32-256
    tokens on math). An override above a numeric knob's largest choice (a 1.5B model's 1024-token chain
    of thought) scales them by the same factor as the value, so the search keeps the same neighbourhood
    around the user's setting; said in the log. One below them, or in a user's own harness file, is
    refused as written (a value the choices do not hold is more likely a typo than a smaller model)."""
    for name, value in values.items():
        spec = program.knobs[name]
        choices, default = spec.get("choices"), spec.get("value")
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if (not choices or value in choices or not numeric
                or not all(isinstance(c, int | float) and not isinstance(c, bool) and c > 0 for c in [default, *choices])):
            continue
        if value <= max(choices):
            continue
        factor = value / default
        scaled = [round(c * factor) if isinstance(c, int) and isinstance(value, int) else c * factor for c in choices]
        log.warning("grpo.%s %s is outside the built-in harness's choices %s: they scale with it to %s",
                    name, value, choices, scaled)
        program = program.with_knob_choices(name, scaled, value)
    return program


def load_program(path: str | None, domain: str | None = None) -> HarnessProgram:
    if path:
        return HarnessProgram.from_file(path)
    default = DOMAIN_HARNESSES.get(domain or "")
    return HarnessProgram.from_file(default) if default else reference_program()
