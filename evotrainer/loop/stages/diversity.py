"""Quality-diversity over harness descriptors: what a version's harness changed from the run's seed,
and a MAP-Elites rule that keeps the best version of more than one descriptor cell alive.

A *descriptor* places a harness on a few categorical axes, each read from the genome against the
seed (``factors_changed``): the training hooks (``reward``, ``filter`` = ``keep_groups``,
``advantages``, ``curriculum`` = ``select_tasks``, ``prompt``), each ``seed`` or a short id of the
hook's code with its helpers, and ``knobs``, the groups of knobs whose values differ (optimiser,
sampling, loss, other). A *cell* is the descriptor on the configured axes, e.g. ``filter:3fa2b1`` or
``knobs:optimiser+sampling``; ``seed`` when nothing on them differs. Diagnostic hooks (metrics,
alerts, validity) are no axis: they change what is measured, not how the policy trains, so a
version that differs only there trains like its parent and is no new harness.

The rule (``cover_cells``): selection picks as it always did; when its picks cover fewer cells than
wanted and the pool holds others, the best of an uncovered cell replaces the lowest-scoring pick of a
cell that another pick still holds. The best-scoring version is never replaced (its cell keeps it).
Every replacement is said in the run's log; docs/concepts/diversity.md argues the choice.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from evotrainer.config import DIVERSITY_AXES
from evotrainer.genome.edits import hook_fingerprint, factors_changed
from evotrainer.genome.errors import GenomeError
from evotrainer.genome.program import HarnessProgram

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment

SEED_CELL = "seed"
# Axis -> the hook it reads; "knobs" reads the KNOBS values.
HOOK_AXES = {"reward": "reward", "filter": "keep_groups", "advantages": "advantages",
             "curriculum": "select_tasks", "prompt": "prompt"}
# Knob name -> its group on the knobs axis (a knob not named here is "other": a harness's own knob).
KNOB_GROUPS = {
    **dict.fromkeys(("learning_rate", "weight_decay", "max_grad_norm", "num_iterations",
                     "per_device_train_batch_size"), "optimiser"),
    **dict.fromkeys(("num_generations", "temperature", "top_p", "max_completion_length"), "sampling"),
    **dict.fromkeys(("epsilon", "epsilon_high", "delta", "beta", "use_bias_correction_kl", "loss_type",
                     "scale_rewards", "mask_truncated_completions"), "loss"),
}
METRIC_PREFIX = "descriptor_"   # meta.metrics keys: descriptor_cell, descriptor_<axis>


@dataclass(frozen=True)
class Descriptor:
    """Axis -> variant (``seed`` where the harness is as the seed's) for every axis."""

    axes: dict[str, str]

    def cell(self, axes: Sequence[str] = DIVERSITY_AXES) -> str:
        parts = [f"{a}:{self.axes[a]}" for a in axes if self.axes.get(a, SEED_CELL) != SEED_CELL]
        return " ".join(parts) or SEED_CELL

    def metrics(self, axes: Sequence[str] = DIVERSITY_AXES) -> dict[str, float]:
        """Numeric ids for meta.metrics (MLflow takes numbers): 0 = as the seed, equal ids = equal
        variants; ``descriptor_cell`` identifies the cell on the configured axes."""
        out = {f"{METRIC_PREFIX}{a}": float(_id(v)) for a, v in self.axes.items()}
        out[f"{METRIC_PREFIX}cell"] = float(_id(self.cell(axes)))
        return out


def describe(seed: HarnessProgram, program: HarnessProgram) -> Descriptor:
    """``program``'s descriptor against the run's ``seed`` harness (GenomeError if either is broken)."""
    changed = set(factors_changed(seed, program))
    axes = {}
    for axis, hook in HOOK_AXES.items():
        if f"hook:{hook}" in changed:
            code = hook_fingerprint(program, hook) or "absent"   # absent: falls back to the reference hook
            axes[axis] = hashlib.sha256(code.encode()).hexdigest()[:6]
        else:
            axes[axis] = SEED_CELL
    groups = sorted({KNOB_GROUPS.get(f.partition(":")[2], "other") for f in changed if f.startswith("knob:")})
    axes["knobs"] = "+".join(groups) or SEED_CELL
    return Descriptor(axes)


def _id(variant: str) -> int:
    # 24 bits: exact in a float (MLflow stores doubles), and two variants of one run never collide in practice.
    return 0 if variant == SEED_CELL else int(hashlib.sha256(variant.encode()).hexdigest()[:6], 16) or 1


# ---- the run's versions ---------------------------------------------------------------------------
def version_cell(exp: Experiment, vid: str) -> str | None:
    """The cell of ``vid`` on the configured axes, its descriptor recorded in its meta.metrics (so it
    reaches MLflow with the version's record); None, said in the log, when it cannot be described."""
    vd = exp.vdir(vid)
    try:
        seed = HarnessProgram(exp.vdir(seed_version(exp)).genome_source(), name="seed/genome.py")
        d = describe(seed, HarnessProgram(vd.genome_source(), name=f"{vid}/genome.py"))
    except (GenomeError, OSError) as e:
        exp.say(f"{vid}: no harness descriptor ({e}); diversity leaves it out of every cell")
        return None
    axes = exp.cfg.evolution.diversity.axes
    meta = vd.meta()
    wanted = d.metrics(axes)
    if not exp.readonly and any(meta.metrics.get(k) != x for k, x in wanted.items()):
        meta.metrics.update(wanted)
        vd.save_meta(meta)
    return d.cell(axes)


def seed_version(exp: Experiment) -> str:
    """The run's first version: the seed harness every descriptor is read against."""
    versions = exp.versions()
    if not versions:
        raise OSError("the run holds no version yet")
    return versions[0]


# ---- covering cells ------------------------------------------------------------------------------
class Celled(Protocol):
    version_id: str
    score: float
    cost: float
    cell: str | None


def _quality(c: Celled) -> tuple:
    return (-c.score, c.cost, c.version_id)


def cover_cells(picks: Sequence[Celled], pool: Sequence[Celled], min_cells: int,
                protected: int = 1) -> tuple[list[Celled], list[tuple[Celled, Celled]]]:
    """``picks`` changed as little as possible to cover ``min_cells`` cells (or as many as ``pool``
    holds): the best of the best uncovered cell replaces the lowest-quality pick whose cell another
    pick still holds. The first ``protected`` picks (the elite) are never replaced. Returns the new
    picks and the (added, replaced) pairs, in order; picks may repeat (parents), survivors do not."""
    out = list(picks)
    swaps: list[tuple[Celled, Celled]] = []
    best_of: dict[str, Celled] = {}
    for c in sorted(pool, key=_quality):
        if c.cell is not None:
            best_of.setdefault(c.cell, c)
    want = min(min_cells, len(out), len(best_of))
    while len({c.cell for c in out if c.cell is not None}) < want:
        covered = {c.cell for c in out}
        counts = {cell: sum(1 for c in out if c.cell == cell) for cell in covered}
        # Replaceable: past the elite, and its cell stays covered (or it has none).
        spare = [i for i, c in enumerate(out) if i >= protected and (c.cell is None or counts[c.cell] > 1)]
        newcomer = next((c for cell, c in best_of.items() if cell not in covered), None)
        if not spare or newcomer is None:
            break
        i = max(spare, key=lambda j: (_quality(out[j]), j))
        swaps.append((newcomer, out[i]))
        out[i] = newcomer
    return out, swaps


def diversify(picks: Sequence[Celled], pool: Sequence[Celled], min_cells: int, protected: int, what: str,
              say: Callable[[str], None] | None) -> list[Celled]:
    """``cover_cells``, and one line in the log whenever it changed the choice or could not act."""
    if min_cells <= 1:
        return list(picks)
    out, swaps = cover_cells(picks, pool, min_cells, protected)
    before, after = _cells(picks), _cells(out)
    available = len({c.cell for c in pool if c.cell is not None})
    if say is not None and swaps:
        said = "; ".join(f"{a.version_id} ({a.cell}, score {a.score:.3f}) in place of {r.version_id} "
                         f"({r.cell}, score {r.score:.3f})" for a, r in swaps)
        say(f"diversity: {what} {said}: {after} cell(s) instead of {before}")
    elif say is not None and after < min(min_cells, len(out), available):
        say(f"diversity: {what} cover {after} cell(s) of the {available} the candidates hold, below "
            f"min_cells {min_cells}: the {protected} elite pick(s) fill the places (lower elitism to make room)")
    return out


def _cells(cands: Sequence[Celled]) -> int:
    return len({c.cell for c in cands if c.cell is not None})
