"""Errors raised while reading, checking and editing harness programs.

Each carries one line that names the problem, because it is shown to people and fed back to the
LLM operators (a repair operator needs to know *what* was wrong, not a traceback).
"""


class GenomeError(ValueError):
    """Base class of the genome errors."""


class ContractError(GenomeError):
    """The program does not meet the harness contract (syntax, hooks, knobs, imports, size)."""


class EditError(GenomeError):
    """An edit (search/replace, hook rewrite, crossover) could not be applied as asked."""


class SingleFactorError(GenomeError):
    """A child differs from its parent in zero or in several factors."""

    def __init__(self, message: str, factors: list[str]):
        super().__init__(message)
        self.factors = list(factors)
