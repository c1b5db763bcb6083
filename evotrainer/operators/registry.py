"""Operators by name: built-ins, ``@register_operator`` and the ``evotrainer.operators`` entry points.

``OperatorMix`` draws operators by weight, records per-operator statistics (proposals, accepted,
rejections by kind, tokens) and drops an operator from the draw once its LLM budget is spent.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from evotrainer.operators.base import Operator, OperatorError
from evotrainer.operators.evidence import Evidence
from evotrainer.operators.intervention import Intervention
from evotrainer.records.outcome import GateOutcome

ENTRY_POINT_GROUP = "evotrainer.operators"

# Built-ins are imported on first use, so that naming "knobs" does not import an LLM stack.
BUILTINS: dict[str, str] = {
    "llm_diff": "evotrainer.operators.llm:LLMDiffOperator",
    "llm_rewrite": "evotrainer.operators.llm:LLMRewriteOperator",
    "llm_crossover": "evotrainer.operators.llm:LLMCrossoverOperator",
    "llm_repair": "evotrainer.operators.llm:LLMRepairOperator",
    "llm_choice": "evotrainer.operators.llm_choice:LLMChoiceOperator",
    "library": "evotrainer.operators.library:LibraryOperator",
    "random_library": "evotrainer.operators.library:RandomLibraryOperator",
    "knobs": "evotrainer.operators.knobs:KnobOperator",
    "crossover": "evotrainer.operators.structural:CrossoverOperator",
}

_registered: dict[str, Callable[..., Any]] = {}


def register_operator(name: str, replace: bool = False) -> Callable:
    """Class or factory decorator: ``@register_operator("double_lr")`` makes it available by name."""

    def decorate(factory: Callable[..., Any]) -> Callable[..., Any]:
        if not replace and (name in BUILTINS or name in _registered) and _registered.get(name) is not factory:
            raise ValueError(f"operator {name!r} is already registered; pass replace=True to override")
        _registered[name] = factory
        return factory

    return decorate


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_operators() -> list[str]:
    return sorted(set(BUILTINS) | set(_registered) | set(_entry_points()))


def _factory(name: str) -> Callable[..., Any]:
    if name in _registered:
        return _registered[name]
    if name in BUILTINS:
        module, attr = BUILTINS[name].split(":")
        return getattr(importlib.import_module(module), attr)
    eps = _entry_points()
    if name in eps:
        try:
            return eps[name].load()
        except Exception as err:  # a broken plugin must say which one it is
            raise ImportError(f"operator {name!r} from entry point {eps[name].value!r} failed to load: {err}") from err
    raise KeyError(f"unknown operator {name!r}; known operators: {', '.join(available_operators())}")


def get_operator(name: str, **kwargs: Any) -> Operator:
    """An operator instance by name; ``kwargs`` go to its constructor."""
    factory = _factory(name)
    # An entry point may name a class, a factory function, or a ready instance.
    op = factory if hasattr(factory, "propose") and not inspect.isclass(factory) else factory(**kwargs)
    if not callable(getattr(op, "propose", None)):
        raise TypeError(f"operator {name!r} ({factory!r}) has no propose(parents, evidence) method")
    if not getattr(op, "name", None):
        op.name = name
    return op


def accepted_kwargs(name: str, shared: dict[str, Any]) -> dict[str, Any]:
    """The subset of ``shared`` that operator ``name``'s constructor accepts (for mixes that hand
    one client and seed to every operator)."""
    factory = _factory(name)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(shared)
    return {k: v for k, v in shared.items() if k in params}


@dataclass
class OperatorStats:
    proposals: int = 0
    accepted: int = 0
    rejections: Counter = field(default_factory=Counter)
    reasons: list[str] = field(default_factory=list)    # the latest rejection reasons (bounded)
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def record(self, result: Intervention | OperatorError) -> None:
        self.proposals += 1
        self.prompt_tokens += result.prompt_tokens
        self.completion_tokens += result.completion_tokens
        if isinstance(result, Intervention):
            self.accepted += 1
        else:
            self.rejections[result.kind] += 1
            self.reasons = (self.reasons + [result.reason])[-20:]

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposals if self.proposals else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"proposals": self.proposals, "accepted": self.accepted, "rejections": dict(self.rejections),
                "acceptance_rate": self.acceptance_rate, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "recent_reasons": list(self.reasons)}


def run_operator(op: Operator, parents: list, evidence: Evidence,
                 stats: dict[str, OperatorStats] | None = None, name: str | None = None) -> Intervention:
    """``op.propose`` with its outcome counted in ``stats``. Unexpected exceptions from an operator
    (a bug in a user plugin) become an ``OperatorError`` so one bad operator cannot stop a search."""
    try:
        result: Intervention | OperatorError = op.propose(parents, evidence)
    except OperatorError as err:
        result = err
    except Exception as err:  # noqa: BLE001 - rejected with the reason, never a crash of the loop
        result = OperatorError(f"operator raised {type(err).__name__}: {err}", "input")
    if stats is not None:
        stats.setdefault(name or op.name, OperatorStats()).record(result)
    if isinstance(result, OperatorError):
        raise result
    return result


class OperatorMix:
    """Draws operators by weight (seeded) and keeps their statistics.

    ``shared`` kwargs (an LLM client, a seed) go to each operator that accepts them;
    ``kwargs_by_name`` gives per-operator constructor arguments. With ``repair=True``, a child that
    was built but failed the contract is handed once to ``llm_repair`` with the error text.

    The weights adapt (a Bernoulli bandit, as ShinkaEvolve adapts its choice of LLMs): ``credit``
    records whether an operator's gated child succeeded (promoted: a fitness win), and each
    draw multiplies an operator's configured weight by a Thompson sample from Beta(1 + successes,
    1 + failures). ``entry_weights`` is the same for the entries of the intervention library, kept
    as the mean of that Beta so the ``library`` operator can read it.
    """

    def __init__(self, weights: dict[str, float], seed: int = 0, shared: dict[str, Any] | None = None,
                 kwargs_by_name: dict[str, dict[str, Any]] | None = None, repair: bool = False) -> None:
        unknown = [n for n in weights if n not in available_operators()]
        if unknown:
            raise KeyError(f"unknown operator(s) {', '.join(unknown)}; known operators: "
                           f"{', '.join(available_operators())}")
        if any(w < 0 for w in weights.values()) or not any(w > 0 for w in weights.values()):
            raise ValueError(f"operator weights must be >= 0 with at least one > 0: {weights}")
        self.weights = dict(weights)
        self.rng = random.Random(seed)
        self.shared = dict(shared or {})
        self.kwargs_by_name = dict(kwargs_by_name or {})
        self.repair = repair
        self.stats: dict[str, OperatorStats] = {n: OperatorStats() for n in weights}
        self._instances: dict[str, Operator] = {}
        self.outcomes: dict[str, list[int]] = {}          # operator -> [successes, failures]
        self.entry_outcomes: dict[str, list[int]] = {}    # library entry id -> [successes, failures]
        self.entry_weights: dict[str, float] = {}         # library entry id -> posterior mean (shared, live)

    def credit(self, name: str, success: bool, entry: str | None = None) -> None:
        """One gated child of operator ``name`` (and library ``entry``) succeeded or not."""
        for table, key in ((self.outcomes, name), (self.entry_outcomes, entry)):
            if key is not None:
                table.setdefault(key, [0, 0])[0 if success else 1] += 1
        if entry is not None:
            s, f = self.entry_outcomes[entry]
            self.entry_weights[entry] = (1 + s) / (2 + s + f)
            self._weigh_entries()

    def observe(self, outcome: GateOutcome) -> None:
        """A gate's outcome for a child this mix's operators proposed: the operator and entry are
        credited on fitness (promoted or not, not whether the hypothesis held: a confirmed hypothesis
        whose child did not win would otherwise raise its entry's weight again and again), and the
        operator itself is told when its class declares ``observe(outcome)`` (the knobs operator's TPE
        study; it is built for that when this process has not built it yet, as on a resumed run)."""
        if outcome.operator is None:
            return
        self.credit(outcome.operator, outcome.promoted, entry=outcome.entry)
        name = outcome.operator
        if name in self._instances or (name in self.weights and callable(getattr(_factory(name), "observe", None))):
            op = self.operator(name)
            if callable(getattr(op, "observe", None)):
                op.observe(outcome)

    def _weigh_entries(self) -> None:
        """The library operator draws an entry by its own weight times twice its posterior mean (1 with
        no evidence yet), so entries whose children are promoted are proposed more."""
        op = self._instances.get("library")
        if op is None or not hasattr(op, "set_weights"):
            return
        base = {e.id: e.weight for e in getattr(op, "entries", [])}
        op.set_weights({e: base[e] * 2 * w for e, w in self.entry_weights.items() if e in base})

    def _bandit(self, name: str) -> float:
        s, f = self.outcomes.get(name, (0, 0))
        return self.rng.betavariate(1 + s, 1 + f)

    def operator(self, name: str) -> Operator:
        if name not in self._instances:
            kwargs = {**accepted_kwargs(name, self.shared), **self.kwargs_by_name.get(name, {})}
            self._instances[name] = get_operator(name, **kwargs)
            if name == "library":
                self._weigh_entries()
        return self._instances[name]

    def choose_name(self, n_parents: int | None = None) -> str:
        """An operator name drawn by weight, among those that can work on ``n_parents`` parents
        (an operator declares how many it needs with an ``n_parents`` attribute; default 1)."""
        names = [n for n, w in self.weights.items() if w > 0
                 and (n_parents is None or getattr(self.operator(n), "n_parents", 1) <= n_parents)]
        if not names:
            raise OperatorError("no operator left to draw (all weights zero or budgets spent)", "budget")
        return self.rng.choices(names, weights=[self.weights[n] * self._bandit(n) for n in names])[0]

    def choose(self, n_parents: int | None = None) -> Operator:
        return self.operator(self.choose_name(n_parents))

    def propose(self, parents: list, evidence: Evidence, attempts: int = 1,
                on_reject: Callable[[str, OperatorError], None] | None = None) -> Intervention:
        """Up to ``attempts`` draws until one operator's child is accepted; the last rejection is
        raised if none is. Every rejection goes to ``on_reject`` (the run's event log), the last one
        included. An operator whose budget is spent is dropped from later draws."""
        last: OperatorError | None = None
        for _ in range(max(1, attempts)):
            name = self.choose_name(len(parents))
            try:
                return run_operator(self.operator(name), parents, evidence, self.stats, name=name)
            except OperatorError as err:
                last = err
                if on_reject:
                    on_reject(name, err)
                if self.repair and err.child_source and err.kind in ("contract", "sandbox"):
                    try:
                        return self._repair(parents, evidence, err)
                    except OperatorError as repair_err:
                        last = repair_err
                        if on_reject:   # it spent LLM calls too: in the event log like any rejection
                            on_reject("llm_repair", repair_err)
                if err.kind == "budget":
                    self.weights[name] = 0.0
                    if not any(w > 0 for w in self.weights.values()):
                        raise
        assert last is not None
        raise last

    def _repair(self, parents: list, evidence: Evidence, err: OperatorError) -> Intervention:
        broken = dataclasses.replace(evidence, failed_source=err.child_source, failure=err.reason)
        return run_operator(self.operator("llm_repair"), parents[:1], broken, self.stats, name="llm_repair")

    def stats_dict(self) -> dict[str, dict[str, Any]]:
        return {name: {**s.to_dict(), "gated_successes": self.outcomes.get(name, [0, 0])[0],
                       "gated_failures": self.outcomes.get(name, [0, 0])[1]} for name, s in self.stats.items()}
