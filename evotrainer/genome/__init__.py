"""Harness genomes: programs, the contract check, EVOLVE-block edits, the sandbox, the reference harnesses.

    program.py                  HarnessProgram (source, hash, knobs, hooks, evolve_blocks), reference_program()
    contract.py                 check_contract: the static first filter
    edits.py                    search/replace, hook rewrite, crossover, the single-factor rule
    errors.py                   GenomeError and its kinds (contract, edit, single-factor)
    sandbox.py                  Sandbox: runs hooks in a locked-down worker process
    sandbox_worker.py           the worker process itself (standard library only, run by Sandbox)
    sandbox_guard.py            the worker's audit hook and import guards while harness code runs
    sandbox_outcome.py          a call's captured output, JSON result or failure report, in the worker
    results.py                  validation of hook results
    harness.py                  Harness: the engine-side facade
    reference_harness.py        the math reference harness (a harness file, not imported)
    reference_code_harness.py   the code domain's reference harness (a harness file)
    reference_swe_harness.py    the SWE domain's reference harness (a harness file)

The `genome` command is ``cli/genome.py``.
"""

from .contract import DEFAULT_ALLOWED_IMPORTS, check_contract
from .edits import apply_search_replace, check_single_factor, crossover, factors_changed, rewrite_hook
from .errors import ContractError, EditError, GenomeError, SingleFactorError
from .harness import Harness
from .program import HOOK_PARAMS, HOOKS, EvolveBlock, HarnessProgram, reference_program
from .results import BadResult, validate_result
from .sandbox import Sandbox, SandboxError, SandboxFailure, SandboxLimits

__all__ = [
    "DEFAULT_ALLOWED_IMPORTS", "HOOKS", "HOOK_PARAMS", "BadResult", "ContractError", "EditError", "EvolveBlock",
    "GenomeError", "Harness", "HarnessProgram", "Sandbox", "SandboxError", "SandboxFailure", "SandboxLimits",
    "SingleFactorError", "apply_search_replace", "check_contract", "check_single_factor", "crossover",
    "factors_changed", "reference_program", "rewrite_hook", "validate_result",
]
