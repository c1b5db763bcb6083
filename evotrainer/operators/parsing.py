"""Parsing LLM replies into structured proposals, or a ``ReplyParseError`` with the reason.

Every reply starts with three header lines (see ``prompts.REPLY_HEADER``)::

    HYPOTHESIS: <if X changes, metric Y moves, because Z>
    EXPECT: <metric> <op> <value>          op: < > <= >= delta< delta>
    FACTOR: <knob:NAME | hook:NAME>

followed by the operator's payload: SEARCH/REPLACE blocks (diff, repair), one ```python block
holding one complete hook function (rewrite), or a ``TAKE: <factor>`` line (crossover).
The parser is lenient about decoration models add (markdown bold, bullets, code fences around
the blocks, case) and strict about content: a missing claim or a malformed block is a rejection.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from evotrainer.operators.intervention import EFFECT_OPS, ExpectedEffect

SEARCH, DIVIDER, REPLACE = "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE"


class ReplyParseError(ValueError):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class ParsedReply:
    hypothesis: str
    expected_effect: ExpectedEffect
    factor: str | None = None
    blocks: list[tuple[str, str]] = field(default_factory=list)   # (search, replace) pairs
    code: str | None = None             # rewrite: the hook function's source
    take: str | None = None             # crossover: the factor taken from the second parent

    @property
    def diff_text(self) -> str:
        """The blocks in the SEARCH/REPLACE format ``apply_search_replace`` reads."""
        return format_blocks(self.blocks)


def format_blocks(blocks: list[tuple[str, str]]) -> str:
    parts = []
    for search, replace in blocks:
        parts.append(f"{SEARCH}\n{search}{DIVIDER}\n{replace}{REPLACE}\n")
    return "".join(parts)


# A header line: optional bullet / markdown emphasis, the key, a colon, the value.
_HEADER = r"^[ \t>*_\-#]*{key}[*_ \t]*:[*_ \t]*(?P<value>.+?)[ \t*_]*$"
_EXPECT_VALUE = re.compile(
    r"^`?(?P<metric>[A-Za-z_][\w.\-/]*)`?\s*(?P<op>delta\s*<|delta\s*>|<=|>=|<|>|≤|≥)\s*(?P<value>[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)\s*%?`?\.?$"
)
_FACTOR_VALUE = re.compile(r"^`?(?P<kind>knob|hook)\s*:\s*(?P<name>[A-Za-z_]\w*)`?\.?$")


def _header(text: str, key: str) -> str | None:
    m = re.search(_HEADER.format(key=key), text, flags=re.IGNORECASE | re.MULTILINE)
    return m.group("value").strip() if m else None


def parse_expected_effect(value: str) -> ExpectedEffect:
    m = _EXPECT_VALUE.match(value.strip())
    if not m:
        raise ReplyParseError(
            f"EXPECT line {value!r} is not '<metric> <op> <value>' with op one of {' '.join(EFFECT_OPS)}"
        )
    op = re.sub(r"\s+", "", m.group("op")).replace("≤", "<=").replace("≥", ">=")
    return ExpectedEffect(m.group("metric"), op, float(m.group("value")))


def parse_factor(value: str) -> str:
    m = _FACTOR_VALUE.match(value.strip())
    if not m:
        raise ReplyParseError(f"FACTOR {value!r} is not 'knob:NAME' or 'hook:NAME'")
    return f"{m.group('kind').lower()}:{m.group('name')}"


def parse_header(text: str, require_factor: bool = True) -> ParsedReply:
    """The hypothesis, expected effect and factor every reply must state (a rewrite or crossover
    reply names its factor elsewhere, so it may leave the FACTOR line out)."""
    if not text or not text.strip():
        raise ReplyParseError("empty reply")
    hypothesis = _header(text, "HYPOTHESIS")
    if not hypothesis:
        raise ReplyParseError("no 'HYPOTHESIS:' line")
    expect = _header(text, "EXPECT(?:ED[ _]EFFECT)?")
    if not expect:
        raise ReplyParseError("no 'EXPECT: <metric> <op> <value>' line")
    effect = parse_expected_effect(expect)
    factor_line = _header(text, "FACTOR")
    if not factor_line and require_factor:
        raise ReplyParseError("no 'FACTOR: knob:NAME | hook:NAME' line")
    factor = parse_factor(factor_line) if factor_line else None
    return ParsedReply(hypothesis=hypothesis, expected_effect=effect, factor=factor)


def parse_blocks(text: str) -> list[tuple[str, str]]:
    """SEARCH/REPLACE blocks, checked for structure (every SEARCH has a divider and a REPLACE)."""
    lines = text.splitlines(keepends=True)
    blocks: list[tuple[str, str]] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != SEARCH:
            if lines[i].strip() in (DIVIDER, REPLACE):
                raise ReplyParseError(f"line {i + 1}: {lines[i].strip()!r} outside a SEARCH block")
            i += 1
            continue
        start = i
        search, replace = [], []
        i += 1
        while i < len(lines) and lines[i].strip() != DIVIDER:
            if lines[i].strip() in (SEARCH, REPLACE):
                raise ReplyParseError(f"SEARCH block at line {start + 1} has no '=======' divider")
            search.append(lines[i])
            i += 1
        if i == len(lines):
            raise ReplyParseError(f"SEARCH block at line {start + 1} is not terminated")
        i += 1
        while i < len(lines) and lines[i].strip() != REPLACE:
            if lines[i].strip() in (SEARCH, DIVIDER):
                raise ReplyParseError(f"SEARCH block at line {start + 1} has no '>>>>>>> REPLACE' end")
            replace.append(lines[i])
            i += 1
        if i == len(lines):
            raise ReplyParseError(f"SEARCH block at line {start + 1} has no '>>>>>>> REPLACE' end")
        i += 1
        search_text, replace_text = _ending_newline("".join(search)), _ending_newline("".join(replace))
        if not search_text.strip():
            raise ReplyParseError(f"SEARCH block at line {start + 1} has an empty SEARCH part")
        if search_text == replace_text:
            raise ReplyParseError(f"SEARCH block at line {start + 1} replaces text with itself")
        blocks.append((search_text, replace_text))
    if not blocks:
        raise ReplyParseError("no SEARCH/REPLACE blocks")
    return blocks


def _ending_newline(s: str) -> str:
    return s if not s or s.endswith("\n") else s + "\n"


def parse_diff_reply(text: str) -> ParsedReply:
    reply = parse_header(text)
    reply.blocks = parse_blocks(text)
    return reply


_PY_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(?P<code>.*?)```", re.DOTALL | re.IGNORECASE)


def extract_function(text: str, name: str) -> str:
    """The source of one complete top-level function ``name`` from the reply's code block(s).

    Imports and helper definitions in the same block are rejected: a rewrite changes one hook,
    and anything else it needs must live inside that function.
    """
    candidates = [m.group("code") for m in _PY_BLOCK.finditer(text)]
    if not candidates:
        raise ReplyParseError("no ```python code block")
    errors = []
    for code in candidates:
        try:
            tree = ast.parse(code)
        except SyntaxError as err:
            errors.append(f"syntax error in code block: {err.msg} (line {err.lineno})")
            continue
        except (ValueError, RecursionError, MemoryError) as err:   # null bytes; nested past the parser's limit
            errors.append(f"code block does not parse ({type(err).__name__})")
            continue
        funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        if not any(f.name == name for f in funcs):
            errors.append(f"code block does not define {name}()")
            continue
        extra = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name == name)
                 and not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        if extra:
            what = ", ".join(getattr(n, "name", type(n).__name__) for n in extra)
            errors.append(f"code block holds more than the function {name}(): {what}")
            continue
        func = next(f for f in funcs if f.name == name)
        start = min([d.lineno for d in func.decorator_list] + [func.lineno])
        return "\n".join(code.splitlines()[start - 1:func.end_lineno]) + "\n"
    raise ReplyParseError("; ".join(errors))


def parse_rewrite_reply(text: str, hook: str) -> ParsedReply:
    reply = parse_header(text, require_factor=False)
    if reply.factor is not None and reply.factor != f"hook:{hook}":
        raise ReplyParseError(f"asked to rewrite hook:{hook} but the reply says FACTOR: {reply.factor}")
    reply.factor = f"hook:{hook}"
    reply.code = extract_function(text, hook)
    return reply


def parse_crossover_reply(text: str, choices: list[str]) -> ParsedReply:
    reply = parse_header(text, require_factor=False)
    take = _header(text, "TAKE") or (f"{reply.factor}" if reply.factor else None)
    if not take:
        raise ReplyParseError("no 'TAKE: <factor>' line")
    take = parse_factor(take)
    if take not in choices:
        raise ReplyParseError(f"TAKE {take!r} is not one of the differing factors: {', '.join(choices)}")
    reply.take = reply.factor = take
    return reply
