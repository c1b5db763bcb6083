"""HarnessProgram: one harness genome, an immutable Python source file and what it declares.

Everything is derived lazily from ``source`` so that a broken program (as an LLM often writes) can
still be held, hashed by source, diffed and reported; reading a derived property of a broken
program raises ``ContractError`` with one line naming the problem.

Identity (``hash``) is the sha256 of the normalised AST: ``ast.dump`` of the module with docstrings
stripped, so comments, formatting and docstrings do not make a new genome.
"""

from __future__ import annotations

import ast
import copy
import hashlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from .errors import ContractError

# The harness contract: hook name -> its parameter names, in order.
HOOK_PARAMS: dict[str, tuple[str, ...]] = {
    "reward": ("rollouts", "tasks"),
    "keep_groups": ("groups",),
    "advantages": ("groups", "rewards"),
    "metrics": ("rollouts", "groups"),
    "alerts": ("metrics", "history"),
    "validity": ("rollouts", "metrics", "history"),
    "select_tasks": ("pool", "stats", "step", "n"),
    "prompt": ("task",),
}
HOOKS = tuple(HOOK_PARAMS)

EVOLVE_START = "# EVOLVE-BLOCK-START"
EVOLVE_END = "# EVOLVE-BLOCK-END"
_KNOB_KEYS = {"value", "range", "choices", "log", "help"}


@dataclass(frozen=True)
class EvolveBlock:
    """Lines ``start``..``end`` (1-based, inclusive) between an EVOLVE-BLOCK marker pair."""

    start: int
    end: int
    text: str

    def contains(self, first: int, last: int) -> bool:
        return self.start <= first and last <= self.end


@dataclass(frozen=True)
class HarnessProgram:
    source: str
    name: str = "harness.py"

    @classmethod
    def from_file(cls, path: str | Path) -> HarnessProgram:
        path = Path(path)
        try:
            return cls(path.read_text(encoding="utf-8"), name=path.name)
        except UnicodeDecodeError as e:
            raise ContractError(f"{path}: not a UTF-8 text file ({e.reason} at byte {e.start}); a harness is "
                                "Python source") from None

    # ---- parsing -------------------------------------------------------------------------
    @cached_property
    def tree(self) -> ast.Module:
        try:
            return ast.parse(self.source, filename=self.name)
        except SyntaxError as e:
            raise ContractError(f"syntax error at line {e.lineno}: {e.msg}") from None
        except ValueError as e:  # e.g. null bytes in the source
            raise ContractError(f"unparseable source: {e}") from None
        except (RecursionError, MemoryError):  # thousands of chained operators: the parser's own limit
            raise ContractError("unparseable source: nested too deeply for the Python parser") from None

    @cached_property
    def lines(self) -> list[str]:
        return self.source.splitlines()

    @cached_property
    def hash(self) -> str:
        return hashlib.sha256(normalised_dump(self.tree).encode()).hexdigest()

    @property
    def short_hash(self) -> str:
        return self.hash[:12]

    # ---- declarations --------------------------------------------------------------------
    @cached_property
    def functions(self) -> dict[str, ast.FunctionDef]:
        """Top-level function definitions by name (the last one wins, as at run time)."""
        return {n.name: n for n in self.tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    @cached_property
    def hooks(self) -> dict[str, str]:
        """Hook name -> source segment of its top-level function (decorators excluded)."""
        return {name: self.segment(node) for name, node in self.functions.items() if name in HOOK_PARAMS}

    def segment(self, node: ast.AST) -> str:
        return "\n".join(self.lines[node.lineno - 1 : node.end_lineno])

    @cached_property
    def knobs_node(self) -> ast.Dict | None:
        node = None
        for stmt in self.tree.body:
            targets = (stmt.targets if isinstance(stmt, ast.Assign)
                       else [stmt.target] if isinstance(stmt, ast.AnnAssign) else [])
            if any(isinstance(t, ast.Name) and t.id == "KNOBS" for t in targets):
                if not isinstance(stmt.value, ast.Dict):
                    raise ContractError(f"line {stmt.lineno}: KNOBS must be a dict literal")
                node = stmt.value
        return node

    @cached_property
    def knobs(self) -> dict[str, dict[str, Any]]:
        """KNOBS read with ``ast.literal_eval`` and validated (empty when not declared)."""
        node = self.knobs_node
        if node is None:
            return {}
        try:
            knobs = ast.literal_eval(node)
        except ValueError:
            raise ContractError(f"line {node.lineno}: KNOBS must be a literal (no names or calls)") from None
        for name, spec in knobs.items():
            validate_knob(name, spec)
        return knobs

    @property
    def knob_values(self) -> dict[str, Any]:
        return {name: spec["value"] for name, spec in self.knobs.items()}

    @cached_property
    def evolve_blocks(self) -> list[EvolveBlock]:
        blocks, start = [], None
        for i, line in enumerate(self.lines, 1):
            marker = line.strip()
            if marker == EVOLVE_START:
                if start is not None:
                    raise ContractError(f"line {i}: EVOLVE-BLOCK-START inside an open EVOLVE block (line {start - 1})")
                start = i + 1
            elif marker == EVOLVE_END:
                if start is None:
                    raise ContractError(f"line {i}: EVOLVE-BLOCK-END without a START")
                blocks.append(EvolveBlock(start, i - 1, "\n".join(self.lines[start - 1 : i - 1])))
                start = None
        if start is not None:
            raise ContractError(f"line {start - 1}: EVOLVE-BLOCK-START is never closed")
        return blocks

    def in_evolve_block(self, first: int, last: int) -> bool:
        return any(b.contains(first, last) for b in self.evolve_blocks)

    # ---- rewriting -----------------------------------------------------------------------
    def with_source(self, source: str) -> HarnessProgram:
        return HarnessProgram(source, name=self.name)

    def with_knobs(self, **values: Any) -> HarnessProgram:
        """A new program whose KNOBS literal has the given values; the rest of the text is kept."""
        knobs, node = self.knobs, self.knobs_node
        edits = []  # (start offset, end offset, new text)
        for name, value in values.items():
            if name not in knobs:
                raise ContractError(f"unknown knob {name!r}; declared: {', '.join(knobs) or 'none'}")
            validate_knob(name, {**knobs[name], "value": value})
            value_node = _knob_value_node(node, name)
            edits.append((self._offset(value_node.lineno, value_node.col_offset),
                          self._offset(value_node.end_lineno, value_node.end_col_offset), repr(value)))
        source = self.source
        for start, end, text in sorted(edits, reverse=True):
            source = source[:start] + text + source[end:]
        return self.with_source(source)

    def with_knob_choices(self, name: str, choices: list, value: Any) -> HarnessProgram:
        """A new program whose knob ``name`` offers ``choices`` and holds ``value``; the rest kept."""
        if name not in self.knobs:
            raise ContractError(f"unknown knob {name!r}; declared: {', '.join(self.knobs) or 'none'}")
        validate_knob(name, {**self.knobs[name], "choices": list(choices), "value": value})
        source = self.source
        spans = []
        for field, text in (("choices", repr(list(choices))), ("value", repr(value))):
            node = _knob_value_node(self.knobs_node, name, field)
            spans.append((self._offset(node.lineno, node.col_offset),
                          self._offset(node.end_lineno, node.end_col_offset), text))
        for start, end, text in sorted(spans, reverse=True):
            source = source[:start] + text + source[end:]
        return self.with_source(source)

    def _offset(self, lineno: int, col_bytes: int) -> int:
        """Character offset of an AST position (AST columns count UTF-8 bytes)."""
        lines = self.source.splitlines(keepends=True)
        return sum(len(x) for x in lines[: lineno - 1]) + len(lines[lineno - 1].encode()[:col_bytes].decode())


REFERENCE_PATH = Path(__file__).with_name("reference_harness.py")


def reference_program() -> HarnessProgram:
    """The reference harness (the human RL recipe), read from its file next to this module."""
    return HarnessProgram.from_file(REFERENCE_PATH)


def _knob_value_node(knobs: ast.Dict, name: str, field: str = "value") -> ast.expr:
    for key, spec in zip(knobs.keys, knobs.values):
        if isinstance(key, ast.Constant) and key.value == name and isinstance(spec, ast.Dict):
            for k, v in zip(spec.keys, spec.values):
                if isinstance(k, ast.Constant) and k.value == field:
                    return v
    raise ContractError(f"knob {name!r}: no {field!r} entry to rewrite")


def validate_knob(name: Any, spec: Any) -> None:
    """Raises ContractError unless ``spec`` has a value and a range or choices that hold it."""
    where = f"knob {name!r}"
    if not isinstance(name, str) or not name.isidentifier():
        raise ContractError(f"{where}: knob names must be identifiers")
    if not isinstance(spec, dict):
        raise ContractError(f"{where}: must be a dict like {{'value': v, 'range': [lo, hi]}}")
    unknown = set(spec) - _KNOB_KEYS
    if unknown:
        raise ContractError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: {sorted(_KNOB_KEYS)}")
    if "value" not in spec:
        raise ContractError(f"{where}: no 'value'")
    value = spec["value"]
    if ("range" in spec) == ("choices" in spec):
        raise ContractError(f"{where}: needs exactly one of 'range' or 'choices'")
    if "choices" in spec:
        choices = spec["choices"]
        if not isinstance(choices, (list, tuple)) or not choices:
            raise ContractError(f"{where}: 'choices' must be a non-empty list")
        if not any(value == c and isinstance(value, bool) == isinstance(c, bool) for c in choices):
            raise ContractError(f"{where}: value {value!r} is not one of the choices {list(choices)!r}")
        return
    rng = spec["range"]
    if (not isinstance(rng, (list, tuple)) or len(rng) != 2
            or not all(_is_number(x) for x in rng) or rng[0] > rng[1]):
        raise ContractError(f"{where}: 'range' must be [lo, hi] numbers with lo <= hi")
    if not _is_number(value) or not rng[0] <= value <= rng[1]:
        raise ContractError(f"{where}: value {value!r} is outside the range {list(rng)!r}")
    if not isinstance(spec.get("log", False), bool):
        raise ContractError(f"{where}: 'log' must be True or False")
    if spec.get("log") and rng[0] <= 0:
        raise ContractError(f"{where}: a log-scaled range must be positive")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def strip_docstrings(tree: ast.AST) -> ast.AST:
    """Removes docstrings in place (module, classes, functions) and returns the tree."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def normalised_dump(node: ast.AST) -> str:
    """``ast.dump`` without docstrings or positions: what identity and factor comparison use."""
    return ast.dump(strip_docstrings(copy.deepcopy(node)))
