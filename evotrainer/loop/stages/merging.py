"""Merge children: two survivors' LoRA adapters merged into one (peft's ``add_weighted_adapter``, in
``policy/adapter_merge.py``), under a crossover of their harnesses, gated like any child.

The child's parents are ``[a, b]``: it trains ``steps_per_generation`` steps from the merged adapter and
is paired against ``a``'s continuation (its control sibling) by the ordinary gate. Its harness is
``a``'s with one factor of ``b``'s (a promoted factor of ``b``'s lineage that ``a``'s lacks first),
or ``a``'s unchanged when the two harnesses do not differ; the intervention lists both what the
harness took and ``adapter:merge``, since the gate can only judge them together.

A crossover that gives ``b``'s own harness is allowed here (an ordinary crossover child would
duplicate ``b``): with the merged adapter it is a policy no branch has trained.

The merged adapter is written to ``<child>/start_adapter/`` (what the child starts from, kept beside
the adapter training replaces) and copied to ``<child>/adapter/``. It is a pure function of the two
parents' adapters, which never change once gated, and the settings in the intervention (DARE's
draws are seeded), so :func:`start_adapter` rebuilds it when a crash came between the child's
creation and the merge.

Off by default (``evolution.merge: null``): no run has measured that a merged child beats its control,
and each merge takes one of ``children_per_generation``'s slots from the operators.
"""

from __future__ import annotations

import dataclasses
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from evotrainer.config import MergeConfig
from evotrainer.genome.edits import crossover, factors_changed
from evotrainer.genome.errors import GenomeError
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.stages import proposals   # (a module, not its names: proposals may call into this one)
from evotrainer.loop.stages.selection import rank_score
from evotrainer.operators import OperatorError
from evotrainer.operators.acceptance import make_intervention
from evotrainer.operators.intervention import FITNESS_METRIC, ExpectedEffect, Intervention
from evotrainer.policy.adapter_merge import AdapterMergeError, check_compatible, check_settings, merge_adapters
from evotrainer.records import history
from evotrainer.records.history import Outcome, ProposalRecord
from evotrainer.records.version import BranchVersion, VersionDir

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment

OPERATOR = "merge"
ADAPTER_FACTOR = "adapter:merge"
START_ADAPTER = "start_adapter"


def merge_due(exp: Experiment, generation: int) -> bool:
    """Merging is on (``evolution.merge``), the run evolves harnesses, and ``generation`` is a merge one."""
    ev = exp.cfg.evolution
    return ev.merge is not None and ev.mode == "evolve" and generation % ev.merge.every == 0


def merge_pair(exp: Experiment, survivors: list[str]) -> tuple[str, str] | None:
    """The best-ranked pair of valid survivors with trained adapters on the run's base model that was
    not merged before, the better one first (its continuation is the control)."""
    def usable(vid: str) -> bool:
        meta = exp.vdir(vid).meta()
        return (not meta.is_invalid and meta.base_model == exp.cfg.model
                and (exp.vdir(vid).adapter_dir / "adapter_config.json").is_file())

    ranked = sorted((v for v in dict.fromkeys(survivors) if usable(v)),
                    key=lambda v: -rank_score(exp.vdir(v).meta().metrics))
    done = {tuple(h.merge) for h in history.proposals(exp.state.history) if h.merge}
    return next(((a, b) for i, a in enumerate(ranked) for b in ranked[i + 1:] if (a, b) not in done), None)


def propose_merge_child(exp: Experiment, survivors: list[str], generation: int) -> bool:
    """The propose stage's call: a merge child of the best unmerged pair of survivors when merging is
    due; whether one was accepted. Why none was is logged."""
    if not merge_due(exp, generation):
        return False
    pair = merge_pair(exp, survivors)
    if pair is None:
        exp.say(f"gen {generation}: no merge child: fewer than two valid survivors with adapters not merged before")
        return False
    return propose_merge(exp, *pair, generation) is not None


def propose_merge(exp: Experiment, a: str, b: str, generation: int) -> str | None:
    """A pending child of ``a`` and ``b``: the crossover harness, backtested and admitted like any child
    (``proposals.admit``), then its start adapter merged from both parents' adapters. Returns its id,
    or None with the reason in the history and the log."""
    settings = exp.cfg.evolution.merge or MergeConfig()
    record = ProposalRecord(generation, a, exp.vdir(a).meta().genome_hash, merge=[a, b],
                            combination=settings.combination)
    try:
        check_settings(settings.combination, settings.weights, settings.density)
        check_compatible(exp.vdir(a).adapter_dir, exp.vdir(b).adapter_dir)
        iv = merge_intervention(exp, a, b, generation, settings)
    except (AdapterMergeError, OperatorError) as e:
        reason = e.reason if isinstance(e, OperatorError) else str(e)
        exp.state.history.append(dataclasses.replace(record, outcome=Outcome.MERGE_REFUSED, reason=reason[:300]))
        exp.say(f"gen {generation}: no merge child of {a} and {b}: {reason[:200]}")
        exp.save()
        return None
    cases = exp.labels.cases() if exp.cfg.evolution.backtest else []
    cid = proposals.admit(exp.proposal_inputs(), iv, a, [b], record, generation, cases)
    if cid is not None:   # the pending child's adapter folder holds what it will train from
        _replace_adapter(exp.vdir(cid), start_adapter(exp, exp.vdir(cid).meta()))
        exp.say(f"gen {generation}: {cid} starts from the {settings.combination} merge of {a}'s and {b}'s adapters "
                f"(weights {settings.weights[0]:g}/{settings.weights[1]:g})")
    return cid


def merge_intervention(exp: Experiment, a: str, b: str, generation: int, settings: MergeConfig) -> Intervention:
    """The merge child's intervention: ``a``'s harness with one factor of ``b``'s (or none when they do
    not differ), the merge settings in its details."""
    pa, pb = (HarnessProgram(exp.vdir(v).genome_source(), name=f"{v}/genome.py") for v in (a, b))
    # b's own harness is no duplicate here (the adapter makes the child new): only a's known genomes count
    evidence = dataclasses.replace(proposals.evidence_for(exp, a), known_hashes=set())
    details = {"merge": {"parents": [a, b], "combination": settings.combination, "weights": list(settings.weights),
                         "density": settings.density, "seed": merge_seed(exp, generation)}}
    expected = ExpectedEffect(FITNESS_METRIC, "delta>", 0.0)
    reasons = []
    for factor in _factor_order(exp, a, b, pa, pb, generation):
        try:
            iv = make_intervention(
                OPERATOR, [pa], crossover(pa, pb, factor), evidence, expected_effect=expected,
                hypothesis=f"If {a} starts from its adapter merged with {b}'s ({settings.combination}) and takes "
                           f"{factor} from {b}'s harness, held-out score rises, because each parent learned "
                           "something under its own harness that the other lacks.",
                details={**details, "took": factor, "from": pb.hash})
        except (GenomeError, OperatorError) as e:
            reasons.append(f"{factor}: {getattr(e, 'reason', e)}")
            continue
        iv.parent_hashes = [pa.hash, pb.hash]
        iv.factors = [*iv.factors, ADAPTER_FACTOR]
        return iv
    if reasons:
        raise OperatorError("no factor of the second parent's harness gives a valid child: " + "; ".join(reasons),
                            "edit")
    # Same harness: the child differs from its control in the adapter alone.
    return Intervention(
        operator=OPERATOR, parent_hashes=[pa.hash, pb.hash], child_source=pa.source, child_hash=pa.hash, diff="",
        factor=ADAPTER_FACTOR, factors=[ADAPTER_FACTOR], expected_effect=expected, evidence=evidence.summary(),
        hypothesis=f"If {a} starts from its adapter merged with {b}'s ({settings.combination}), held-out score "
                   "rises, because the two branches learned different things under the same harness.",
        details=details)


def _factor_order(exp: Experiment, a: str, b: str, pa: HarnessProgram, pb: HarnessProgram,
                  generation: int) -> list[str]:
    """The factors where the harnesses differ: b's promoted ones that a lacks first, the rest seeded."""
    try:
        factors = factors_changed(pa, pb)
    except GenomeError as e:
        raise OperatorError(f"cannot compare the parents' harnesses: {e}", "input") from e
    promoted = set(proposals.promoted_factors(exp, b)) - set(proposals.promoted_factors(exp, a))
    shuffled = random.Random(merge_seed(exp, generation)).sample(factors, len(factors))
    return sorted(shuffled, key=lambda f: f not in promoted)


def merge_seed(exp: Experiment, generation: int) -> int:
    return exp.cfg.seed * 7919 + generation


def start_adapter(exp: Experiment, meta: BranchVersion) -> Path | None:
    """What a merge child trains from: ``<child>/start_adapter/``, merged now if it is not there yet;
    None for any other version, which starts from its first parent's adapter."""
    merge = ((meta.intervention or {}).get("details") or {}).get("merge")
    if meta.operator != OPERATOR or not merge:
        return None
    vd = exp.vdir(meta.id)
    out = vd.path / START_ADAPTER
    if not (out / "adapter_config.json").is_file():
        a, b = merge["parents"]
        with exp.budgets.timed("adapter"):
            merge_adapters(exp.runtime.policy, exp.vdir(a).adapter_dir, exp.vdir(b).adapter_dir, out,
                           combination=merge["combination"], weights=merge["weights"], density=merge["density"],
                           seed=merge["seed"])
    return out


def _replace_adapter(vd: VersionDir, src: Path) -> None:
    """The pending child's adapter folder becomes a copy of ``src`` (without the first parent's optimizer
    state that ``new_version`` copied: its moments fit another adapter)."""
    tmp = vd.path / "adapter.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    shutil.rmtree(vd.adapter_dir, ignore_errors=True)
    tmp.rename(vd.adapter_dir)
