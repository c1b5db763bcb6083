"""The harness a run or a one-branch training starts from: the config's harness file (or the
reference harness) with the config's ``grpo`` knob overrides written into its KNOBS.

Light on purpose (no torch): ``validate_resources`` builds it to check the overrides before the
training stack is imported.
"""

from __future__ import annotations

from evotrainer.config import Config, ConfigError
from evotrainer.genome.errors import ContractError
from evotrainer.genome.program import REFERENCE_PATH, HarnessProgram, reference_program
from evotrainer.policy.grpo_config import TRAINER_SETTINGS

# The reference harness of a domain whose recipe differs from the math one (used when `harness` is not set).
DOMAIN_HARNESSES = {"code": REFERENCE_PATH.with_name("reference_code_harness.py"),
                    "swe": REFERENCE_PATH.with_name("reference_swe_harness.py")}


def seed_program(cfg: Config) -> HarnessProgram:
    """The harness a run starts from, with the config's ``grpo`` knob overrides written into KNOBS."""
    program = load_program(cfg.harness, cfg.domain.name)
    overrides = {k: v for k, v in cfg.grpo.model_dump().items() if v is not None}
    # An override of a setting only a hook reads (scale_rewards) reaches training only through the
    # genome's KNOBS: without that knob nothing would read it, and it used to be dropped silently.
    unread = sorted(k for k in overrides if k not in program.knobs and k not in TRAINER_SETTINGS)
    if unread:
        raise ConfigError(f"field 'grpo.{unread[0]}': the harness declares no knob {unread[0]!r} and it is not a "
                          "trainer setting, so nothing would read it; declare the knob in the harness's KNOBS "
                          "and read it in a hook, or remove the override")
    values = {k: v for k, v in overrides.items() if k in program.knobs}
    try:
        return program.with_knobs(**values) if values else program
    except ContractError as e:
        raise ConfigError(f"grpo override outside the harness's declared knob space: {e}; "
                          "choose an allowed value or widen the knob in the harness's KNOBS") from None


def load_program(path: str | None, domain: str | None = None) -> HarnessProgram:
    if path:
        return HarnessProgram.from_file(path)
    default = DOMAIN_HARNESSES.get(domain or "")
    return HarnessProgram.from_file(default) if default else reference_program()
