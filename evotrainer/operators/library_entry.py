"""What an intervention-library entry is: ``LibraryEntry`` (its trigger, its one edit, its
parameters) and the value rules it applies (``same_value``, ``knob_values``; its trigger's conditions
are written with ``triggers.when`` and read by ``triggers.holds``).

A module of its own so that the data modules (``library_entries.py``, ``swe_entries.py``) and the
``library`` operator (``library.py``) import it without importing each other.
"""

from __future__ import annotations

import itertools
import math
import string
from dataclasses import dataclass
from typing import Any

from evotrainer.genome.edits import rewrite_hook
from evotrainer.genome.errors import GenomeError
from evotrainer.genome.program import HOOK_PARAMS, HarnessProgram
from evotrainer.operators.base import OperatorError
from evotrainer.operators.intervention import ExpectedEffect
from evotrainer.operators.triggers import holds


@dataclass(frozen=True)
class Param:
    """One parameter of a hook template: the values it may take (JSON scalars)."""
    name: str
    choices: tuple[Any, ...]


@dataclass(frozen=True)
class KnobMove:
    """How a knob entry moves a knob: multiply a range knob's value by one of ``factors`` (clipped to
    its range), or, for a choices knob, step ``direction`` ("up"/"down") to any larger/smaller choice;
    ``to`` sets a choices knob to one value (e.g. ``True``)."""
    knob: str
    factors: tuple[float, ...] = ()
    direction: str = "up"
    to: Any = None


@dataclass(frozen=True)
class LibraryEntry:
    id: str
    summary: str                          # one line: what the change does (prompts, reports)
    factor: str                           # "knob:NAME" or "hook:NAME"
    trigger: tuple[dict[str, Any], ...]   # all must hold on the parent's report metrics
    hypothesis: str                       # str.format template: params, plus {old}/{new} for knobs
    expected_effect: ExpectedEffect
    source: str                           # paper or recipe
    template: str = ""                    # hook entries: the complete new ``def``, ``$param`` placeholders
    params: tuple[Param, ...] = ()        # hook entries: the template's parameters
    move: KnobMove | None = None          # knob entries
    needs_knobs: tuple[str, ...] = ()     # knobs the template reads from KNOBS
    requires_hook: str | None = None      # a hook the parent must already define (e.g. select_tasks)
    weight: float = 1.0
    # Reads one completion (its length against max_completion_length, its truncation or answer
    # format): meaningless on multi-turn episodes, whose completion spans turns and tool results.
    single_turn: bool = False
    # Reads an episode's turns and tool calls: meaningless on single-turn rollouts.
    episodes_only: bool = False
    # A second report the same change answers (all must hold): the entry fires on either.
    or_trigger: tuple[dict[str, Any], ...] = ()
    # Further such reports (each a set of conditions that must all hold), after the or_trigger.
    more_triggers: tuple[tuple[dict[str, Any], ...], ...] = ()

    @property
    def kind(self) -> str:
        return self.factor.partition(":")[0]

    @property
    def target(self) -> str:
        return self.factor.partition(":")[2]

    @property
    def triggers(self) -> tuple[tuple[dict[str, Any], ...], ...]:
        """Each set of conditions the entry fires on (its trigger, its or_trigger, then any more)."""
        return tuple(t for t in (self.trigger, self.or_trigger, *self.more_triggers) if t)

    def fires(self, metrics: dict[str, Any]) -> bool:
        return any(all(holds(c, metrics) for c in t) for t in self.triggers)

    # ---- what the entry can do on a parent -----------------------------------------------
    def unavailable(self, parent: HarnessProgram) -> str | None:
        """Why this entry cannot edit ``parent`` (None when it can)."""
        if self.requires_hook and (self.requires_hook not in HOOK_PARAMS or self.requires_hook not in parent.functions):
            return f"needs hook {self.requires_hook}, which the parent does not define in an EVOLVE block"
        missing = [k for k in self.needs_knobs + ((self.move.knob,) if self.move else ()) if k not in parent.knobs]
        if missing:
            return f"needs knob(s) {', '.join(missing)}, which the parent does not declare"
        empty = [p for p, values in self.options(parent).items() if not values]
        if empty:
            return f"no allowed value of {', '.join(empty)} differs from the parent's"
        return None

    def options(self, parent: HarnessProgram) -> dict[str, list[Any]]:
        """Each parameter's allowed values on ``parent``: a knob entry's one parameter ``value`` is
        derived from the parent's current value and the knob's range or choices."""
        if self.move is None:
            return {p.name: list(p.choices) for p in self.params}
        spec = parent.knobs.get(self.move.knob)
        return {"value": knob_values(spec, self.move) if spec else []}

    def combinations(self, parent: HarnessProgram) -> list[dict[str, Any]]:
        opts = self.options(parent)
        names = list(opts)
        return [dict(zip(names, values)) for values in itertools.product(*(opts[n] for n in names))]

    # ---- the edit --------------------------------------------------------------------------
    def render(self, params: dict[str, Any]) -> str:
        """A hook entry's new ``def`` with the parameters written in as Python literals."""
        return string.Template(self.template).substitute({k: repr(v) for k, v in params.items()})

    def apply(self, parent: HarnessProgram, params: dict[str, Any]) -> HarnessProgram:
        """The child: ``parent`` with this entry's one edit. Raises OperatorError for parameters
        outside the allowed values, and when the edit does not apply."""
        allowed = self.options(parent)
        if set(params) != set(allowed):
            raise OperatorError(f"entry {self.id} takes parameters {sorted(allowed) or 'none'}, got {sorted(params)}",
                                "parse")
        for name, value in params.items():
            if not any(same_value(value, v) for v in allowed[name]):
                raise OperatorError(f"entry {self.id}: {name}={value!r} is not one of {allowed[name]}", "parse")
        try:
            if self.move is not None:
                return parent.with_knobs(**{self.move.knob: params["value"]})
            return rewrite_hook(parent, self.target, self.render(params))
        except GenomeError as err:
            raise OperatorError(f"entry {self.id} does not apply: {err}", "edit") from err

    def hypothesis_text(self, parent: HarnessProgram, params: dict[str, Any]) -> str:
        old = parent.knobs[self.move.knob]["value"] if self.move else None
        return self.hypothesis.format(**params, old=old, new=params.get("value"))


def same_value(a: Any, b: Any) -> bool:
    """Equal, and of the same kind: ``True`` is not ``1``; ``4`` and ``4.0`` are the same number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def knob_values(spec: dict[str, Any], move: KnobMove) -> list[Any]:
    """The values a knob move may set: different from the current value and inside the knob's
    range or choices."""
    current = spec["value"]
    if "choices" in spec:
        choices = list(spec["choices"])
        if move.to is not None:
            return [c for c in choices if same_value(c, move.to) and not same_value(c, current)]
        numeric = [c for c in choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
        if move.direction == "up":
            return sorted(c for c in numeric if c > current)
        return sorted((c for c in numeric if c < current), reverse=True)
    lo, hi = spec["range"]
    integer = all(isinstance(x, int) and not isinstance(x, bool) for x in (lo, hi, current))
    out: list[Any] = []
    for f in move.factors:
        v = min(max(current * f, lo), hi)
        v = int(round(v)) if integer else float(f"{v:.3g}")   # readable genomes; finer than any effect
        if lo <= v <= hi and not same_value(v, current) and not any(same_value(v, o) for o in out):
            out.append(v)
    return out
