"""Mutation operators: make child harness genomes from parents plus evidence.

Built-ins: ``llm_diff``, ``llm_rewrite``, ``llm_crossover``, ``llm_repair`` (free-form LLM operators),
``llm_choice`` (an LLM picks a library entry or a knob value under a JSON schema), ``library`` (known
interventions whose triggers fire, no LLM), ``knobs`` (Optuna over KNOBS) and ``crossover`` (structural).
User operators register with ``@register_operator("name")`` or the ``evotrainer.operators`` entry-point group.
"""

from evotrainer.operators.acceptance import make_intervention
from evotrainer.operators.base import REJECTION_KINDS, Operator, OperatorError
from evotrainer.operators.evidence import Evidence
from evotrainer.operators.intervention import FITNESS_METRIC, ExpectedEffect, Intervention
from evotrainer.operators.registry import (
    OperatorMix,
    OperatorStats,
    available_operators,
    get_operator,
    register_operator,
    run_operator,
)

__all__ = [
    "FITNESS_METRIC",
    "REJECTION_KINDS",
    "Evidence",
    "ExpectedEffect",
    "Intervention",
    "Operator",
    "OperatorError",
    "OperatorMix",
    "OperatorStats",
    "available_operators",
    "get_operator",
    "make_intervention",
    "register_operator",
    "run_operator",
]
