"""The knob operator: Optuna ask/tell over the genome's declared KNOBS, one knob per child.

Each proposal picks one knob and asks the study for a value of that knob only, so every child
differs from its parent in exactly one factor. With independent (univariate) TPE this is a sound
model: each knob's sampler learns from the trials that suggested that knob. ``tell(child_hash,
fitness)`` reports how a child did (higher is better), so later proposals move toward good values.
The study lives in memory, or in an Optuna storage URL (e.g. ``sqlite:///knobs.db``) so that it
survives restarts: a trial records its child's hash as a user attribute.
"""

from __future__ import annotations

import hashlib
import logging
import random
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from evotrainer.genome.edits import acts_only_in_a_step
from evotrainer.operators.acceptance import make_intervention
from evotrainer.operators.base import OperatorError
from evotrainer.operators.evidence import Evidence
from evotrainer.operators.intervention import FITNESS_METRIC, ExpectedEffect, Intervention
from evotrainer.records.outcome import GateOutcome
from evotrainer.records.version import Status

optuna.logging.set_verbosity(logging.WARNING)
log = logging.getLogger(__name__)


def knob_distribution(spec: dict[str, Any]) -> BaseDistribution:
    """The Optuna distribution of one knob spec (``range`` [+ ``log``] or ``choices``)."""
    if "choices" in spec:
        return CategoricalDistribution(list(spec["choices"]))
    lo, hi = spec["range"]
    log = bool(spec.get("log", False))
    if all(isinstance(x, int) and not isinstance(x, bool) for x in (lo, hi, spec["value"])):
        return IntDistribution(lo, hi, log=log)
    return FloatDistribution(float(lo), float(hi), log=log)


def make_sampler(name: str, seed: int | None, n_startup_trials: int) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        # multivariate=False: trials hold one knob each, so a joint model has nothing to learn from.
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials, multivariate=False)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown knob sampler {name!r}; use 'tpe' or 'random'")


def suggest(trial: optuna.Trial, name: str, dist: BaseDistribution) -> Any:
    """The trial's value for one knob, through Optuna's public suggest API."""
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, dist.choices)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, log=dist.log)
    value = trial.suggest_float(name, dist.low, dist.high, log=dist.log)
    # 6 significant digits keep genomes readable and are finer than any effect we could measure.
    return min(max(float(f"{value:.6g}"), dist.low), dist.high)


def inert_knobs(values: dict[str, Any]) -> set[str]:
    """Knobs that cannot change training under the other settings' values. With one optimisation
    pass per batch (``num_iterations`` 1, the default) training is on-policy: the importance ratio is
    1 at every token, so the PPO clip (``epsilon``, ``epsilon_high``) and the two-sided clip
    (``delta``) never bind, and a child changing one of them repeats its control's training exactly.
    ``guided_edit`` shapes guided edits and ``guided_imitation`` imitates guided calls: with no episode
    guided, they change nothing."""
    inert = set()
    if (values.get("num_iterations") or 1) == 1:
        inert |= {"epsilon", "epsilon_high", "delta"}
    if not guides(values):
        inert |= {"guided_edit", "guided_imitation"}
    return inert


def guides(values: dict[str, Any]) -> bool:
    """Whether some training episodes are decoded under the call grammar."""
    return bool(values.get("guided_call_share") or values.get("guided_plan_share"))


def imitates(values: dict[str, Any]) -> bool:
    """Whether steps imitate guided calls: a step with no advantage still trains then."""
    return bool(values.get("guided_imitation")) and guides(values)


def all_dead(evidence: Evidence) -> bool:
    """Whether every group of the parent's steps was dead (the engine's ``dead_group_ratio`` 1)."""
    return ((evidence.health_report or {}).get("engine") or {}).get("dead_group_ratio") == 1.0


def skipped_every_step(evidence: Evidence, values: dict[str, Any]) -> bool:
    """Whether the parent's health report says no step of it trained: every group dead (the engine's
    ``dead_group_ratio`` 1), no KL term (``beta`` 0) and no guided call imitated (``guided_imitation``
    0 or nothing guided), so each step had no gradient and was skipped. Then a knob that acts only
    inside a step cannot make a child that trains differently from its control."""
    return all_dead(evidence) and not values.get("beta") and not imitates(values)


def kl_has_nothing_to_pull(evidence: Evidence, values: dict[str, Any]) -> bool:
    """Whether a KL term (``beta``) would train nothing: no step of the parent's lineage ever moved its
    adapter (``evidence.adapter_trained`` False), so it equals the base model and the KL term and its
    gradient are 0; every group was dead, so no advantage moves it; and nothing is imitated."""
    return evidence.adapter_trained is False and all_dead(evidence) and not imitates(values)


def raising_rungs(spec: dict[str, Any], rungs: int = 3) -> list[Any]:
    """The values a blocking alert that asks to raise a range knob is offered, largest first: the top of
    the knob's declared range and the half-decades below it (log range), or the top, half and quarter of
    the way up (linear), above the current value only. An adapter that training does not move needs a
    step orders of magnitude larger, and the range is the harness author's bound of a sane one; TPE's
    log-uniform startup draws raised TRL's 1e-6 to 4.4e-5 and 1.4e-4 on the misfit suite setting, and
    that lineage stayed stuck (0-4% of held-out answers changed per generation). Empty for a choices
    knob or one already at its top."""
    if "range" not in spec:
        return []
    lo, hi = spec["range"]
    value = spec["value"]
    integer = all(isinstance(x, int) and not isinstance(x, bool) for x in (lo, hi, value))
    if spec.get("log") and lo > 0:
        raw = [hi / 10 ** (k / 2) for k in range(rungs)]
    else:
        raw = [value + (hi - value) * f for f in (1.0, 0.5, 0.25)[:rungs]]
    out: list[Any] = []
    for v in raw:
        v = int(round(v)) if integer else min(max(float(f"{v:.6g}"), lo), hi)
        if v > value and v not in out:
            out.append(v)
    return out


class KnobOperator:
    name = "knobs"

    def __init__(self, seed: int = 0, sampler: str = "tpe", storage: str | None = None,
                 study_name: str = "evotrainer-knobs", n_startup_trials: int = 8,
                 knobs: list[str] | None = None, max_attempts: int = 8,
                 fixed: dict[str, Any] | None = None) -> None:
        self.rng = random.Random(seed)
        self.only = list(knobs) if knobs else None     # restrict tuning to these knobs
        self.fixed = dict(fixed or {})   # recipe settings that are not knobs (the run's grpo config)
        self.max_attempts = max_attempts
        self.n_startup_trials = n_startup_trials
        self.study = optuna.create_study(
            storage=storage, study_name=study_name if storage else None, direction="maximize",
            sampler=make_sampler(sampler, seed, n_startup_trials), load_if_exists=True,
        )
        # child hash -> trial number; rebuilt from the storage so a reloaded study can be told.
        self._trials: dict[str, int] = {
            t.user_attrs["child_hash"]: t.number for t in self.study.get_trials(deepcopy=False)
            if "child_hash" in t.user_attrs
        }

    # ---- choosing the knob ---------------------------------------------------------------
    def _candidates(self, parent, evidence: Evidence) -> list[str]:
        knobs, values = parent.knobs, {**self.fixed, **parent.knob_values}
        inert = inert_knobs(values)
        if skipped_every_step(evidence, values):
            step_only = {n for n in knobs if acts_only_in_a_step(parent, n)}
            if step_only - inert:
                log.info("knobs: every group of %s was dead and no KL term steps, so no step trained; left out "
                         "the knobs that act only inside a step: %s", parent.short_hash, ", ".join(sorted(step_only)))
            inert |= step_only
        if kl_has_nothing_to_pull(evidence, values) and "beta" in knobs and "beta" not in inert:
            log.info("knobs: no step of %s's lineage moved its adapter and every group was dead: a KL term to the "
                     "base model has nothing to pull on; left out beta", parent.short_hash)
            inert.add("beta")
        names = [n for n in knobs if (self.only is None or n in self.only) and n not in inert]
        # A knob whose range or choices admit one value cannot make a child.
        return [n for n in names if "choices" in knobs[n] and len(knobs[n]["choices"]) > 1
                or "range" in knobs[n] and knobs[n]["range"][0] != knobs[n]["range"][1]]

    def _choose_knob(self, names: list[str], evidence: Evidence) -> str:
        """Knobs that the health report's alerts name are likelier to be chosen (``Evidence.named_weight``:
        3 times, 9 for a critical alert): the diagnosis points at them."""
        return self.rng.choices(names, weights=[evidence.named_weight(n) for n in names])[0]

    def _param_name(self, knob: str, dist: BaseDistribution) -> str:
        """The knob's name in the study; a knob whose distribution changed (an evolved range) gets
        a new name, since Optuna refuses one parameter with two incompatible distributions."""
        for t in self.study.get_trials(deepcopy=False):
            old = t.distributions.get(knob)
            if old is not None and old != dist:
                digest = hashlib.sha1(repr(dist).encode()).hexdigest()[:8]
                return f"{knob}@{digest}"
        return knob

    # ---- proposing -----------------------------------------------------------------------
    def propose(self, parents: list, evidence: Evidence) -> Intervention:
        if not parents:
            raise OperatorError("the knob operator needs a parent", "input")
        parent = parents[0]
        try:
            knobs = parent.knobs
        except Exception as err:  # a broken parent declares nothing we can tune
            raise OperatorError(f"cannot read the parent's KNOBS: {err}", "input") from err
        names = self._candidates(parent, evidence)
        if not names:
            raise OperatorError("the parent declares no tunable knob" + (f" among {self.only}" if self.only else ""),
                                "input")
        named = evidence.triage(names)   # a blocking alert fired: the knobs it names first
        if named:
            log.info("knobs: a blocking alert fired on %s's report; only %s offered", parent.short_hash, ", ".join(named))
            try:
                return self._propose_from(parent, knobs, named, evidence)
            except OperatorError as err:
                log.info("knobs: no new child from the knob(s) the blocking alert names (%s); every knob offered",
                         err.reason)
        elif named is not None:
            log.info("knobs: a blocking alert fired on %s's report but names no tunable knob; every knob offered",
                     parent.short_hash)
        return self._propose_from(parent, knobs, names, evidence)

    def _propose_from(self, parent, knobs: dict, names: list[str], evidence: Evidence) -> Intervention:
        last: OperatorError | None = None
        raising = set(evidence.triage(names) or ()) if evidence.triage_direction() == "up" else set()
        # The rungs first, each through an enqueued trial (TPE still learns from it), skipping those whose
        # child exists or this study proposed (a sibling of this generation); with none left, TPE draws.
        tried = evidence.known_hashes | set(self._trials)
        ladder = [(k, v) for k in names if k in raising for v in raising_rungs(knobs[k])
                  if parent.with_knobs(**{k: v}).hash not in tried]
        attempts = self.max_attempts + len(ladder)
        for _ in range(attempts):
            rung = None
            if ladder:
                knob, rung = ladder.pop(0)
                dist = knob_distribution(knobs[knob])
                self.study.enqueue_trial({self._param_name(knob, dist): rung}, skip_if_exists=False)
            else:
                knob = self._choose_knob(names, evidence)
                dist = knob_distribution(knobs[knob])
            spec = knobs[knob]
            trial = self.study.ask()
            value = suggest(trial, self._param_name(knob, dist), dist)
            if knob in raising and isinstance(value, int | float) and not isinstance(value, bool) and value <= spec["value"]:
                self.study.tell(trial, state=TrialState.FAIL)   # the blocking alert asks to raise it
                last = OperatorError(f"knob {knob}={value!r} does not raise it, as the blocking alert asks", "input")
                continue
            try:
                child = parent.with_knobs(**{knob: value})
                intervention = make_intervention(
                    self.name, [parent], child, evidence,
                    hypothesis=self._hypothesis(knob, spec["value"], value, rung is not None),
                    expected_effect=ExpectedEffect(FITNESS_METRIC, "delta>", 0.0),
                    details={"knob": knob, "old": spec["value"], "new": value, "trial": trial.number},
                    check_contract=False, factors=[f"knob:{knob}"],   # with_knobs changed one validated literal
                )
            except OperatorError as err:
                # A repeat of a known genome (or an unchanged value): this trial tells us nothing.
                self.study.tell(trial, state=TrialState.FAIL)
                last = err
                continue
            except Exception as err:  # noqa: BLE001 - e.g. with_knobs rejecting a value
                self.study.tell(trial, state=TrialState.FAIL)
                last = OperatorError(f"knob {knob}={value!r}: {err}", "contract")
                continue
            trial.set_user_attr("child_hash", intervention.child_hash)
            trial.set_user_attr("parent_hash", parent.hash)
            self._trials[intervention.child_hash] = trial.number
            return intervention
        assert last is not None
        raise OperatorError(f"no new child after {attempts} attempts; last: {last.reason}", last.kind)

    def _hypothesis(self, knob: str, old: Any, new: Any, rung: bool = False) -> str:
        told = len(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
        why = ("training did not move the adapter (the blocking alert), and this is the largest untried step "
               "of the knob's declared range" if rung
               else f"TPE's model of {told} scored children favours this value" if told >= self.n_startup_trials
               else "it is an untried value of the knob's range (exploration before the model has data)")
        return f"If {knob} changes from {old!r} to {new!r}, held-out score rises, because {why}."

    def observe(self, outcome: GateOutcome) -> None:
        """TPE learns from the paired delta against the control, not raw scores; an invalid child is a
        failed trial."""
        self.tell(outcome.genome_hash, None if outcome.status == Status.INVALID else outcome.paired_delta)

    def tell(self, child_hash: str, fitness: float | None) -> None:
        """Reports a child's fitness (higher is better); ``None`` marks it failed (e.g. it crashed)."""
        if child_hash not in self._trials:
            raise KeyError(f"no knob trial proposed child {child_hash[:12]}")
        number = self._trials[child_hash]
        if fitness is None:
            self.study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
        else:
            self.study.tell(number, float(fitness), skip_if_finished=True)

    def pending(self) -> list[str]:
        """Children proposed but not yet told."""
        running = {t.number for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        return [h for h, n in self._trials.items() if n in running]
