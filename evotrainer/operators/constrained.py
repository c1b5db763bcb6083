"""Constrained decoding for the local model: every reply is a JSON document valid under a schema.

A small local model (the embedded SmolLM2-135M) cannot write a free-form diff, but it can choose among
options if decoding only lets it emit tokens that keep the reply valid. ``SchemaConstraint`` compiles a
JSON schema into a token-level grammar with **llguidance** and masks the logits at every step of
``model.generate`` (a transformers ``LogitsProcessor``).

Why llguidance, among the libraries of the field (checked against this project's pins: torch 2.13 CPU,
transformers < 5.20):

* **llguidance** (Microsoft/guidance-ai, Rust): one wheel with no Python dependencies; JSON schema
  (enum, anyOf, maxLength, ...), Lark and regex grammars; computes a mask in well under a millisecond;
  the constraint engine that vLLM, SGLang and llama.cpp use, so local and served replies follow one
  grammar semantics. It hands us a mask and leaves the decoding loop to transformers.
* xgrammar: also fast and widely used, but its wheel pulls triton (a GPU compiler) and apache-tvm-ffi
  into a CPU environment.
* outlines (1.x): a higher-level generation framework; it pulls jsonschema, referencing, rpds, diskcache,
  genson and outlines-core, and wants to own the generate call.
* lm-format-enforcer: pure Python (slower per token), last release 2025-08.
* transformers-cfg: EBNF grammars only (a JSON schema must be translated by hand), last release 2025-03,
  and pulls sentencepiece.

Two details make the small model's replies short and deterministic where the grammar allows only one
continuation: the JSON is compact (no free whitespace, which a small model would emit forever), and
where the grammar forces text (property names, the end of an enum value) the forced tokens of
llguidance's canonical tokenization are the only ones allowed, so forced text costs the fewest tokens.
"""

from __future__ import annotations

import json
from typing import Any

import llguidance
import llguidance.hf
import numpy as np
import torch
from transformers import LogitsProcessor


class ConstraintError(ValueError):
    """The schema does not compile, or decoding left the grammar (a bug, never a model's fault)."""


def compile_schema(schema: dict[str, Any]) -> str:
    """The llguidance grammar of ``schema``, compact JSON (no optional whitespace)."""
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(schema), overrides={"whitespace_flexible": False})
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ConstraintError(f"the JSON schema does not compile to a grammar: {messages[0] if messages else '?'}")
    return grammar


class SchemaConstraint:
    """llguidance's view of one tokenizer (built once: ~1 s), which makes a logits processor per reply."""

    def __init__(self, tokenizer: Any) -> None:
        try:
            self.lltok = llguidance.hf.from_tokenizer(tokenizer)
        except ValueError as err:   # llguidance reads the fast (Rust) tokenizer's JSON
            raise ConstraintError(f"constrained decoding needs a fast tokenizer: {err}") from err
        self.eos = tokenizer.eos_token_id

    def processor(self, schema: dict[str, Any], prompt_length: int) -> SchemaLogitsProcessor:
        matcher = llguidance.LLMatcher(self.lltok, compile_schema(schema))
        if matcher.is_error():
            raise ConstraintError(f"the grammar does not load: {matcher.get_error()}")
        return SchemaLogitsProcessor(matcher, prompt_length)


class SchemaLogitsProcessor(LogitsProcessor):
    """Masks the next-token logits to what the grammar allows (batch of one sequence).

    ``generate`` calls it before sampling each token with all ids so far; the tokens generated since
    the last call are fed to the matcher first. Once the JSON is complete the grammar allows only EOS,
    which ends generation. ``complete`` says whether the reply closed before ``max_new_tokens``.
    """

    def __init__(self, matcher: llguidance.LLMatcher, prompt_length: int) -> None:
        self.matcher = matcher
        self.prompt_length = prompt_length
        self.consumed = 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[0] != 1:
            raise ConstraintError("constrained decoding handles one sequence at a time")
        self._consume(input_ids[0, self.prompt_length:].tolist())
        forced = self.matcher.compute_ff_tokens()
        allowed = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device)
        if forced:
            allowed[forced[0]] = True
        else:
            # One byte per tokenizer token: 0 (forbidden) or 200 (allowed). The model's vocabulary may be
            # padded beyond the tokenizer's; padding ids stay forbidden.
            bias = np.frombuffer(self.matcher.compute_logit_bias(), dtype=np.uint8)
            n = min(bias.shape[0], scores.shape[-1])
            allowed[:n] = torch.from_numpy(bias[:n] > 0).to(scores.device)
        if not bool(allowed.any()):
            raise ConstraintError(f"the grammar allows no next token ({self.matcher.get_error() or 'no error'})")
        return scores.masked_fill(~allowed, float("-inf"))

    def _consume(self, generated: list[int]) -> None:
        for token in generated[self.consumed:]:
            if not self.matcher.consume_token(int(token)):
                raise ConstraintError(f"token {token} left the grammar: {self.matcher.get_error()}")
        self.consumed = len(generated)

    def finish(self, generated: list[int]) -> bool:
        """Feeds the last sampled tokens; True when the reply is a complete document of the grammar."""
        self._consume(generated)
        return self.matcher.is_accepting()
