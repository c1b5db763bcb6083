"""The harness a run or a one-branch training starts from: the config's harness file (or the
reference harness) with the config's ``grpo`` knob overrides written into its KNOBS.

Light on purpose (no torch): ``validate_resources`` builds it to check the overrides before the
training stack is imported.
"""

from __future__ import annotations

from evotrainer.config import Config, ConfigError
from evotrainer.genome.errors import ContractError
from evotrainer.genome.program import HarnessProgram, reference_program


def seed_program(cfg: Config) -> HarnessProgram:
    """The harness a run starts from, with the config's ``grpo`` knob overrides written into KNOBS."""
    program = load_program(cfg.harness)
    values = {k: v for k, v in cfg.grpo.model_dump().items() if v is not None and k in program.knobs}
    try:
        return program.with_knobs(**values) if values else program
    except ContractError as e:
        raise ConfigError(f"grpo override outside the harness's declared knob space: {e}; "
                          "choose an allowed value or widen the knob in the harness's KNOBS") from None


def load_program(path: str | None) -> HarnessProgram:
    return HarnessProgram.from_file(path) if path else reference_program()
