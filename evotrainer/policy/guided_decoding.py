"""Grammar-guided decoding: rows of a batch whose tokens must follow a grammar (llguidance).

A domain can state the form of a valid action as a grammar (the SWE domain's tool call: a fenced
JSON object naming a tool, with that tool's arguments and the repository's own file paths). A row
sampled under it draws only tokens the grammar allows, and the end of turn once the grammar is
complete; a row without one samples freely. The grammar is Lark with llguidance's extensions
(``%json {schema}``), compiled once per distinct text.

What a guided row records as its log-probability is the token's log-probability under the
*unguided* processed distribution: the policy's own, which the trainer recomputes. The importance
ratio is then 1 on the first pass and the update is the policy gradient on a sample the policy
was steered to; recording the renormalised masked distribution instead would make every forced
token's ratio < 1, and the clip would silence its negative-advantage samples. The sample is
off-policy by design (guided exploration): the ``guided_call_share`` knob decides how much of a
group is steered, so the unguided rest shows whether the policy has learned the form.
"""

from __future__ import annotations

import functools
import logging
from typing import Sequence

import torch

log = logging.getLogger(__name__)
LOGPROB_FLOOR = -1e4   # a token outside the policy's nucleus: finite, like the trainer's top-p filter value
_TOKENIZERS: dict[tuple[int, int], tuple[object, object]] = {}   # (id, vocab) -> (tokenizer, its llguidance view)


def _llguidance():
    try:
        import llguidance
        import llguidance.hf
        import llguidance.torch
    except ImportError as e:   # pragma: no cover - a dependency of the package
        raise ImportError("guided decoding needs llguidance: pip install llguidance") from e
    return llguidance


def ll_tokenizer(tokenizer, vocab: int):
    """The llguidance view of ``tokenizer`` for logits of width ``vocab`` (built once: ~2 s)."""
    key = (id(tokenizer), vocab)
    if key not in _TOKENIZERS:   # the tokenizer is kept with its view, so its id is never reused
        _TOKENIZERS[key] = (tokenizer, _llguidance().hf.from_tokenizer(tokenizer, n_vocab=vocab))
    return _TOKENIZERS[key][1]


@functools.lru_cache(maxsize=256)   # one grammar per repository (its file paths): bounded over a long run
def compile_grammar(lark: str):
    """A grammar's compiled form; a grammar llguidance cannot read is a ValueError naming why."""
    ll = _llguidance()
    grammar = ll.LLMatcher.grammar_from_lark(lark)
    is_error, messages = ll.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ValueError(f"the decoding grammar is not valid llguidance Lark: {'; '.join(messages)}")
    return grammar


class GuidedRows:
    """One llguidance matcher per guided row of a batch (``None``: that row samples freely).

    ``mask_(logits, rows)`` sets to -inf, in place, every token row ``rows[j]``'s grammar does not
    allow next; ``consume(row, token)`` advances that row's matcher. A grammar that rejects a token
    the mask allowed is an engine bug, raised as such.
    """

    def __init__(self, tokenizer, grammars: Sequence[str | None], vocab: int) -> None:
        ll = _llguidance()
        self._torch = ll.torch
        self.vocab = vocab
        lltok = ll_tokenizer(tokenizer, vocab) if any(grammars) else None
        self.matchers = [ll.LLMatcher(lltok, compile_grammar(g)) if g else None for g in grammars]
        for i, m in enumerate(self.matchers):
            if m is not None and m.is_error():
                raise ValueError(f"decoding grammar of row {i}: {m.get_error()}")

    @property
    def any(self) -> bool:
        return any(m is not None for m in self.matchers)

    def mask_(self, logits: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        """A copy of ``logits`` (len(rows), vocab) with each guided row's disallowed tokens at -inf
        (row j is output row ``rows[j]``); ``logits`` itself when no row is guided."""
        guided = [(j, self.matchers[i]) for j, i in enumerate(rows) if self.matchers[i] is not None]
        if not guided:
            return logits
        bitmask = self._torch.allocate_token_bitmask(len(rows), self.vocab)   # all allowed
        for j, m in guided:
            self._torch.fill_next_token_bitmask(m, bitmask, j)
        out = logits.float().clone()
        self._torch.apply_token_bitmask_inplace(out, bitmask.to(out.device))
        return out

    def consume(self, row: int, token: int) -> None:
        m = self.matchers[row]
        if m is None or m.is_stopped():
            return
        if not m.consume_token(token):
            raise RuntimeError(f"guided row {row}: the grammar refused token {token} its own mask allowed "
                               f"({m.get_error()})")

    def complete(self, row: int) -> bool:
        """Whether row ``row``'s grammar accepts what it sampled (True for an unguided row)."""
        m = self.matchers[row]
        return m is None or m.is_accepting() or m.is_stopped()
