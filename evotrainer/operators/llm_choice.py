"""``llm_choice``: an LLM picks one fired library entry (with parameter values) or one knob value.

A proposal any model can make: instead of writing a diff, the model answers one small JSON object,
and the JSON schema it answers under lists only what is valid for this parent —

    {"entry": "<a fired entry id>", "params": {<each parameter: one allowed value>}, "hypothesis": "..."}
    {"entry": "knob", "knob": "<a tunable knob>", "value": <a value of its grid>, "hypothesis": "..."}

The local model decodes under the schema (``constrained.py``, llguidance), an OpenAI-compatible server
gets it as structured output (``OpenAIClient(structured_output=...)``), so the reply always parses
there; a client that cannot constrain still gets the schema in the prompt, and its reply is checked
against the same options. The operator turns the reply into the library edit (or ``with_knobs``) and
hands the child to ``make_intervention``: a reply that still fails carries the reason in its error.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

from evotrainer.genome.errors import GenomeError
from evotrainer.genome.program import HarnessProgram
from evotrainer.operators import prompts
from evotrainer.operators.acceptance import make_intervention
from evotrainer.operators.base import OperatorError
from evotrainer.operators.evidence import Evidence
from evotrainer.operators.intervention import FITNESS_METRIC, ExpectedEffect, Intervention
from evotrainer.operators.knobs import inert_knobs, raising_rungs
from evotrainer.operators.library import Applicable, LibraryOperator, propose_entry
from evotrainer.operators.library_entry import same_value
from evotrainer.operators.llm import LLMOperator
from evotrainer.operators.llm_client import BudgetExhausted, Completion, LLMError, accepts_json_schema

KNOB = "knob"              # the "entry" value of a knob change
HYPOTHESIS_CHARS = 160     # bounds the reply: a constrained string cannot run past max_tokens
GRID_POINTS = 5            # values offered for a range knob


def knob_grid(spec: dict[str, Any]) -> list[Any]:
    """The values offered for one knob, other than its current one: its choices, or a grid over its
    range (geometric for a log range), rounded so that the reply stays short."""
    current = spec["value"]
    if "choices" in spec:
        return [c for c in spec["choices"] if not same_value(c, current)]
    lo, hi = spec["range"]
    if lo == hi:
        return []
    integer = all(isinstance(x, int) and not isinstance(x, bool) for x in (lo, hi, current))
    steps = [i / (GRID_POINTS - 1) for i in range(GRID_POINTS)]
    if spec.get("log"):
        raw = [math.exp(math.log(lo) + s * (math.log(hi) - math.log(lo))) for s in steps]
    else:
        raw = [lo + s * (hi - lo) for s in steps]
    out: list[Any] = []
    for v in raw:
        v = int(round(v)) if integer else min(max(float(f"{v:.2g}"), lo), hi)
        if not same_value(v, current) and not any(same_value(v, o) for o in out):
            out.append(v)
    return out


def tunable_knobs(parent: HarnessProgram, fixed: dict[str, Any] | None = None,
                  tried: set[str] = frozenset()) -> dict[str, list[Any]]:
    """Knob name -> offered values, leaving out knobs that cannot change training (``inert_knobs``)
    and values whose child was already tried."""
    knobs = parent.knobs
    inert = inert_knobs({**(fixed or {}), **{n: s["value"] for n, s in knobs.items()}})
    grids = {name: knob_grid(spec) for name, spec in knobs.items() if name not in inert}
    if tried:
        grids = {name: [v for v in grid if parent.with_knobs(**{name: v}).hash not in tried]
                 for name, grid in grids.items()}
    return {name: grid for name, grid in grids.items() if grid}


def _hypothesis_schema() -> dict[str, Any]:
    return {"type": "string", "maxLength": HYPOTHESIS_CHARS}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def choice_schema(fired: list[Applicable], knobs: dict[str, list[Any]]) -> dict[str, Any]:
    """The reply schema: one variant per fired entry (its parameters' allowed values) and one per
    knob (its grid). Every property is required and no other is allowed, as strict structured-output
    servers demand; single-value ``enum`` rather than ``const`` for the servers that lack it."""
    variants = [_object({"entry": {"enum": [a.entry.id]},
                         "params": _object({k: {"enum": list(vs)} for k, vs in a.options.items()}),
                         "hypothesis": _hypothesis_schema()}) for a in fired]
    variants += [_object({"entry": {"enum": [KNOB]}, "knob": {"enum": [name]}, "value": {"enum": list(grid)},
                          "hypothesis": _hypothesis_schema()}) for name, grid in knobs.items()]
    return {"anyOf": variants}


def parse_choice(text: str) -> dict[str, Any]:
    """The reply's JSON object (the first one in the text, for a client that did not constrain it)."""
    start = text.find("{")
    if start < 0:
        raise ValueError("the reply holds no JSON object")
    try:
        reply, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as err:
        raise ValueError(f"the reply is not valid JSON: {err.msg} at character {err.pos}") from err
    if not isinstance(reply, dict):
        raise ValueError("the reply's JSON is not an object")
    return reply


class LLMChoiceOperator(LLMOperator):
    """The LLM chooses among the fired library entries and the tunable knobs, under a JSON schema."""

    name = "llm_choice"

    def __init__(self, client: Any = None, max_tokens: int = 256, temperature: float = 0.7, seed: int = 0,
                 weights: dict[str, float] | None = None, fixed: dict[str, Any] | None = None,
                 offer_knobs: bool = True, prior: dict[str, float] | None = None) -> None:
        super().__init__(client, max_tokens=max_tokens, temperature=temperature)
        # the fired entries, skip rules, weights and the entry prior (which entries it lists first)
        self.library = LibraryOperator(seed=seed, weights=weights, prior=prior)
        self.rng = random.Random(seed)
        self.fixed = dict(fixed or {})     # recipe settings that are not knobs (decide which knobs are inert)
        self.offer_knobs = offer_knobs

    def options(self, parent: HarnessProgram, evidence: Evidence) -> tuple[list[Applicable], dict[str, list[Any]]]:
        """The fired entries in a weighted random order (heavier entries tend to come first), and the
        knobs. Models favour options listed early, a small one strongly: a fixed order would make every
        proposal the same entry, a weighted shuffle makes the weights mean what they say."""
        fired, _ = self.library.applicable(parent, evidence)
        weights = self.library.draw_weights(evidence)   # skills that name an entry bring it forward
        keys = {a.entry.id: self.rng.random() ** (1.0 / weights[a.entry.id]) for a in fired}
        fired.sort(key=lambda a: -keys[a.entry.id])
        knobs = tunable_knobs(parent, self.fixed, self.library.tried(parent, evidence)) if self.offer_knobs else {}
        named = evidence.triage(list(knobs))
        if named:   # a blocking alert fired: its knobs only, moved its way (the library triages the entries)
            up = evidence.triage_direction() == "up"
            current = {k: parent.knobs[k]["value"] for k in named}
            moved = {k: [v for v in knobs[k] if not isinstance(v, int | float) or isinstance(v, bool)
                         or (v > current[k] if up else v < current[k])] for k in named}
            if up:   # raised the way `knobs` raises it: the range's top and the half-decades below it, untried
                tried = self.library.tried(parent, evidence)
                moved = {k: [v for v in raising_rungs(parent.knobs[k]) if parent.with_knobs(**{k: v}).hash not in tried]
                         or vs for k, vs in moved.items()}
            knobs = {k: vs for k, vs in moved.items() if vs} or knobs
        return fired, knobs

    def propose(self, parents: list, evidence: Evidence) -> Intervention:
        parent = self._one_parent(parents)
        try:
            fired, knobs = self.options(parent, evidence)
        except GenomeError as err:   # a parent whose KNOBS or hooks cannot be read offers nothing to choose
            raise OperatorError(f"cannot read the parent: {err}", "input") from err
        if not fired and not knobs:
            about = "this health report" if evidence.has_report() else "an empty health report (none was given)"
            raise OperatorError(f"no library entry fires on {about} and the parent has no tunable knob", "input")
        schema = choice_schema(fired, knobs)
        messages = prompts.choice_messages(evidence, fired, {k: parent.knobs[k] for k in knobs}, knobs)
        c = self._ask_json(messages, schema)
        tokens = self._tokens(c)
        try:
            reply = parse_choice(c.text)
        except ValueError as err:
            raise OperatorError(f"reply does not parse: {err}", "parse", **tokens) from err
        said = str(reply.get("hypothesis") or "").strip()
        extra = f"(Model's reason: {said})" if said else ""
        details = {"model_hypothesis": said, "constrained": self._constrained()}
        try:
            iv = self._intervention(parent, reply, fired, knobs, evidence, extra, tokens, details)
            if iv.child_hash in self.library.tried(parent, evidence):   # an unconstrained reply may repeat one
                raise OperatorError(f"the reply repeats child {iv.child_hash[:12]}, already proposed on this parent",
                                    "duplicate")
        except OperatorError as err:
            if not err.prompt_tokens:   # every rejected reply reports the tokens it cost
                err.prompt_tokens, err.completion_tokens = tokens["prompt_tokens"], tokens["completion_tokens"]
            raise
        self.library.remember(parent, iv.child_hash)   # never offered again on this parent
        return iv

    def _intervention(self, parent: HarnessProgram, reply: dict[str, Any], fired: list[Applicable],
                      knobs: dict[str, list[Any]], evidence: Evidence, extra: str, tokens: dict[str, int],
                      details: dict[str, Any]) -> Intervention:
        choice = reply.get("entry")
        if choice == KNOB:
            return self._knob_change(parent, reply, knobs, evidence, extra, tokens, details)
        pick = next((a for a in fired if a.entry.id == choice), None)
        if pick is None:
            raise OperatorError(f"reply names entry {choice!r}, which is not among the fired entries "
                                f"({', '.join(a.entry.id for a in fired) or 'none'}) or 'knob'", "parse")
        params = reply.get("params")
        if not isinstance(params, dict):
            raise OperatorError(f"reply for entry {choice} has no 'params' object", "parse")
        return propose_entry(self.name, parent, pick.entry, params, evidence, extra_hypothesis=extra,
                             details=details, **tokens)

    def _knob_change(self, parent: HarnessProgram, reply: dict[str, Any], knobs: dict[str, list[Any]],
                     evidence: Evidence, extra: str, tokens: dict[str, int], details: dict[str, Any]) -> Intervention:
        name, value = reply.get("knob"), reply.get("value")
        if name not in knobs:
            raise OperatorError(f"reply names knob {name!r}, which is not a tunable knob ({', '.join(knobs)})", "parse")
        old = parent.knobs[name]["value"]
        try:
            child = parent.with_knobs(**{name: value})   # validates the value against the knob's range/choices
        except Exception as err:  # noqa: BLE001 - ContractError (out of range) or a value with_knobs cannot write
            raise OperatorError(f"knob {name}={value!r}: {err}", "parse") from err
        return make_intervention(
            self.name, [parent], child, evidence,
            hypothesis=f"If {name} changes from {old!r} to {value!r}, held-out score rises. {extra}".strip(),
            expected_effect=ExpectedEffect(FITNESS_METRIC, "delta>", 0.0),
            details={"entry": KNOB, "knob": name, "old": old, "new": value, **details},
            check_contract=False, factors=[f"knob:{name}"], **tokens)

    def _constrained(self) -> bool:
        """Whether the reply was decoded under the schema (a server asked for structured output, or
        the local model's constrained decoding), not only asked for it in the prompt."""
        return accepts_json_schema(self.client) and getattr(self.client, "structured_output", "local") is not None

    def _ask_json(self, messages: list[dict[str, str]], schema: dict[str, Any]) -> Completion:
        """One call, constrained to ``schema`` when the client can be (else the prompt alone asks)."""
        kwargs = {"json_schema": schema} if accepts_json_schema(self.client) else {}
        try:
            return self.client.complete(messages, max_tokens=self.max_tokens, temperature=self.temperature, **kwargs)
        except BudgetExhausted as err:
            raise OperatorError(str(err), "budget") from err
        except LLMError as err:
            raise OperatorError(str(err), "llm") from err
