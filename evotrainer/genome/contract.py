"""Static contract check of a harness program: the first filter before a genome is accepted.

It rejects, with one line naming the problem, what is certainly wrong or certainly hostile: syntax
errors, hooks with the wrong parameters, imports outside the allow-list, dunder access, dynamic
code execution, file access, oversized programs and malformed KNOBS or EVOLVE markers. It is not a
security boundary (Python can always be escaped statically): the sandbox is.
"""

from __future__ import annotations

import ast

from pydantic import ValidationError

from evotrainer.config import GRPOSection
from evotrainer.policy.grpo_config import TRAINER_SETTINGS

from .errors import ContractError
from .program import HOOK_PARAMS, HarnessProgram, reference_program

DEFAULT_ALLOWED_IMPORTS = ("numpy", "math", "statistics", "re", "collections", "itertools", "functools")
DEFAULT_MAX_BYTES = 64_000
DEFAULT_MAX_LINES = 1_500

# Builtins that run code, reach the file system or the interpreter's internals.
FORBIDDEN_NAMES = frozenset({
    "eval", "exec", "compile", "open", "__import__", "globals", "locals", "vars", "breakpoint",
    "input", "exit", "quit", "help", "memoryview", "__builtins__", "__loader__", "__spec__",
})
_ATTR_BUILTINS = {"getattr", "setattr", "delattr", "hasattr"}


def check_contract(
    program: HarnessProgram | str,
    allowed_imports: tuple[str, ...] | list[str] = DEFAULT_ALLOWED_IMPORTS,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_lines: int = DEFAULT_MAX_LINES,
) -> None:
    """Raises ContractError (one line) unless ``program`` meets the harness contract."""
    if isinstance(program, str):
        program = HarnessProgram(program)
    size = len(program.source.encode())
    if size > max_bytes:
        raise ContractError(f"program is {size} bytes; the limit is {max_bytes}")
    if len(program.lines) > max_lines:
        raise ContractError(f"program has {len(program.lines)} lines; the limit is {max_lines}")
    tree = program.tree  # syntax errors surface here
    _ = program.evolve_blocks, program.knobs  # marker balance, knob declarations
    _check_hooks(tree)
    allowed = set(allowed_imports)
    for node in sorted(_walk(tree), key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0))):
        problem = _problem(node, allowed)
        if problem:
            raise ContractError(f"line {node.lineno}: {problem}")
    check_knob_rules(program)
    check_knobs_read(program)


def check_knobs_read(program: HarnessProgram) -> None:
    """Every knob the genome declares is read by training: a trainer setting (``GRPOConfig``) or a
    name the genome's code mentions outside KNOBS (``KNOBS["scale_rewards"]`` in its ``advantages``),
    or one a reference hook it falls back to mentions (the sandbox hands a fallback hook the genome's
    KNOBS). A knob nothing reads would make every change of it a no-op child that trains, gates and
    ties, so it is refused here, naming the knob, rather than ignored."""
    unread = [n for n in program.knobs if n not in TRAINER_SETTINGS and n not in knob_names_read(program)]
    if unread:
        raise ContractError(f"KNOBS {', '.join(map(repr, unread))}: declared but nothing reads it (not a "
                            "trainer setting and no hook mentions it); remove it or read it in a hook")


def knob_names_read(program: HarnessProgram) -> set[str]:
    """String constants of the program outside its KNOBS literal, plus those of the reference hooks
    the program does not define (a conservative over-approximation of the knob names code reads)."""
    knobs_node = program.knobs_node
    skip = {id(n) for n in ast.walk(knobs_node)} if knobs_node is not None else set()
    live = program.functions   # a def shadowed by a later one of the same name never runs
    for stmt in program.tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and live.get(stmt.name) is not stmt:
            skip |= {id(n) for n in ast.walk(stmt)}
    names = {n.value for n in ast.walk(program.tree)
             if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip}
    ref = reference_program()
    for hook, node in ref.functions.items():
        if hook in HOOK_PARAMS and hook not in program.functions:
            names |= {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return names


def check_knob_rules(program: HarnessProgram) -> None:
    """Every value a recipe knob may take (its value, its choices, its range's ends) obeys the rule the
    config's ``grpo`` section gives that setting, so a genome that passes here is one the trainer
    accepts (``num_generations: 1`` or ``loss_type: magic`` is refused here, not when training starts)."""
    for name, spec in program.knobs.items():
        if name not in GRPOSection.model_fields or not isinstance(spec, dict):
            continue
        values = [("value", spec.get("value"))] + [("choice", c) for c in spec.get("choices") or []]
        values += [("range end", x) for x in (spec.get("range") or [])]
        for what, value in values:
            try:
                GRPOSection.model_validate({name: value})
            except ValidationError as e:
                msg = e.errors()[0]["msg"]
                raise ContractError(f"KNOBS[{name!r}] {what} {value!r}: {msg} (the trainer refuses it)") from None


def _walk(tree: ast.AST):
    return (n for n in ast.walk(tree) if hasattr(n, "lineno"))


def _check_hooks(tree: ast.Module) -> None:
    for node in tree.body:
        if isinstance(node, ast.AsyncFunctionDef) and node.name in HOOK_PARAMS:
            raise ContractError(f"line {node.lineno}: hook {node.name} must be a plain def, not async")
        if isinstance(node, ast.FunctionDef) and node.name in HOOK_PARAMS:
            expected = HOOK_PARAMS[node.name]
            a = node.args
            got = tuple(x.arg for x in a.posonlyargs + a.args)
            if got != expected or a.vararg or a.kwarg or a.kwonlyargs:
                raise ContractError(
                    f"line {node.lineno}: hook {node.name} must take ({', '.join(expected)}), "
                    f"got ({_signature(a)})")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and t.id in HOOK_PARAMS:
                    raise ContractError(f"line {node.lineno}: hook {t.id} must be defined with def")


def _signature(a: ast.arguments) -> str:
    parts = [x.arg for x in a.posonlyargs + a.args]
    if a.vararg:
        parts.append("*" + a.vararg.arg)
    parts += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        parts.append("**" + a.kwarg.arg)
    return ", ".join(parts)


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__") and len(name) > 4


def _problem(node: ast.AST, allowed: set[str]) -> str | None:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] not in allowed:
                return f"import of {alias.name!r} is not allowed (allowed: {', '.join(sorted(allowed))})"
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            return "relative imports are not allowed"
        if (node.module or "").split(".")[0] not in allowed:
            return f"import from {node.module!r} is not allowed (allowed: {', '.join(sorted(allowed))})"
    elif isinstance(node, ast.Attribute) and _is_dunder(node.attr):
        return f"access to dunder attribute {node.attr!r} is not allowed"
    elif isinstance(node, ast.Name):
        if node.id in FORBIDDEN_NAMES:
            return f"use of {node.id!r} is not allowed"
        if _is_dunder(node.id) and node.id != "__name__":
            return f"use of {node.id!r} is not allowed"
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ATTR_BUILTINS:
        attr = node.args[1] if len(node.args) > 1 else None
        if not (isinstance(attr, ast.Constant) and isinstance(attr.value, str)) or attr.value.startswith("_"):
            return f"{node.func.id}() needs a constant, public attribute name"
    elif isinstance(node, (ast.Global, ast.Nonlocal)) and any(_is_dunder(n) for n in node.names):
        return "rebinding dunder names is not allowed"
    return None
