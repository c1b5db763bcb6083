"""One-token edits of a source line: what a guided edit may write under ``guided_edit: token``.

A guided edit (``environment.call_grammar``) fixes the call's form and that it names a line the file
holds once; the replacement line is the policy's own. A 135M policy fills it with ``...``, ``!`` or
prose, so its guided edits break the module they touch: a credit for an edit that keeps the tests
never pays, and the trajectory is reinforced with the vandal edit in it. Under ``token`` the replacement is instead one
of this module's variants of the named line: the line with one arithmetic operator swapped for
another, one comparison for another, or one integer literal moved by one. The policy still chooses
the file, the line and the variant; the module stays importable, so whether the edit keeps the tests
(and fixes the issue) depends on that choice alone.

The alternatives are every operator of a family, not the inverse of the bug catalogue's mutations
(``mutations.py``): the grammar carries no knowledge of which change the issue's bug was.
"""

from __future__ import annotations

import io
import keyword
import re
import tokenize

# What a guided edit may write: any one line; a one-token variant of a line; or a one-token variant of a
# line the issue quotes (``quoted``: level 0's issue quotes the wrong line; where the issue quotes no
# line of the file, as at level 1, ``quoted`` is ``token``).
EDIT_FORMS = ("line", "token", "quoted")
ARITHMETIC = ("+", "-", "*", "/", "//", "%")
COMPARISON = ("<", "<=", ">", ">=", "==", "!=")
MAX_VARIANTS = 40   # per line: bounds the grammar (the longest level-1 line has 30)


def _tokens(line: str) -> list[tokenize.TokenInfo]:
    """The line's tokens up to the first it cannot lex (an unclosed bracket or string is fine: the
    tokens before it still count)."""
    out: list[tokenize.TokenInfo] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line + "\n").readline):
            out.append(tok)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


def _binary(prev: tokenize.TokenInfo | None) -> bool:
    """An operator after an operand is binary (``a - 1``); after anything else it is unary (``-1``,
    ``f(-x)``), and swapping a unary ``-`` for ``*`` would not parse."""
    if prev is None:
        return False
    if prev.type == tokenize.NAME:   # a name is an operand; a keyword (``return -1``) is not
        return not keyword.iskeyword(prev.string) or prev.string in ("True", "False", "None")
    return prev.type in (tokenize.NUMBER, tokenize.STRING) or prev.string in (")", "]", "}")


def _alternatives(tok: tokenize.TokenInfo, prev: tokenize.TokenInfo | None) -> list[str]:
    if tok.type == tokenize.OP and tok.string in ARITHMETIC and _binary(prev):
        return [op for op in ARITHMETIC if op != tok.string]
    if tok.type == tokenize.OP and tok.string in COMPARISON:
        return [op for op in COMPARISON if op != tok.string]
    if tok.type == tokenize.NUMBER and tok.string.isdigit():
        value = int(tok.string)
        return [str(v) for v in (value - 1, value + 1) if v >= 0]
    return []


def quoted_texts(issue: str) -> set[str]:
    """The texts an issue quotes in backticks that could be a line of code, stripped (``The wrong line
    is ...: `x = 1`.``). A single word, number or path is left out: issues quote expected values,
    names and files (`1`, `next_number`, `pkg/mod.py`), and a bare `1` once matched a continuation line
    of a level-2 repository (it would have aimed a quoted guided edit at that line)."""
    quotes = (q.strip() for q in re.findall(r"`([^`\n]+)`", issue or ""))
    return {q for q in quotes if q and not re.fullmatch(r"[\w./'\"-]+", q)}


def token_variants(line: str) -> list[str]:
    """``line`` with one operator, comparison or integer literal changed, each variant once, in the
    order they occur in the line (at most :data:`MAX_VARIANTS`). Comments, strings and names are
    never touched; a line with nothing to change has no variants."""
    out: list[str] = []
    prev = None
    for tok in _tokens(line):
        if tok.start[0] != 1 or tok.end[0] != 1:   # only the line itself (a NEWLINE token sits on it too)
            continue
        alternatives, prev = _alternatives(tok, prev), (tok if tok.type != tokenize.INDENT else prev)
        for alt in alternatives:
            variant = line[: tok.start[1]] + alt + line[tok.end[1]:]
            if variant != line and variant not in out:
                out.append(variant)
            if len(out) >= MAX_VARIANTS:
                return out
    return out
