"""The bug catalogue: small, span-exact edits of correct source (so the fix is a one-line diff).

Every mutation replaces a stretch of the original text located from the AST (never re-renders the
module), so formatting and comments survive and the bug's diff is as small as a human's would be.
Kinds: ``wrong_operator``, ``wrong_comparison``, ``off_by_one``, ``swapped_arguments``,
``missing_return``, ``wrong_default``. Whether a mutation is a *bug* (some test fails) is the
generator's check, not this module's.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

KINDS = ("wrong_operator", "wrong_comparison", "off_by_one", "swapped_arguments", "missing_return", "wrong_default")
ONE_TOKEN = ("wrong_operator", "wrong_comparison", "off_by_one")
OPERATORS = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "+"), ast.Div: ("/", "//"),
             ast.FloorDiv: ("//", "/"), ast.Mod: ("%", "//")}
COMPARISONS = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
               ast.Eq: ("==", "!="), ast.NotEq: ("!=", "==")}


@dataclass(frozen=True)
class Mutation:
    kind: str
    function: str     # the function whose body (or signature) holds the bug
    site: int         # index among this function's sites of this kind
    line: int         # 1-based line of the change
    start: int        # character offsets into the module source
    end: int
    before: str
    after: str

    def apply(self, source: str) -> str:
        return source[: self.start] + self.after + source[self.end:]

    @property
    def key(self) -> str:
        return f"{self.function}.{self.kind}.{self.site}"


def _offsets(source: str) -> list[int]:
    starts, pos = [], 0
    for line in source.splitlines(keepends=True):
        starts.append(pos)
        pos += len(line)
    return starts + [pos]


def _span(node: ast.AST, lines: list[int]) -> tuple[int, int]:
    return lines[node.lineno - 1] + node.col_offset, lines[node.end_lineno - 1] + node.end_col_offset


def _between(source: str, start: int, end: int, token: str) -> int | None:
    """Offset of ``token`` in source[start:end], skipping look-alikes (``//`` when looking for ``/``)."""
    seg = source[start:end]
    i = seg.find(token)
    while i >= 0:
        longer = seg[i:i + 2] in ("//", "**", "<=", ">=", "==", "!=") and len(token) == 1
        if not longer and not (i > 0 and seg[i - 1] in "/*<>=!" and len(token) == 1):
            return start + i
        i = seg.find(token, i + 2)
    return None


def _sites(fn: ast.FunctionDef, source: str, lines: list[int]) -> list[tuple[str, int, int, str, str]]:
    out: list[tuple[str, int, int, str, str]] = []
    for d in fn.args.defaults + [d for d in fn.args.kw_defaults if d is not None]:
        if isinstance(d, ast.Constant) and not isinstance(d.value, bool) and d.value is not None:
            s, e = _span(d, lines)
            v = d.value
            new = repr(v + 1) if isinstance(v, int) else repr(round(v + 0.1, 6)) if isinstance(v, float) \
                else repr(v[:-1] if len(v) > 1 else v + v) if isinstance(v, str) else None
            if new:
                out.append(("wrong_default", s, e, source[s:e], new))
    for node in ast.walk(fn):
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            tok, new = OPERATORS[type(node.op)]
            at = _between(source, _span(node.left, lines)[1], _span(node.right, lines)[0], tok)
            if at is not None:
                out.append(("wrong_operator", at, at + len(tok), tok, new))
        elif isinstance(node, ast.Compare) and type(node.ops[0]) in COMPARISONS:
            tok, new = COMPARISONS[type(node.ops[0])]
            at = _between(source, _span(node.left, lines)[1], _span(node.comparators[0], lines)[0], tok)
            if at is not None:
                out.append(("wrong_comparison", at, at + len(tok), tok, new))
        elif isinstance(node, ast.Constant) and type(node.value) is int and node not in fn.args.defaults:
            s, e = _span(node, lines)
            out.append(("off_by_one", s, e, source[s:e], str(node.value + 1)))
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and not any(isinstance(a, ast.Starred) for a in node.args):
            (s0, e0), (s1, e1) = _span(node.args[0], lines), _span(node.args[1], lines)
            a, b = source[s0:e0], source[s1:e1]
            if a != b:
                out.append(("swapped_arguments", s0, e1, source[s0:e1], b + source[e0:s1] + a))
        elif isinstance(node, ast.Return) and node.value is not None:
            s, e = _span(node, lines)
            vs, _ = _span(node.value, lines)
            out.append(("missing_return", s, vs, source[s:vs], ""))
    return out


def mutations(source: str) -> list[Mutation]:
    """Every catalogued mutation of every top-level function of a module, in source order."""
    tree = ast.parse(source)
    lines = _offsets(source)
    found: list[Mutation] = []
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        count: dict[str, int] = {}
        for kind, s, e, before, after in sorted(_sites(fn, source, lines), key=lambda x: (x[1], x[0])):
            idx = count.get(kind, 0)
            count[kind] = idx + 1
            line = source.count("\n", 0, s) + 1
            found.append(Mutation(kind, fn.name, idx, line, s, e, before, after))
    return found


def callers(source: str) -> dict[str, list[str]]:
    """Helper name -> the public functions of the module that call it directly."""
    out: dict[str, list[str]] = {}
    for fn in ast.parse(source).body:
        if isinstance(fn, ast.FunctionDef) and not fn.name.startswith("_"):
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.startswith("_"):
                    out.setdefault(node.func.id, [])
                    if fn.name not in out[node.func.id]:
                        out[node.func.id].append(fn.name)
    return out
