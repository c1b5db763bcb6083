"""LLM operators: diff, rewrite (one hook), crossover (LLM picks the factor), repair.

Each asks its client once, parses the reply (``parsing``), applies the edit with the genome
package, and hands the child to ``make_intervention`` for the acceptance rules. Whatever goes
wrong, a reply that does not parse, an edit that does not apply, a spent budget, becomes an
``OperatorError`` with a reason and a kind; tokens spent on a rejected reply are still reported.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from evotrainer.operators import prompts
from evotrainer.operators.acceptance import make_intervention
from evotrainer.operators.base import OperatorError
from evotrainer.operators.evidence import Evidence
from evotrainer.operators.intervention import FITNESS_METRIC, Intervention
from evotrainer.operators.llm_client import BudgetExhausted, Completion, LLMClient, LLMError, make_client
from evotrainer.operators.parsing import (
    ParsedReply,
    ReplyParseError,
    parse_crossover_reply,
    parse_diff_reply,
    parse_rewrite_reply,
)
from evotrainer.genome.edits import apply_search_replace
from evotrainer.genome.edits import crossover, factors_changed
from evotrainer.genome.edits import rewrite_hook
from evotrainer.genome.errors import GenomeError


class LLMOperator:
    """Shared plumbing: a lazily made client, one call, parse, edit, accept."""
    name = "llm"

    def __init__(self, client: LLMClient | None = None, max_tokens: int = 1024, temperature: float = 0.7,
                 check_known_metrics: bool = True) -> None:
        self._client = client
        self.max_tokens = max_tokens
        self.temperature = temperature
        # An expectation about a metric nobody measures can never be checked: reject it, unless the
        # change is to the metrics hook itself (which may add that metric).
        self.check_known_metrics = check_known_metrics

    @property
    def client(self) -> LLMClient:
        if self._client is None:
            self._client = make_client()
        return self._client

    def _ask(self, messages: list[dict[str, str]]) -> Completion:
        try:
            return self.client.complete(messages, max_tokens=self.max_tokens, temperature=self.temperature)
        except BudgetExhausted as err:
            raise OperatorError(str(err), "budget") from err
        except LLMError as err:
            raise OperatorError(str(err), "llm") from err

    @staticmethod
    def _tokens(c: Completion) -> dict[str, int]:
        return {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens}

    def _parse(self, parse: Callable[..., ParsedReply], c: Completion, evidence: Evidence, *args: Any) -> ParsedReply:
        try:
            reply = parse(c.text, *args)
        except ReplyParseError as err:
            raise OperatorError(f"reply does not parse: {err.reason}", "parse", **self._tokens(c)) from err
        metrics = (evidence.health_report or {}).get("metrics") or {}
        metric = reply.expected_effect.metric
        known = metric in metrics or metric == FITNESS_METRIC    # the engine always measures fitness
        if self.check_known_metrics and metrics and not known and reply.factor != "hook:metrics":
            raise OperatorError(f"EXPECT names metric {metric!r}, which the health report does not measure "
                                f"(known: {', '.join(sorted(metrics))})", "parse", **self._tokens(c))
        return reply

    def _edit(self, edit: Callable[[], Any], c: Completion) -> Any:

        try:
            return edit()
        except GenomeError as err:
            raise OperatorError(f"edit does not apply: {err}", "edit", **self._tokens(c)) from err

    def _accept(self, parents: list, child: Any, evidence: Evidence, reply: ParsedReply, c: Completion,
                **details: Any) -> Intervention:
        intervention = make_intervention(
            self.name, parents, child, evidence, hypothesis=reply.hypothesis,
            expected_effect=reply.expected_effect, details={"declared_factor": reply.factor, **details},
            **self._tokens(c),
        )
        if reply.factor and reply.factor not in intervention.factors:
            # The stated factor is what the hypothesis is about; a change elsewhere does not test it.
            raise OperatorError(f"reply says FACTOR {reply.factor} but the edit changes "
                                f"{', '.join(intervention.factors)}", "single_factor", **self._tokens(c))
        return intervention

    @staticmethod
    def _one_parent(parents: list) -> Any:
        if not parents:
            raise OperatorError("no parent given", "input")
        return parents[0]


class LLMDiffOperator(LLMOperator):
    """The LLM edits the parent with SEARCH/REPLACE blocks."""
    name = "llm_diff"

    def propose(self, parents: list, evidence: Evidence) -> Intervention:

        parent = self._one_parent(parents)
        c = self._ask(prompts.diff_messages(parent.source, evidence))
        reply = self._parse(parse_diff_reply, c, evidence)
        child = self._edit(lambda: apply_search_replace(parent, reply.diff_text), c)
        return self._accept(parents[:1], child, evidence, reply, c)


# Words in an alert that point at a hook (checked in this order: the reward is the usual suspect).
HOOK_WORDS = {
    "reward": ("reward",),
    "keep_groups": ("keep_groups", "filter"),
    "advantages": ("advantage",),
    "validity": ("validity", "hack", "leak"),
    "alerts": ("alert", "rule"),
    "metrics": ("metric",),
}


class LLMRewriteOperator(LLMOperator):
    """The LLM writes one complete hook function; by default the hook the alerts point at."""
    name = "llm_rewrite"

    def __init__(self, client: LLMClient | None = None, hook: str | None = None, seed: int = 0, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self.hook = hook
        self.rng = random.Random(seed)

    def choose_hook(self, parent: Any, evidence: Evidence) -> str:
        """The fixed hook if one was given; else the hook the most severe alert's text points at;
        else one of the training-side hooks at random."""
        if self.hook:
            return self.hook
        alerts = sorted(evidence.alerts(), key=lambda a: prompts.SEVERITY_ORDER.get(str(a.get("severity")), 9))
        for alert in alerts:
            text = f"{alert.get('name', '')} {alert.get('message', '')} {alert.get('suggestion', '')}".lower()
            for hook, words in HOOK_WORDS.items():
                if any(w in text for w in words):
                    return hook
        return self.rng.choice([h for h in ("reward", "keep_groups", "advantages") if h in parent.hooks]
                               or list(HOOK_WORDS))

    def propose(self, parents: list, evidence: Evidence) -> Intervention:

        parent = self._one_parent(parents)
        hook = self.choose_hook(parent, evidence)
        c = self._ask(prompts.rewrite_messages(parent.source, hook, evidence))
        reply = self._parse(parse_rewrite_reply, c, evidence, hook)
        child = self._edit(lambda: rewrite_hook(parent, hook, reply.code), c)
        return self._accept(parents[:1], child, evidence, reply, c, hook=hook)


class LLMCrossoverOperator(LLMOperator):
    """Two parents: the LLM picks which differing factor of parent B to copy into parent A."""
    name = "llm_crossover"
    n_parents = 2

    def propose(self, parents: list, evidence: Evidence) -> Intervention:

        if len(parents) < 2:
            raise OperatorError("llm_crossover needs two parents", "input")
        a, b = parents[0], parents[1]
        choices = factors_changed(a, b)
        if not choices:
            raise OperatorError("the parents do not differ in any factor", "input")
        differences = {f: (_factor_text(a, f), _factor_text(b, f)) for f in choices}
        c = self._ask(prompts.crossover_messages(a.source, differences, evidence))
        reply = self._parse(parse_crossover_reply, c, evidence, choices)
        child = self._edit(lambda: crossover(a, b, reply.take), c)
        return self._accept([a, b], child, evidence, reply, c, took=reply.take)


def _factor_text(program: Any, factor: str) -> str:
    kind, _, name = factor.partition(":")
    if kind == "knob":
        return repr(program.knobs.get(name, "(not declared)"))
    return program.hooks.get(name, "(not defined: the reference hook is used)")


class LLMRepairOperator(LLMOperator):
    """Fixes a child that failed the contract or the sandbox, given the error text.

    ``evidence.failed_source`` and ``evidence.failure`` describe the broken child; ``parents[0]`` is
    the parent it was made from, so the repaired child still has to be one factor from it.
    """

    name = "llm_repair"

    def propose(self, parents: list, evidence: Evidence) -> Intervention:

        parent = self._one_parent(parents)
        if not evidence.failed_source or not evidence.failure:
            raise OperatorError("llm_repair needs evidence.failed_source and evidence.failure", "input")
        broken = parent.with_source(evidence.failed_source)
        c = self._ask(prompts.repair_messages(evidence.failed_source, evidence.failure, evidence))
        reply = self._parse(parse_diff_reply, c, evidence)
        child = self._edit(lambda: apply_search_replace(broken, reply.diff_text), c)
        return self._accept(parents[:1], child, evidence, reply, c, repaired=broken.source != child.source)
