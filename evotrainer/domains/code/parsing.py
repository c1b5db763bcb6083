"""Completion parsing: the program a completion stands for, and whether it followed the format.

Function tasks accept, in order:
  1. ``fenced``: a ```python block that defines the function (the last such block); the task's
     context (imports, helpers of the prompt) is prepended;
  2. ``def``: unfenced code that defines the function; trailing prose is cut until it compiles;
  3. ``body``: anything else is taken as the function's body and appended to the task's header
     (the HumanEval convention), indented if it is not.
``format_ok`` is true only for ``fenced`` (the prompt asks for a fenced block). Stdin tasks take the
last fenced block, else the whole text (``raw``). Parsing never raises.
"""

from __future__ import annotations

import ast
import re
import textwrap
from typing import Any

FENCE_RE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S | re.I)
CODE_START_RE = re.compile(r"^(?:def |class |import |from |@)", re.M)
MAX_TRIM = 40  # lines of trailing prose cut from unfenced code before giving up


# What parsing policy-written source may raise in the engine's process: a syntax error, a null byte
# (ValueError), or a few thousand chained operators (RecursionError, MemoryError from the parser).
# Each is a program that does not parse, never a crash of verification.
UNPARSEABLE = (SyntaxError, ValueError, RecursionError, MemoryError)


def parse_source(source: str) -> ast.Module | None:
    """The module's AST, or None when the source does not parse (for any of ``UNPARSEABLE``)."""
    try:
        return ast.parse(source)
    except UNPARSEABLE:
        return None


def _compiles(source: str) -> bool:
    try:
        compile(source, "solution.py", "exec")
        return True
    except UNPARSEABLE:
        return False


def _defines(code: str, entry: str) -> bool:
    return re.search(rf"^[ \t]*def[ \t]+{re.escape(entry)}[ \t]*\(", code, re.M) is not None


def _trim_to_code(text: str) -> str:
    """Unfenced code from its first code line, with trailing prose cut until it compiles."""
    m = CODE_START_RE.search(text)
    lines = text[m.start() if m else 0:].rstrip().splitlines()
    for _ in range(min(MAX_TRIM, len(lines))):
        if _compiles("\n".join(lines)):
            break
        lines.pop()
    return "\n".join(lines) + "\n"


def _as_body(text: str) -> str:
    body = text.rstrip("\n")
    first = next((ln for ln in body.splitlines() if ln.strip()), "")
    if first and not first.startswith((" ", "\t")):
        body = textwrap.indent(textwrap.dedent(body), "    ")
    return body + "\n"


def extract_program(completion: Any, task_visible: dict[str, Any]) -> tuple[str, str]:
    """(program source, method) with method in {"fenced", "def", "body", "raw", "none"}."""
    text = completion if isinstance(completion, str) else ""
    if not text.strip():
        return "", "none"
    blocks = FENCE_RE.findall(text)
    if task_visible.get("kind") == "stdio":
        return (blocks[-1], "fenced") if blocks else (text, "raw")
    entry = task_visible.get("entry", "")
    context = task_visible.get("context", "")
    prefix = f"{context}\n\n" if context.strip() else ""
    defining = [b for b in blocks if _defines(b, entry)]
    if defining:
        return prefix + defining[-1], "fenced"
    if _defines(text, entry):
        return prefix + _trim_to_code(text), "def"
    body = blocks[-1] if blocks else text
    return task_visible.get("header", "") + _as_body(body), "body"
