"""Which interventions each domain kept: proposals, promotions, validated skills and the final pick's
lineage, counted per domain over several runs, from their records alone.

One intervention is named by its library entry (``dapo_overlong_shaping``) or, for a change no entry
made (an LLM's own edit, a knob the Optuna sampler moved), by its factor family: the hook it changed
(``reward``, ``keep_groups``, ``advantages``, ``select_tasks``, ``prompt``, ...) or ``knob:<name>``.
A crossover child that took a factor from another branch is named after the version on that branch
whose intervention introduced the factor, so a compounded promotion counts for the entry that made it.

Per run, every intervention the history records (``state.json``: one entry per proposal, its outcome
updated by the gate; revert records and operator failures name no intervention and are left out) and
every child version (``versions/<vid>/meta.json``) is counted as

* **proposed**: an operator produced it (the backtest may still have rejected it);
* **children**: it passed the backtest and became a child version that trained;
* **promoted**: a gate promoted that child (its decision says so even after selection pruned it);
* **confirmed**: the child is evidence of a *validated* skill in the run's ``skills.json``
  (``loop/knowledge/skills.py``: a promoted child whose hypothesis held, confirmed ``validate_after`` times);
* **retained**: the child is on the final pick's lineage (``state.final``, its first parents back to the
  seed, as ``loop/stages/final_pick.py`` picked it) and no later version on that lineage changed the same
  factor again: the change is in the harness the run reports.

A run without a final pick (still running, stopped before its finish) retains nothing and says so;
a run whose pick is the untrained model retains nothing because training made the policy worse.
Nothing here writes into a run directory.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from evotrainer.records.run_dir import RunDirError, kind_of, require
from evotrainer.records.history import Outcome, ProposalRecord, proposals
from evotrainer.records.run_state import load_state
from evotrainer.records.version import BranchVersion, read_json
from evotrainer.tracking.plots import CMAP, save_png

START = "start"   # state.final's version when the untrained model is the pick (loop/stages/start.py)
GROUPINGS = ("intervention", "factor")


def family(factor: str | None) -> str:
    """``hook:reward`` -> ``reward``; ``knob:<name>`` stays; an unnamed factor is ``unknown``."""
    if not factor:
        return "unknown"
    return factor.split(":", 1)[1] if factor.startswith("hook:") else factor


@dataclass
class Proposal:
    """One intervention proposed in one run and what became of it."""
    name: str                    # library entry, else factor family
    factor: str                  # factor family
    operator: str | None
    outcome: str | None          # the history's outcome, else the child's status
    child: str | None = None
    promoted: bool = False
    confirmed: bool = False
    retained: bool = False


@dataclass
class RunStrategies:
    """What one run proposed and kept."""
    path: str
    name: str
    domain: str
    final: str | None            # the final pick's version id, START, or None without a pick
    lineage: list[str] = field(default_factory=list)   # the final pick back to its seed
    proposals: list[Proposal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)      # what could not be counted, and why

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StrategyRow:
    """One intervention in one domain, summed over that domain's runs."""
    domain: str
    intervention: str
    factor: str
    runs: int = 0                # runs of the domain that proposed it
    proposed: int = 0
    children: int = 0
    promoted: int = 0
    confirmed: int = 0
    retained: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _versions(run: Path) -> dict[str, BranchVersion]:
    found = {}
    for meta in sorted((run / "versions").glob("*/meta.json")):
        v = BranchVersion.load(meta.parent)
        found[v.id] = v
    return found


def _validated_confirmations(run: Path) -> set[str]:
    """Version ids that are evidence of a validated skill in the run's own library (which only this run
    writes into, so its evidence names this run's versions whatever path the run had then)."""
    path = run / "skills.json"
    if not path.is_file():
        return set()
    data = read_json(path, "the run's skill library")
    skills = data.get("skills", [])
    if not isinstance(skills, list) or not all(isinstance(s, dict) for s in skills):
        raise RunDirError(f"{path}: 'skills' must be a list of skill records; restore the file "
                          "(evotrainer skills --run shows what it holds)")
    return {str(e["version"]) for s in skills if s.get("validated") is True
            for e in s.get("evidence") or [] if isinstance(e, dict) and e.get("version")}


def _lineage(final: str | None, versions: dict[str, BranchVersion]) -> list[str]:
    """The final pick and its first parents back to the seed (a crossover's second parent gave one factor,
    which the crossover child itself records)."""
    out, vid = [], final
    while vid in versions and vid not in out:
        out.append(vid)
        parents = versions[vid].parents
        vid = parents[0] if parents else None
    return out


def _name(v: BranchVersion, versions: dict[str, BranchVersion], seen: frozenset = frozenset()) -> str:
    """The entry that made ``v``'s change; for a crossover child, that of the version on the other
    parent's lineage that introduced the factor; else the factor family."""
    entry = ((v.intervention or {}).get("details") or {}).get("entry")
    if entry:
        return str(entry)
    if v.operator == "crossover" and len(v.parents) > 1 and v.id not in seen:
        for src in _lineage(v.parents[1], versions):
            s = versions[src]
            if s.operator is not None and s.factor == v.factor:
                return _name(s, versions, seen | {v.id})
    return family(v.factor)


def read_run(run_dir: str | Path) -> RunStrategies:
    """One run's proposals and what became of them; refuses a directory that is not a run."""
    run = require(run_dir, "run")
    state = load_state(run)
    config = read_json(run / "config.json", "the run's configuration") if (run / "config.json").is_file() else None
    domain = ((config or {}).get("domain") or {}).get("name")
    if not isinstance(domain, str) or not domain:
        raise RunDirError(f"{run}/config.json names no domain (domain.name); the run's configuration is lost "
                          "or damaged: restore it")
    versions = _versions(run)
    confirmed = _validated_confirmations(run)
    final = (state.final or {}).get("version")
    result = RunStrategies(path=str(run.resolve()), name=run.resolve().name, domain=domain, final=final)
    if final is None:
        result.notes.append("no final pick (the run has not finished): nothing counted as retained")
    elif final != START and final not in versions:
        result.notes.append(f"the final pick {final} has no version directory: nothing counted as retained")
    result.lineage = _lineage(final, versions) if final != START else []
    # On the lineage, the latest change to each factor is the one the final harness has.
    latest: dict[str, str] = {}
    for vid in result.lineage:                   # final pick first, so the first seen is the latest
        v = versions[vid]
        if v.operator is not None:
            latest.setdefault(v.factor or vid, vid)
    retained = set(latest.values())

    children: dict[str, ProposalRecord] = {}
    for h in proposals(state.history):   # (operator_rejected ones name no change that was made)
        if h.outcome == Outcome.OPERATOR_REJECTED or not (h.factor or h.entry):
            continue
        if h.child:
            children[h.child] = h
        result.proposals.append(Proposal(name=h.entry or family(h.factor), factor=family(h.factor),
                                         operator=h.operator, outcome=str(h.outcome), child=h.child))
    for vid, v in versions.items():          # a child the history lost (a crash before the state save)
        if v.operator is not None and vid not in children:
            result.notes.append(f"{vid} is a child the history does not list; counted from its meta.json")
            result.proposals.append(Proposal(name=family(v.factor), factor=family(v.factor), operator=v.operator,
                                             outcome=v.status, child=vid))
    for p in result.proposals:
        v = versions.get(p.child) if p.child else None
        if p.child and v is None:
            result.notes.append(f"{p.child} is in the history but has no version directory; counted as proposed only")
        if v is None:
            continue
        p.name, p.factor = _name(v, versions), family(v.factor)
        p.promoted = (p.outcome == "promoted" or v.status == "promoted"
                      or ((v.decision or {}).get("promote") is True and (v.decision or {}).get("valid") is not False))
        p.confirmed = p.child in confirmed
        p.retained = p.child in retained
    return result


def read_runs(run_dirs: Iterable[str | Path]) -> list[RunStrategies]:
    """Every run, in the order given; the same run twice is refused (it would count twice)."""
    runs, seen = [], {}
    for d in run_dirs:
        r = read_run(d)
        if r.path in seen:
            raise RunDirError(f"{d} is the same run as {seen[r.path]}: give each run once")
        seen[r.path] = d
        runs.append(r)
    if not runs:
        raise RunDirError("no run directory given: name one or more directories written by `evotrainer run`")
    return runs


def tabulate(runs: list[RunStrategies], by: str = "intervention") -> list[StrategyRow]:
    """Rows per (domain, intervention), or per (domain, factor family) with ``by="factor"``: domains in
    the order first seen, then the most retained, promoted, proposed first."""
    if by not in GROUPINGS:
        raise ValueError(f"by must be one of {', '.join(GROUPINGS)}, got {by!r}")
    rows: dict[tuple[str, str], StrategyRow] = {}
    proposing: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in runs:
        for p in r.proposals:
            key = (r.domain, p.name if by == "intervention" else p.factor)
            row = rows.setdefault(key, StrategyRow(domain=r.domain, intervention=key[1], factor=p.factor))
            proposing[key].add(r.path)
            row.proposed += 1
            row.children += p.child is not None
            row.promoted += p.promoted
            row.confirmed += p.confirmed
            row.retained += p.retained
    for key, row in rows.items():
        row.runs = len(proposing[key])
    order = {d: i for i, d in enumerate(dict.fromkeys(r.domain for r in runs))}
    return sorted(rows.values(), key=lambda x: (order[x.domain], -x.retained, -x.promoted, -x.confirmed,
                                                -x.proposed, x.intervention))


def strategy_table(run_dirs: Iterable[str | Path], by: str = "intervention") -> list[StrategyRow]:
    """The per-domain counts of several runs (see the module docstring for what each count means)."""
    return tabulate(read_runs(run_dirs), by)


def domain_runs(runs: list[RunStrategies]) -> dict[str, tuple[int, int]]:
    """Per domain: (runs, runs with a final pick)."""
    out: dict[str, list[int]] = {}
    for r in runs:
        n = out.setdefault(r.domain, [0, 0])
        n[0] += 1
        n[1] += r.final is not None
    return {d: (a, b) for d, (a, b) in out.items()}


def strategies_figure(rows: list[StrategyRow], runs: list[RunStrategies]) -> Figure:
    """Two heatmaps, interventions × domains: promoted of proposed, and retained in the final picks.
    A cell of an intervention never proposed in that domain is grey with a dash: not tried is not
    the same as tried and dropped."""
    domains = list(domain_runs(runs))
    names = sorted({r.intervention for r in rows},
                   key=lambda n: (-sum(r.retained for r in rows if r.intervention == n),
                                  -sum(r.promoted for r in rows if r.intervention == n), n))
    cell = {(r.intervention, r.domain): r for r in rows}
    fig = Figure(figsize=(3.2 + 2.4 * len(domains), 1.6 + 0.38 * max(len(names), 1)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True)
    counts = domain_runs(runs)
    cmap = matplotlib.colormaps[CMAP].with_extremes(bad="0.88")   # a copy: the registered map is not touched
    for ax, what, title in ((axes[0], "promoted", "promoted / proposed"),
                            (axes[1], "retained", "retained in the final pick")):
        values = [[getattr(cell[(n, d)], what) if (n, d) in cell else float("nan") for d in domains] for n in names]
        top = max([x for row in values for x in row if x == x] + [1])
        image = ax.imshow(values or [[float("nan")]], cmap=cmap, vmin=0, vmax=top, aspect="auto")
        for i, n in enumerate(names):
            for j, d in enumerate(domains):
                r = cell.get((n, d))
                text = "—" if r is None else f"{r.promoted}/{r.proposed}" if what == "promoted" else str(r.retained)
                dark = r is not None and getattr(r, what) < 0.6 * top
                ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if dark else "black")
        ticks = [f"{d}\n{counts[d][0]} run(s)" if what == "promoted" else f"{d}\n{counts[d][1]} final pick(s)"
                 for d in domains]
        ax.set_xticks(range(len(domains)), ticks, fontsize=8)
        ax.set_title(title, fontsize=10)
        bar = fig.colorbar(image, ax=ax, shrink=0.8, label=what)
        bar.ax.yaxis.set_major_locator(MaxNLocator(integer=True))   # counts
    axes[0].set_yticks(range(len(names)), names, fontsize=8)
    if not names:
        axes[0].text(0, 0, "no intervention was proposed", ha="center", va="center")
    fig.suptitle("interventions across domains", fontsize=11)
    return fig


def strategies_plot(runs: list[RunStrategies], out: str | Path, by: str = "intervention") -> Path:
    """Writes the heatmaps as a PNG at ``out`` (atomically); refuses a path inside one of the runs."""
    out = Path(out)
    refuse_inside_runs(out, runs)
    save_png(strategies_figure(tabulate(runs, by), runs), out)
    return out


def refuse_inside_runs(out: Path, runs: list[RunStrategies]) -> None:
    """Only `evotrainer run` writes into a run directory, the ones read here or any other: a report
    goes somewhere else."""
    where = out.resolve()
    given = {Path(r.path) for r in runs}
    for up in [where, *where.parents]:
        if up in given or kind_of(up) == "run":
            raise RunDirError(f"{out} lies inside the run directory {up}, which only `evotrainer run` writes: "
                              "write the report outside the run directories")
