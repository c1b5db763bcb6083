"""The intervention library: known training-side interventions as data, and the ``library`` operator.

An entry is one intervention from the RL-for-LLMs literature or a standard recipe (DAPO dynamic
sampling, RLOO, a lower sampling temperature, ...): *when* it applies (a trigger over health-report
metrics, the same ``{"metric", "op", "value"}`` conditions as skills), *what* it changes (one knob or
one hook), *how* (a parameterised edit: a hook template with ``$param`` placeholders, or a move of a
knob's value), the hypothesis it tests, the effect it expects, and where it comes from. What an entry
is lives in ``library_entry.py``, the entries themselves in ``library_entries.py`` and
``swe_entries.py``, the trigger conditions in ``triggers.py``.

The ``library`` operator needs no LLM: it draws, by weight, an entry whose trigger fires on the
parent's health report, draws its parameters among the allowed values, and hands the child to
``make_intervention``. ``llm_choice`` shows the same fired entries to a model that picks one.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from evotrainer.genome.errors import GenomeError
from evotrainer.genome.program import HarnessProgram
from evotrainer.operators.acceptance import make_intervention
from evotrainer.operators.base import OperatorError
from evotrainer.operators.evidence import Evidence
from evotrainer.operators.intervention import Intervention
from evotrainer.operators.library_entries import ENTRIES
from evotrainer.operators.library_entry import LibraryEntry
from evotrainer.operators.triggers import report_metrics
from evotrainer.operators.swe_entries import SWE_ENTRIES

log = logging.getLogger(__name__)

def default_entries() -> list[LibraryEntry]:
    return list(ENTRIES) + list(SWE_ENTRIES)


# A report of multi-turn episodes carries this metric (the SWE harness's, and any episode harness's).
EPISODE_METRIC = "turns_mean"
EPISODES_ONLY = (f"an episode entry (it reads turns and tool calls); this parent's report has no {EPISODE_METRIC}: "
                 "its rollouts are single-turn")
SINGLE_TURN_ONLY = ("a single-turn entry (it reads one completion's length, truncation or answer format); "
                    f"this parent's rollouts are multi-turn episodes ({EPISODE_METRIC} in its report)")


@dataclass
class Applicable:
    """An entry that fires on a report and can edit the parent, with its parameter options."""
    entry: LibraryEntry
    options: dict[str, list[Any]]
    combinations: list[dict[str, Any]] = field(default_factory=list)   # not yet tried on this parent


def confirmed_entries(evidence: Evidence) -> dict[str, int]:
    """Library entry id -> the confirmations of the skills in ``evidence`` (those whose trigger fired
    on this report) that came from it."""
    out: dict[str, int] = {}
    for skill in evidence.skills:
        entry = skill.get("entry") if isinstance(skill, dict) else None
        n = int(skill.get("confirmations") or 0) if entry else 0
        if n > 0:
            out[entry] = out.get(entry, 0) + n
    return out


def applicable_entries(parent: HarnessProgram, evidence: Evidence, entries: Sequence[LibraryEntry],
                       tried: set[str] = frozenset(), diagnose: bool = True) -> tuple[list[Applicable], dict[str, str]]:
    """(entries that fire and have an untried child, {entry id: why it was left out}). With
    ``diagnose=False`` the triggers are not read: every entry that can edit the parent is offered.
    A confirmed skill that came from an entry stands in for the entry's own trigger: it fired on this
    report, and its trigger is the state in which a gate saw the entry win, not the literature's guess."""
    metrics = report_metrics(evidence.health_report or {})
    skilled = confirmed_entries(evidence) if diagnose else {}
    found, skipped = [], {}
    for entry in entries:
        if f"{parent.hash}:{entry.id}" in evidence.refuted:
            skipped[entry.id] = "refuted on fitness from this parent harness already"
            continue
        if diagnose and not entry.fires(metrics) and entry.id not in skilled:
            skipped[entry.id] = "trigger does not fire"
            continue
        if entry.single_turn and EPISODE_METRIC in metrics:
            skipped[entry.id] = SINGLE_TURN_ONLY
            continue
        if entry.episodes_only and EPISODE_METRIC not in metrics:
            skipped[entry.id] = EPISODES_ONLY
            continue
        why = entry.unavailable(parent)
        if why:
            skipped[entry.id] = why
            continue
        combos = entry.combinations(parent)
        fresh = [p for p in combos if _child_hash(entry, parent, p) not in tried] if tried else combos
        if not fresh:
            skipped[entry.id] = "every parameter choice was already tried on this parent"
            continue
        found.append(Applicable(entry, entry.options(parent), fresh))
    return found, skipped


def triaged(found: list[Applicable], skipped: dict[str, str], evidence: Evidence) -> tuple[list[Applicable], dict[str, str]]:
    """Under a blocking alert (``Evidence.triage``), only the fired entries that move a knob it names;
    all of them, said in the log, when none of those is left to try on this parent."""
    moved = sorted({a.entry.move.knob for a in found if a.entry.move is not None})
    named = evidence.triage(moved)
    if named is None:
        return found, skipped
    keep = [a for a in found if a.entry.move is not None and a.entry.move.knob in named
            and moves_as_asked(a.entry.move, evidence.triage_direction())]
    if not keep:
        log.info("library: a blocking alert fired, but no untried entry moves a knob it names; every fired "
                 "entry is offered")
        return found, skipped
    left = {a.entry.id: "a blocking alert fired: only the changes it names are offered" for a in found if a not in keep}
    return keep, skipped | left


def moves_as_asked(move, direction: str | None) -> bool:
    """Whether a knob move goes the way a blocking alert asks (any of its factors, or its step)."""
    if direction is None or move.to is not None:
        return True
    if move.factors:
        return any(f > 1 for f in move.factors) if direction == "up" else any(f < 1 for f in move.factors)
    return move.direction == direction


def _child_hash(entry: LibraryEntry, parent: HarnessProgram, params: dict[str, Any]) -> str | None:
    try:
        return entry.apply(parent, params).hash
    except (OperatorError, GenomeError):   # a child that cannot be built is reported when it is proposed
        return None


def tried_hashes(parent: HarnessProgram, evidence: Evidence) -> set[str]:
    """Children already made from this parent: known genomes, and history records of this parent
    that name their child's hash."""
    out = set(evidence.known_hashes)
    for h in evidence.history:
        if h.get("child_hash") and parent.hash in (h.get("parent_hashes") or [h.get("parent_hash")]):
            out.add(h["child_hash"])
    return out


class LibraryOperator:
    """Proposes library entries whose triggers fire on the parent's health report (no LLM).

    ``weights`` (entry id -> weight, default each entry's own) set how often a fired entry is drawn;
    the loop may change them as entries succeed or fail. ``prior`` (entry id -> multiplier, from
    ``entry_prior.prior_weights``: what the entry did when screened on this domain) scales them and
    is never learned over. A child already known, or already proposed by this operator on the same
    parent, is never proposed again.
    """

    name = "library"

    def __init__(self, seed: int = 0, weights: dict[str, float] | None = None,
                 entries: Sequence[LibraryEntry] | None = None, prior: dict[str, float] | None = None) -> None:
        self.rng = random.Random(seed)
        self.entries = list(entries) if entries is not None else default_entries()
        ids = [e.id for e in self.entries]
        if len(set(ids)) != len(ids):
            raise ValueError(f"library entry ids must be unique: {sorted(i for i in ids if ids.count(i) > 1)}")
        self.weights = {e.id: e.weight for e in self.entries}
        self.set_weights(weights or {})
        # Entries a prior names that this library lacks (a user's own entry list) are left out of it.
        self.prior = {e: w for e, w in (prior or {}).items() if e in self.weights}
        self._proposed: set[tuple[str, str]] = set()   # (parent hash, child hash) proposed so far

    def set_weights(self, weights: dict[str, float]) -> None:
        unknown = sorted(set(weights) - set(self.weights))
        if unknown:
            raise KeyError(f"unknown library entries {', '.join(unknown)}; known: {', '.join(self.weights)}")
        if any(w < 0 for w in weights.values()):
            raise ValueError(f"library entry weights must be >= 0: {weights}")
        self.weights.update(weights)

    def tried(self, parent: HarnessProgram, evidence: Evidence) -> set[str]:
        """Children of ``parent`` not to propose again: known, in the history, or proposed here."""
        return tried_hashes(parent, evidence) | {c for p, c in self._proposed if p == parent.hash}

    def draw_weights(self, evidence: Evidence) -> dict[str, float]:
        """Each entry's weight in this proposal's draw: its own (learned in the run), times 1 + the
        confirmations of the skills that name it and fire on this report (this run's and earlier
        runs', summed), so a change a gate confirmed before is tried sooner where it applies again; a skill
        never confirmed (a seeded library entry) adds nothing. An entry that moves a knob the report's
        alerts name weighs ``Evidence.named_weight`` times more, as in the knobs operator's draw; and
        every weight is scaled by the prior's multiplier (1 for an entry it never screened)."""
        confirmed = confirmed_entries(evidence)
        knob = {e.id: e.move.knob for e in self.entries if e.move is not None}
        return {e: w * (1 + confirmed.get(e, 0)) * (evidence.named_weight(knob[e]) if e in knob else 1.0)
                * self.prior.get(e, 1.0) for e, w in self.weights.items()}

    def remember(self, parent: HarnessProgram, child_hash: str) -> None:
        self._proposed.add((parent.hash, child_hash))

    diagnose = True   # entries are offered when their trigger fires on the parent's health report

    def fired(self, parent: HarnessProgram, evidence: Evidence) -> tuple[list[Applicable], dict[str, str]]:
        """The entries that fire with an untried child, before triage."""
        entries = [e for e in self.entries if self.weights.get(e.id, 0.0) > 0]
        return applicable_entries(parent, evidence, entries, self.tried(parent, evidence), self.diagnose)

    def applicable(self, parent: HarnessProgram, evidence: Evidence) -> tuple[list[Applicable], dict[str, str]]:
        found, skipped = self.fired(parent, evidence)
        return triaged(found, skipped, evidence) if self.diagnose else (found, skipped)

    def propose(self, parents: list, evidence: Evidence) -> Intervention:
        if not parents:
            raise OperatorError("the library operator needs a parent", "input")
        parent = parents[0]
        if self.diagnose and not evidence.has_report() and not evidence.skills:
            # Every trigger reads the report: with none, "no trigger holds" would describe a report never read.
            raise OperatorError("the evidence holds no health report (no metrics or alerts) to diagnose: give "
                                "the parent's health report (a version's health.json), or use random_library, "
                                "which draws entries without one", "input")
        try:
            every, fired_skipped = self.fired(parent, evidence)
        except GenomeError as err:   # a parent whose KNOBS or hooks cannot be read offers nothing to edit
            raise OperatorError(f"cannot read the parent: {err}", "input") from err
        found, skipped = triaged(every, fired_skipped, evidence) if self.diagnose else (every, fired_skipped)
        held_back = [a for a in every if a not in found]   # what triage left out, tried if the rest fails
        if not found:
            fired = {k: v for k, v in skipped.items() if v != "trigger does not fire"}
            detail = "; ".join(f"{k}: {v}" for k, v in fired.items()) or "no trigger holds on the report's metrics"
            raise OperatorError(f"no library entry {'fires on this health report ' if self.diagnose else ''}with "
                                f"an untried child ({detail})", "input")
        left_out = {k: v for k, v in skipped.items() if v == SINGLE_TURN_ONLY}
        if left_out:   # fired, but not for this parent's rollouts: said, not silently dropped
            log.info("library: left out %s on %s: %s", ", ".join(left_out), getattr(parent, "hash", "?")[:8],
                     SINGLE_TURN_ONLY)
        failures, kind, weights = [], "input", self.draw_weights(evidence)
        while found or held_back:
            if not found:   # every change a blocking alert names failed on this parent: the others, said
                log.info("library: every entry the blocking alert names failed on %s; the other fired entries are "
                         "offered", getattr(parent, "hash", "?")[:8])
                found, held_back = held_back, []
            pick = self.rng.choices(found, weights=[weights[a.entry.id] for a in found])[0]
            found.remove(pick)
            params = self._params(pick, evidence)
            try:
                iv = propose_entry(self.name, parent, pick.entry, params, evidence)
            except OperatorError as err:   # an entry that does not fit this parent: try another
                failures.append(f"{pick.entry.id}: {err.reason}")
                kind = err.kind
                continue
            self.remember(parent, iv.child_hash)
            return iv
        raise OperatorError("every fired library entry failed on this parent: " + "; ".join(failures), kind)


    def _params(self, pick: Applicable, evidence: Evidence) -> dict[str, Any]:
        """An untried combination at random; under a blocking alert, the largest move of a knob it names
        the way it asks first: at 2 steps a stuck adapter's learning rate raised 100x (1e-6 -> 1e-4)
        changed 4% of held-out answers, 1e-3 changed 79% (draw 50's histories)."""
        move, way = pick.entry.move, evidence.triage_direction()
        if self.diagnose and way is not None and move is not None and evidence.triage([move.knob]) and all(
                isinstance(c.get("value"), int | float) and not isinstance(c.get("value"), bool) for c in pick.combinations):
            return (max if way == "up" else min)(pick.combinations, key=lambda c: c["value"])
        return self.rng.choice(pick.combinations)


class RandomLibraryOperator(LibraryOperator):
    """The best-of-N baseline: library entries drawn uniformly at random, no diagnosis (triggers are
    not read, weights not learned). What evolution's diagnosis must beat to have earned its keep
    (OpenEvolve users found best-of-N without evolution nearly matched evolution, openevolve#100)."""

    name = "random_library"
    diagnose = False

    def __init__(self, seed: int = 0, entries: Sequence[LibraryEntry] | None = None, **_) -> None:
        super().__init__(seed=seed, entries=entries)   # no prior either: the baseline knows nothing
        self.weights = {e.id: 1.0 for e in self.entries}

    def set_weights(self, weights: dict[str, float]) -> None:   # uniform: nothing is learned
        return None

    def draw_weights(self, evidence: Evidence) -> dict[str, float]:   # nor read from skills
        return dict(self.weights)


def propose_entry(operator_name: str, parent: HarnessProgram, entry: LibraryEntry, params: dict[str, Any],
                  evidence: Evidence, extra_hypothesis: str = "", prompt_tokens: int = 0,
                  completion_tokens: int = 0, details: dict[str, Any] | None = None) -> Intervention:
    """``entry`` applied to ``parent`` with ``params``, through the acceptance rules."""
    child = entry.apply(parent, params)
    hypothesis = entry.hypothesis_text(parent, params) + (f" {extra_hypothesis}" if extra_hypothesis else "")
    knob = entry.move is not None   # with_knobs changed one validated literal: the factor is known
    iv = make_intervention(
        operator_name, [parent], child, evidence, hypothesis=hypothesis, expected_effect=entry.expected_effect,
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
        details={"entry": entry.id, "params": dict(params), "source": entry.source, **(details or {})},
        check_contract=not knob, factors=[entry.factor] if knob else None,
    )
    if iv.factors != [entry.factor]:   # the hypothesis is about the entry's factor; another change does not test it
        raise OperatorError(f"entry {entry.id} should change {entry.factor} but changes {', '.join(iv.factors)}",
                            "single_factor", prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
    return iv


# ---- the library as seed skills and as prompt text ---------------------------------------------------
def _change_text(entry: LibraryEntry) -> str:
    if entry.move is None:
        return entry.template
    m = entry.move
    how = (f"set to {m.to!r}" if m.to is not None else f"multiply by one of {', '.join(f'{f:g}' for f in m.factors)}"
           if m.factors else f"step {m.direction} to another of its choices")
    return f"knob {m.knob}: {how}, within its declared range or choices"


def seed_skills(entries: Sequence[LibraryEntry] | None = None) -> list[dict[str, Any]]:
    """The entries as skills (the fields of ``loop/knowledge/skills.py`` ``Skill``), for seeding a skill library:
    literature knowledge, so no evidence yet, not validated, and not tied to a domain. A skill's trigger
    is one set of conditions, so an entry with an ``or_trigger`` becomes two skills (``...-or``), and
    one with more triggers more (``...-or2``, ...)."""
    out = []
    for e in entries if entries is not None else default_entries():
        for i, trigger in enumerate(e.triggers or ((),)):
            out.append(_seed_skill(e, trigger, "" if i == 0 else "-or" if i == 1 else f"-or{i}"))
    return out


def _seed_skill(e: LibraryEntry, trigger: Sequence[dict[str, Any]], suffix: str) -> dict[str, Any]:
    return {"id": f"library-{e.id}{suffix}", "factor": e.factor, "trigger": [dict(c) for c in trigger],
            "intervention": {"factor": e.factor, "template": _change_text(e), "entry": e.id,
                             "params": {p.name: list(p.choices) for p in e.params}},
            "expected_outcome": e.expected_effect.to_dict(), "hypothesis": e.hypothesis,
            "evidence": [], "domains": [], "validated": False, "scope": "general", "source": e.source}


def _fmt_value(v: Any) -> str:
    """As the reply writes it: JSON (true, "reward"), floats short."""
    return f"{v:g}" if isinstance(v, float) else json.dumps(v)


def entry_text(entry: LibraryEntry, options: dict[str, list[Any]] | None = None, full: bool = True) -> str:
    """One line for an LLM prompt: id, what it does, its parameters; ``full`` adds the factor, the claim,
    the trigger and the source (a prompt of fired entries for a small model's context leaves them out)."""
    opts = options if options is not None else {p.name: list(p.choices) for p in entry.params}
    params = "; ".join(f"{k} in {{{', '.join(_fmt_value(v) for v in vs)}}}" for k, vs in opts.items()) or "none"
    line = f"- {entry.id}: {entry.summary}. params: {params}"
    if not full:
        return line
    when = " or ".join(" and ".join(f"{c['metric']} {c['op']} {c['value']:g}" for c in t) for t in entry.triggers)
    return f"{line}. factor: {entry.factor}. expect: {entry.expected_effect}. when: {when}. source: {entry.source}"


def entries_text(items: Sequence[LibraryEntry | Applicable], full: bool = True, max_chars: int = 4000) -> str:
    """The entries (or fired entries with their options on a parent) as prompt lines."""
    lines = [entry_text(i.entry, i.options, full) if isinstance(i, Applicable) else entry_text(i, full=full)
             for i in items]
    text = "\n".join(lines) or "none"
    return text if len(text) <= max_chars else text[: max_chars - 20] + "\n... [truncated]"
