"""Edits of harness programs: search/replace diffs, hook rewrites, crossover, and the factor rule.

Every edit either applies exactly as asked or raises ``EditError`` naming the block and the reason;
nothing is ever skipped silently, because an operator whose edit half-applied would be credited
with a change it did not make. Edits may only touch EVOLVE blocks.

A *factor* is ``knob:<name>`` or ``hook:<name>``. A hook's identity is the normalised AST of its
function plus the top-level helpers, constants and imports it reaches, so changing a helper used by
two hooks counts as changing both (and is rejected by the single-factor rule).

A hook change can leave a knob that only the old hook read with no reader (RLOO written without
``scale_rewards``). Such an *orphaned* knob is part of the hook change, not a second factor: removing
it (or changing its now meaningless value) does not count, and ``drop_knobs`` removes a declaration
left behind, which the contract would refuse as read by nothing.
"""

from __future__ import annotations

import ast
import functools
import re

from evotrainer.policy.grpo_config import SAMPLING_SETTINGS, TRAINER_SETTINGS

from .contract import knob_names_read
from .errors import ContractError, EditError, SingleFactorError
from .program import (
    EVOLVE_END,
    EVOLVE_START,
    HOOK_PARAMS,
    HOOKS,
    HarnessProgram,
    normalised_dump,
    reference_program,
)

_SEARCH = re.compile(r"^<{5,9} ?SEARCH\s*$")
_DIVIDER = re.compile(r"^={5,9}\s*$")
_REPLACE = re.compile(r"^>{5,9} ?REPLACE\s*$")


# ---- search / replace -------------------------------------------------------------------------
def parse_search_replace(diff_text: str) -> list[tuple[list[str], list[str]]]:
    """The (search lines, replace lines) blocks of a diff; text around the blocks is ignored."""
    blocks, state, search, replace = [], None, [], []
    for line in diff_text.splitlines():
        if state is None:
            if _SEARCH.match(line):
                state, search, replace = "search", [], []
        elif state == "search":
            if _DIVIDER.match(line):
                state = "replace"
            elif _SEARCH.match(line) or _REPLACE.match(line):
                raise EditError(f"block {len(blocks) + 1}: expected ======= after the SEARCH lines")
            else:
                search.append(line)
        elif _REPLACE.match(line):
            blocks.append((search, replace))
            state = None
        elif _SEARCH.match(line) or _DIVIDER.match(line):
            raise EditError(f"block {len(blocks) + 1}: expected >>>>>>> REPLACE to close the block")
        else:
            replace.append(line)
    if state is not None:
        raise EditError(f"block {len(blocks) + 1}: not closed with >>>>>>> REPLACE")
    if not blocks:
        raise EditError("no SEARCH/REPLACE blocks found")
    return blocks


def apply_search_replace(program: HarnessProgram, diff_text: str) -> HarnessProgram:
    """Applies every block in order; each must match exactly once, inside one EVOLVE block."""
    current = program
    for n, (search, replace) in enumerate(parse_search_replace(diff_text), 1):
        if not any(s.strip() for s in search):
            raise EditError(f"block {n}: SEARCH is empty")
        if any(line.strip() in (EVOLVE_START, EVOLVE_END) for line in search + replace):
            raise EditError(f"block {n}: edits must not add, move or remove EVOLVE-BLOCK markers")
        lines = current.lines
        # Trailing whitespace is not significant (LLMs drop it); indentation is.
        want = [s.rstrip() for s in search]
        k = len(want)
        hits = [i for i in range(len(lines) - k + 1) if [x.rstrip() for x in lines[i : i + k]] == want]
        if not hits:
            raise EditError(f"block {n}: SEARCH text not found (it must match whole lines exactly)")
        if len(hits) > 1:
            where = ", ".join(str(i + 1) for i in hits[:5])
            raise EditError(f"block {n}: SEARCH text matches {len(hits)} places (lines {where}); add context")
        first, last = hits[0] + 1, hits[0] + k
        try:
            inside = current.in_evolve_block(first, last)
        except ContractError as e:
            raise EditError(f"block {n}: {e}") from None
        if not inside:
            raise EditError(f"block {n}: lines {first}-{last} are outside the EVOLVE blocks")
        current = current.with_source(_join(lines[: first - 1] + replace + lines[last:], program.source))
    return current


def _join(lines: list[str], like: str) -> str:
    return "\n".join(lines) + ("\n" if like.endswith("\n") else "")


# ---- hook rewrite and crossover ---------------------------------------------------------------
def rewrite_hook(program: HarnessProgram, hook: str, new_source: str) -> HarnessProgram:
    """Replaces the whole ``def hook`` (which must lie in an EVOLVE block) with ``new_source``.

    A hook the program does not define yet is appended in a new EVOLVE block.
    """
    if hook not in HOOK_PARAMS:
        raise EditError(f"{hook!r} is not a hook; hooks: {', '.join(HOOKS)}")
    try:
        tree = ast.parse(new_source)
    except SyntaxError as e:
        raise EditError(f"new {hook} source: syntax error at line {e.lineno}: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError) as e:   # null bytes; nested past the parser's limit
        raise EditError(f"new {hook} source does not parse ({type(e).__name__})") from None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef) or tree.body[0].name != hook:
        raise EditError(f"new {hook} source must be exactly one top-level 'def {hook}(...)'")
    return _replace_hook(program, hook, new_source.strip("\n"))


def _replace_hook(program: HarnessProgram, hook: str, text: str) -> HarnessProgram:
    lines = program.lines
    node = program.functions.get(hook)
    if node is None:
        new = lines + ["", "", EVOLVE_START, *text.splitlines(), EVOLVE_END]
        return program.with_source(_join(new, "\n"))
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    if not program.in_evolve_block(first, node.end_lineno):
        raise EditError(f"hook {hook} (lines {first}-{node.end_lineno}) is outside the EVOLVE blocks")
    return program.with_source(_join(lines[: first - 1] + text.splitlines() + lines[node.end_lineno :], program.source))


def crossover(a: HarnessProgram, b: HarnessProgram, factor: str) -> HarnessProgram:
    """Parent ``a`` with one factor (``knob:<name>`` or ``hook:<name>``) taken from parent ``b``."""
    kind, _, name = factor.partition(":")
    if kind == "knob":
        if name not in b.knobs:
            raise EditError(f"crossover: parent b has no knob {name!r}")
        if name not in a.knobs:
            raise EditError(f"crossover: parent a has no knob {name!r} to set")
        return a.with_knobs(**{name: b.knobs[name]["value"]})
    if kind != "hook" or name not in HOOK_PARAMS:
        raise EditError(f"crossover: factor must be knob:<name> or hook:<hook>, got {factor!r}")
    if name not in b.functions:
        raise EditError(f"crossover: parent b does not define hook {name}")
    defs_a, defs_b = _toplevel(a), _toplevel(b)
    extra = []  # helpers/imports the hook needs that a lacks, carried in with it
    for dep in sorted(_deps(b, name) - {name}):
        if dep in defs_a:
            if defs_a[dep][1] != defs_b[dep][1]:
                raise EditError(f"crossover: helper {dep!r} differs between the parents")
        elif defs_b[dep][0] not in extra:
            extra.append(defs_b[dep][0])
    # Keep b's order so that helpers are defined before use.
    texts = [b.segment(n) for n in sorted(extra, key=lambda n: n.lineno)]
    return _replace_hook(a, name, "\n\n".join(texts + [b.segment(b.functions[name])]))


# ---- factors ----------------------------------------------------------------------------------
def _toplevel(program: HarnessProgram) -> dict[str, tuple[ast.stmt, str]]:
    """Top-level name -> (defining statement, normalised dump). KNOBS is its own factor."""
    return _toplevel_of_source(program.source)


@functools.lru_cache(maxsize=512)
def _toplevel_of_source(source: str) -> dict[str, tuple[ast.stmt, str]]:
    # Cached by source: factor comparison asks for it once per hook on both programs, and the
    # normalised dumps (deep copies of the tree) dominate the cost of every operator's child.
    out: dict[str, tuple[ast.stmt, str]] = {}
    for stmt in ast.parse(source).body:
        names: list[str] = []
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [stmt.name]
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            names = [(a.asname or a.name).split(".")[0] for a in stmt.names]
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        for name in names:
            if name != "KNOBS":
                out[name] = (stmt, normalised_dump(stmt))
    return out


def _deps(program: HarnessProgram, name: str) -> set[str]:
    """``name`` and the top-level names it reaches, transitively."""
    defs = _toplevel(program)
    seen, todo = set(), [name]
    while todo:
        n = todo.pop()
        if n in seen or n not in defs:
            continue
        seen.add(n)
        todo += [x.id for x in ast.walk(defs[n][0]) if isinstance(x, ast.Name)]
    return seen


def hook_fingerprint(program: HarnessProgram, hook: str) -> str | None:
    if hook not in program.functions:
        return None
    defs = _toplevel(program)
    return "\n".join(defs[n][1] for n in sorted(_deps(program, hook)))


def hooks_reading(program: HarnessProgram, knob: str) -> set[str]:
    """The hooks whose code, helpers included, names ``knob`` (``KNOBS["knob"]``); a hook the genome
    does not define is the reference's, which the sandbox hands the genome's KNOBS."""
    out, reference = set(), None
    for hook in HOOKS:
        if hook in program.functions:
            source = program
        else:
            source = reference = reference or reference_program()   # read from its file once per call
        if hook not in source.functions:
            continue
        defs = _toplevel(source)
        for name in _deps(source, hook) - {"KNOBS"}:   # the KNOBS literal names every knob
            if any(isinstance(n, ast.Constant) and n.value == knob for n in ast.walk(defs[name][0])):
                out.add(hook)
                break
    return out


# What acts only inside a gradient step: the hooks that turn rewards into the step's batch, and the
# trainer settings that do not shape the sampled rollouts (beta and guided_imitation aside: a KL term
# and an imitation term step on their own, with no advantage).
STEP_HOOKS = ("keep_groups", "advantages")
STEP_SETTINGS = TRAINER_SETTINGS - SAMPLING_SETTINGS - {"beta", "guided_imitation"}
DIAGNOSTIC_HOOKS = ("metrics", "alerts", "validity")


def acts_only_in_a_step(program: HarnessProgram, knob: str) -> bool:
    """Whether ``knob`` of ``program`` acts only inside a gradient step: a trainer setting that does not
    shape the sampled rollouts, or a harness knob that only ``keep_groups``/``advantages`` read (and
    diagnostics). A step the trainer skips (no advantage, no KL term) leaves such a knob no effect."""
    if knob in TRAINER_SETTINGS:
        return knob in STEP_SETTINGS
    readers = hooks_reading(program, knob)
    return bool(readers & set(STEP_HOOKS)) and readers <= set(STEP_HOOKS + DIAGNOSTIC_HOOKS)


def factors_changed(parent: HarnessProgram, child: HarnessProgram) -> list[str]:
    """The factors in which ``child`` differs from ``parent``: knobs (sorted), then hooks.

    A knob orphaned by the hook change (see ``orphaned_knobs``) is not a factor of its own."""
    knobs = [k for k in sorted(set(parent.knobs) | set(child.knobs)) if parent.knobs.get(k) != child.knobs.get(k)]
    hooks = [h for h in HOOKS if hook_fingerprint(parent, h) != hook_fingerprint(child, h)]
    if knobs and hooks:
        orphaned = set(orphaned_knobs(parent, child, hooks))
        knobs = [k for k in knobs if k not in orphaned]
    return [f"knob:{k}" for k in knobs] + [f"hook:{h}" for h in hooks]


def orphaned_knobs(parent: HarnessProgram, child: HarnessProgram, hooks: list[str] | None = None) -> list[str]:
    """Knobs of ``parent`` whose only readers were the hooks ``child`` changes: a changed hook of the
    parent mentions the knob, and nothing in the child does (trainer settings are always read).

    ``hooks`` are the changed hooks when the caller knows them."""
    if hooks is None:
        hooks = [h for h in HOOKS if hook_fingerprint(parent, h) != hook_fingerprint(child, h)]
    if not hooks:
        return []
    candidates = [k for k in parent.knobs if k not in TRAINER_SETTINGS]
    if not candidates:
        return []
    read_by_changed: set[str] = set()
    for hook in hooks:
        # The parent's hook with its helpers, or the reference hook it fell back to.
        source = parent if hook in parent.functions else reference_program()
        if hook not in source.functions:
            continue
        defs = _toplevel(source)
        for name in _deps(source, hook):
            read_by_changed |= {n.value for n in ast.walk(defs[name][0])
                                if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    candidates = [k for k in candidates if k in read_by_changed]
    if not candidates:
        return []
    read_by_child = knob_names_read(child)
    return [k for k in candidates if k not in read_by_child]


def drop_knobs(program: HarnessProgram, names: list[str] | set[str]) -> HarnessProgram:
    """``program`` without the given KNOBS entries (a whole line when the entry has one to itself);
    EditError when an entry lies outside the EVOLVE blocks or the result does not read back."""
    names = set(names) & set(program.knobs)
    if not names:
        return program
    node = program.knobs_node
    source = program.source
    spans = []
    for key, value in zip(node.keys, node.values):
        if isinstance(key, ast.Constant) and key.value in names:
            if not program.in_evolve_block(key.lineno, value.end_lineno):
                raise EditError(f"KNOBS[{key.value!r}] (line {key.lineno}) is outside the EVOLVE blocks")
            start = program._offset(key.lineno, key.col_offset)
            end = program._offset(value.end_lineno, value.end_col_offset)
            end += re.match(r"[ \t]*,?", source[end:]).end()
            line_start = source.rfind("\n", 0, start) + 1
            rest_of_line = re.match(r"[ \t]*(#[^\n]*)?(\n|$)", source[end:])
            if not source[line_start:start].strip() and rest_of_line:
                start, end = line_start, end + rest_of_line.end()
            else:
                end += re.match(r"[ \t]*", source[end:]).end()
            spans.append((start, end))
    for start, end in sorted(spans, reverse=True):
        source = source[:start] + source[end:]
    out = program.with_source(source)
    want = {k: v for k, v in program.knobs.items() if k not in names}
    try:
        ok = out.knobs == want and out.hooks == program.hooks
    except (ContractError, SyntaxError):
        ok = False
    if not ok:
        raise EditError(f"removing KNOBS {', '.join(sorted(names))} does not leave the rest intact")
    return out


def check_single_factor(parent: HarnessProgram, child: HarnessProgram, allow_multi: bool = False) -> list[str]:
    """The changed factors; SingleFactorError unless there is exactly one (or several, if allowed)."""
    factors = factors_changed(parent, child)
    if not factors:
        raise SingleFactorError("the child changes no factor (no knob value and no hook differs)", factors)
    if len(factors) > 1 and not allow_multi:
        raise SingleFactorError(
            f"the child changes {len(factors)} factors ({', '.join(factors)}); exactly one is allowed", factors)
    return factors
