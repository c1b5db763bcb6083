"""Selection with DEAP: which branch versions survive a generation and which become parents.

Objectives: maximise held-out score, minimise cost (generated tokens per training step). Validity
is a constraint, not an objective: an invalid version is never selected, whatever its score.
NSGA-II (the default) keeps the Pareto front first; tournament selection is an option. Elitism
always keeps the first valid versions in the elite's order (:func:`elite_key`: moving, above the
untrained model, the gate's evidence for the harness, then the score). With ``min_cells`` > 1 the choice then covers that
many harness-descriptor cells where the candidates hold them (``loop/stages/diversity.py``): the best of an
uncovered cell replaces the lowest-scoring pick of a cell another pick still holds, and ``say`` is
told each replacement.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Callable, Sequence

from deap import base, tools

from evotrainer.loop.stages.diversity import diversify
from evotrainer.operators.library_entries import STUCK_DEAD
from evotrainer.policy.imitation import imitation_mask
from evotrainer.records.numeric import is_dead, mean
from evotrainer.records.rollout import Rollout, group_rollouts
from evotrainer.records.version import BranchVersion, Status, VersionDir


TIE_SCALE = 1e-6   # below the smallest step of an accuracy over fewer than a million rollouts
SIGNAL_SCALE = TIE_SCALE * TIE_SCALE   # below the smallest step of a working-call share, likewise


def rank_score(metrics: dict) -> float:
    """What a version is ranked by: its selection-draw accuracy; on episodes, where a small policy may
    resolve nothing, ties are broken by the share of working calls the environment accepted on that
    draw (``selection_working_calls``, ``fitness/episodes.py``), scaled so it never outranks a
    resolution. The gate breaks the same tie the same way (``fitness/gates.py``).

    A tie in both is broken by the share of the version's own training groups that gave its update a
    gradient (``train_live_groups``, episodes only: :func:`groups_with_gradient`): at equal held-out
    behaviour, a version whose steps had a gradient can go on learning, while one whose every group
    was dead repeats itself under any continuation. Scaled below the working calls. Its guard is
    validity, as for the gate's tie-break: a reward that rises on form while progress does not makes
    the branch invalid (``episode_progress``), and an invalid version is never selected."""
    return ((metrics.get("selection_accuracy") or 0.0) + TIE_SCALE * (metrics.get("selection_working_calls") or 0.0)
            + SIGNAL_SCALE * (metrics.get("train_live_groups") or 0.0))


def reported_stuck(report: dict) -> bool:
    """Whether a health report (``health.json``) raised the engine's ``adapter_stuck`` alert."""
    return any(isinstance(a, dict) and a.get("name") == "adapter_stuck" for a in report.get("alerts") or [])


def groups_with_gradient(train: Sequence[Rollout], steps: Sequence[dict]) -> float | None:
    """The share of a version's training groups that gave its update a gradient (``train_live_groups``):
    a reward difference between members, or, at a step that imitated guided calls (``guided_imitation``:
    ``imitated_tokens`` in its step record), a member with accepted guided calls to imitate. Imitation
    trains a group whose members all earned the same reward; counted as dead, a guided child that
    learned every step tied a version that never moved. None without a scored group."""
    imitating = {m.get("step") for m in steps if not m.get("skipped") and (m.get("imitated_tokens") or 0) > 0}
    groups = [g.rollouts for g in group_rollouts(train) if all(r.reward is not None for r in g.rollouts)]
    if not groups:
        return None
    return mean([not is_dead([r.reward for r in g])
                 or (g[0].step in imitating and any(any(imitation_mask(r)) for r in g)) for g in groups])


def _judged(report: dict) -> bool:
    """Whether a report could tell a stuck adapter from a moving one: its groups had a gradient and its
    held-out answers were compared with the untrained model's (the engine's ``adapter_stuck`` rule)."""
    m = report.get("metrics") or {}
    dead, changed = m.get("dead_group_ratio"), m.get("heldout_changed_rate")
    return dead is not None and changed is not None and dead < STUCK_DEAD


def lineage_stuck(vid: str, vdir: Callable[[str], VersionDir],
                  meta_of: Callable[[str], BranchVersion | None]) -> bool:
    """Whether ``vid``'s harness last showed a stuck adapter on its lineage: its own report decides
    where it can judge (``adapter_stuck`` raised or not); a report that cannot (every group dead: no
    gradient, so no word on the step size) leaves it to the previous version of the same harness along
    the first parents, and so back. A changed harness (a child) starts unjudged: not stuck.

    Why: on draw 53's math-misfit-lr seed 0 the recipe (lr 1e-6) raised adapter_stuck at generation 0,
    and its continuations' groups were then all dead, so their reports raised nothing; the recipe's
    continuation counted as moving, tied a learning-rate child (1e-3) on both draws and, as the
    recipe's own harness, took the exploit phase from it. A step too small to move the adapter is
    still too small while no group has a gradient."""
    seen: set[str] = set()
    while vid not in seen:
        seen.add(vid)
        health = vdir(vid).path / "health.json"
        if not health.is_file():
            return False
        report = json.loads(health.read_text())
        if reported_stuck(report):
            return True
        if _judged(report):
            return False
        meta = meta_of(vid)
        parent = meta_of(meta.parents[0]) if meta is not None and meta.parents else None
        if parent is None or parent.genome_hash != meta.genome_hash:
            return False
        vid = parent.id
    return False


def harness_evidence(vid: str, meta_of: Callable[[str], BranchVersion | None]) -> int:
    """How far the gate vouches for a version's harness, read along its lineage back to the start:
    0 when every change of harness on the way was promoted by the gate (and there was one), 1 when
    there was none (the start's own harness: the recipe, continued), 2 when a change on the way only
    tied its control or lost to it (a tie kept as a branch of its own), or was promoted and then held
    back by a person (its status, not the gate's record, says which), or when a version on the way
    has no record to read (``meta_of`` gives None): what cannot be read is not vouched for.

    Why it ranks before the selection score: a 24-task selection draw ranks versions whose true
    difference is far below its noise, so an unpromoted change that drew high there took the exploit
    phase from the recipe's own lineage on three of the five seeds of draw 51's math-learns (a
    256-token cap, an overlong penalty), and each such lineage ended below the recipe. A change
    replaces the recipe when the gate's paired test says it is better, as the product promises, not on
    one draw's luck."""
    promoted_on_the_way, seen = False, set()
    while vid not in seen:
        seen.add(vid)
        meta = meta_of(vid)
        if meta is None:
            return 2
        if meta.operator is not None:                  # a child: its harness is its change
            if meta.status != Status.PROMOTED:
                return 2
            promoted_on_the_way = True
        if not meta.parents:
            return 0 if promoted_on_the_way else 1
        vid = meta.parents[0]                          # a continuation (or a revert's) carries its parent's
    return 2                                           # a cycle: no record can be trusted to vouch


class _Fitness(base.Fitness):
    weights = (1.0, -1.0)  # (held-out score ↑, cost ↓)


@dataclass
class Candidate:
    version_id: str
    score: float
    cost: float
    valid: bool = True
    cell: str | None = None    # its harness descriptor's cell (loop/stages/diversity.py); None: not described
    # Its report raised adapter_stuck: its groups had a gradient, yet its training changed almost no
    # held-out answer (or its report could not judge and its harness's last one on its lineage did:
    # lineage_stuck). It loses the elite's place to a version whose training moves (:func:`elite_key`):
    # a stuck lineage repeats itself under any continuation, as a dead one does (the misfit setting's
    # exploit went to the stuck control over a learning-rate child tied with it). As a parent it stays
    # welcome: triage gives its children the learning-rate change it needs.
    stuck: bool = False
    # What the gate says of its harness (:func:`harness_evidence`): the elite is a version of a
    # promoted harness, then of the recipe's own, then of a harness the gate did not promote.
    evidence: int = 1
    # Below the untrained model's bar (below_start: both held-out draws pooled by default): whatever the
    # gate said of its harness, it is no elite while a moving version above that bar stands (a stuck one
    # yields to it: elite_key), and never the final pick.
    below_start: bool = False

    def __post_init__(self) -> None:
        self.fitness = _Fitness((self.score, self.cost))


START_BARS = ("both_draws", "selection")


def below_start(metrics: dict, start: dict | None, bar: str = "both_draws") -> bool:
    """Whether a version's held-out record ranks it below the untrained model (``start``'s record):
    on both held-out draws pooled (``both_draws_accuracy``), or on the selection draw alone.

    Why both draws by default: the bar decides whether anything trained is picked at all, and one
    24-task draw decides it by a task or two. Draw 52's math-misfit-lr seed 0 fell back to the
    untrained model on a 0.167 selection draw against its 0.208, though its gate draw stood at 0.417
    against 0.292. A record from before both draws were pooled falls back to the selection draw,
    for the version and the start alike. A version not yet scored is not below."""
    if bar not in START_BARS:
        raise ValueError(f"start_bar {bar!r}: use one of {', '.join(START_BARS)}")
    if not start:
        return False
    key = ("both_draws_accuracy" if bar == "both_draws" and "both_draws_accuracy" in start
           and "both_draws_accuracy" in metrics else "selection_accuracy")
    return start.get(key) is not None and metrics.get(key) is not None and metrics[key] < start[key]


def elite_key(c: Candidate) -> tuple:
    """The elite's order: a lineage that moves before a stuck one, then a version at or above the
    untrained model before one below it, then the gate's evidence for its harness, then the selection
    score, the cost and the id.

    Why a stuck lineage comes last, below the untrained model's bar too: it repeats itself under any
    continuation (the misfit recipe's does), so the exploit budget spent on it can only end at the
    untrained score, while a moving lineage below the bar can still rise above it; and if it does not,
    the final pick, which keeps the bar first (``loop/stages/final_pick.py``),
    falls back to a version at the bar, which is where the stuck lineage would have ended. On draw
    54's math-misfit-lr seed 2 a learning-rate child one task below the bar on both draws lost the
    exploit phase to the stuck recipe, whose continuation then ended at the untrained score (seen
    after that run's test score: measured again on draw 55)."""
    return (c.stuck, c.below_start, c.evidence, -c.score, c.cost, c.version_id)


def survivors(cands: Sequence[Candidate], k: int, method: str = "nsga2", elitism: int = 1,
              tournament_size: int = 2, seed: int = 0, min_cells: int = 1,
              say: Callable[[str], None] | None = None) -> list[str]:
    """The ids of at most ``k`` valid versions that live on, covering ``min_cells`` descriptor cells
    where the candidates hold them (the elite stays; ``say`` hears every change diversity made)."""
    valid = [c for c in cands if c.valid]
    if len(valid) <= k:
        return [c.version_id for c in valid]
    elite = sorted(valid, key=elite_key)[:min(elitism, k)]
    picked = elite + _fill(valid, elite, k, method, tournament_size, seed)
    return [c.version_id for c in diversify(picked, valid, min_cells, len(elite), "survivors", say)]


def _fill(valid: list[Candidate], elite: list[Candidate], k: int, method: str, tournament_size: int,
          seed: int) -> list[Candidate]:
    """The ``k - len(elite)`` survivors after the elite, by NSGA-II or tournament."""
    rest = [c for c in valid if c not in elite]
    if method == "nsga2":
        chosen = tools.selNSGA2(rest, k - len(elite))
    else:
        rng_state = random.getstate()
        random.seed(seed)
        try:
            chosen = _unique_tournament(rest, k - len(elite), tournament_size)
        finally:
            random.setstate(rng_state)
    return list(chosen)


def parents(cands: Sequence[Candidate], k: int, tournament_size: int = 2, seed: int = 0, min_cells: int = 1,
            say: Callable[[str], None] | None = None) -> list[str]:
    """``k`` parent ids (with repetition) by tournament on Pareto rank, then score; with ``min_cells``
    > 1 the draws then cover that many descriptor cells where the candidates hold them."""
    valid = [c for c in cands if c.valid]
    if not valid or k <= 0:
        return []
    fronts = tools.sortNondominated(valid, len(valid))
    rank = {c.version_id: i for i, front in enumerate(fronts) for c in front}
    rng = random.Random(seed)
    out = []
    for _ in range(k):
        pool = [rng.choice(valid) for _ in range(tournament_size)]
        out.append(min(pool, key=lambda c: (rank[c.version_id], -c.score, c.version_id)))
    return [c.version_id for c in diversify(out, valid, min_cells, 1, "parents", say)]


def _unique_tournament(cands: list[Candidate], k: int, size: int) -> list[Candidate]:
    pool, out = list(cands), []
    while pool and len(out) < k:
        winner = tools.selTournament(pool, 1, tournsize=min(size, len(pool)))[0]
        out.append(winner)
        pool.remove(winner)
    return out
