"""Genealogy and fitness plots of a whole run, drawn from its version directories alone.

``genealogy_plot(run_dir)`` draws the branch DAG (x = generation, y = lanes), nodes coloured by held-out
score, an edge from every parent (the second parent of a crossover dashed), promoted versions ringed in
gold and invalid ones outlined in red with a red X, whatever their score. It writes ``genealogy.png`` and
``genealogy.html``: the same figure as inline SVG plus a table of every version, with no external
resource, so the file opens offline and can be attached anywhere. ``fitness_plot`` draws best and mean
held-out score of the valid versions per generation.

Matplotlib's object API with the Agg canvas is used rather than pyplot: no global figure state, safe
in a headless loop that draws after every generation.
"""

from __future__ import annotations

import html
import io
import os
import tempfile
from pathlib import Path

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from evotrainer.records.version import BranchVersion, Status, write_atomic

CMAP = "viridis"


def load_versions(run_dir: str | Path) -> list[BranchVersion]:
    """Every version of a run, parents before children (generation, then creation time)."""
    versions = [BranchVersion.load(p.parent) for p in Path(run_dir, "versions").glob("*/meta.json")]
    return sorted(versions, key=lambda v: (v.generation, v.created, v.id))




def layout(versions: list[BranchVersion]) -> dict[str, tuple[int, int]]:
    """(generation, lane) per version: a child keeps its first parent's lane when free, so a branch
    reads as a horizontal line; otherwise it takes the nearest free lane of its generation."""
    pos: dict[str, tuple[int, int]] = {}
    taken: dict[int, set[int]] = {}
    for v in versions:
        used = taken.setdefault(v.generation, set())
        parent = next((pos[p] for p in v.parents if p in pos), None)
        want = parent[1] if parent else 0
        lane = next(c for d in range(len(versions) + 1) for c in (want + d, want - d) if c >= 0 and c not in used)
        used.add(lane)
        pos[v.id] = (v.generation, lane)
    return pos


def _score_norm(scores: list[float]) -> Normalize:
    lo, hi = (min(scores), max(scores)) if scores else (0.0, 1.0)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.05, hi + 0.05
    return Normalize(lo, hi)


def genealogy_figure(versions: list[BranchVersion], title: str = "") -> Figure:
    pos = layout(versions)
    gens = max((x for x, _ in pos.values()), default=0) + 1
    lanes = max((y for _, y in pos.values()), default=0) + 1
    fig = Figure(figsize=(min(4 + 1.8 * gens, 30), min(2.5 + 0.8 * lanes, 30)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps[CMAP]
    norm = _score_norm([s for v in versions if (s := v.heldout_accuracy) is not None])
    for v in versions:                      # edges first, so nodes are drawn over them
        for i, p in enumerate(v.parents):
            if p in pos:
                ax.annotate("", xy=pos[v.id], xytext=pos[p], zorder=1, arrowprops={
                    "arrowstyle": "->", "color": "0.45", "lw": 1.2, "shrinkA": 9, "shrinkB": 9,
                    "linestyle": "-" if i == 0 else "--", "connectionstyle": "arc3,rad=0.08" if i else "arc3"})
    for v in versions:
        x, y = pos[v.id]
        s = v.heldout_accuracy
        color = cmap(norm(s)) if s is not None else "lightgrey"
        bad = v.is_invalid
        if v.status == Status.PROMOTED and not bad:
            ax.scatter([x], [y], s=520, facecolors="none", edgecolors="gold", linewidths=3, zorder=2)
        ax.scatter([x], [y], s=260, color=color, edgecolors="red" if bad else "black",
                   linewidths=2.5 if bad else 0.8, zorder=3)
        if bad:
            ax.scatter([x], [y], s=150, marker="x", color="red", linewidths=2.5, zorder=4)
        label = v.id + (f"\n{s:.3f}" if s is not None else "") + ("\nINVALID" if bad else "")
        ax.annotate(label, (x, y), xytext=(0, -15), textcoords="offset points", ha="center", va="top",
                    fontsize=7, color="red" if bad else "black", zorder=5)
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="held-out score", shrink=0.8)
    fig.legend(handles=[
        Line2D([], [], marker="o", ls="", mfc="none", mec="gold", mew=3, ms=12, label="promoted"),
        Line2D([], [], marker="X", ls="", color="red", ms=9, label="invalid (never promoted)"),
        Line2D([], [], color="0.45", ls="--", label="crossover: second parent"),
    ], loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    ax.set_xticks(range(gens))
    ax.set_xlim(-0.5, gens - 0.5)
    ax.set_ylim(lanes - 0.4, -0.8)          # lane 0 on top; room for the labels under the last lane
    ax.set_yticks([])
    ax.set_xlabel("generation")
    ax.set_title(title or "genealogy")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    return fig


def fitness_figure(versions: list[BranchVersion], title: str = "") -> Figure:
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    valid: dict[int, list[float]] = {}
    for v in versions:
        if (s := v.heldout_accuracy) is not None and not v.is_invalid:
            valid.setdefault(v.generation, []).append(s)
    bad = [(v.generation, s) for v in versions if (s := v.heldout_accuracy) is not None and v.is_invalid]
    gens = sorted(valid)
    if gens:
        ax.plot(gens, [max(valid[g]) for g in gens], "o-", color="tab:green", label="best valid")
        ax.plot(gens, [sum(valid[g]) / len(valid[g]) for g in gens], "s--", color="tab:blue", label="mean valid")
        pts = [(g, s) for g in gens for s in valid[g]]
        ax.scatter(*zip(*pts), s=12, color="0.6", label="valid versions", zorder=1)
    if bad:
        ax.scatter(*zip(*bad), marker="x", color="red", label="invalid (excluded)", zorder=3)
    if not gens and not bad:
        ax.text(0.5, 0.5, "no held-out scores yet", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(fontsize=8)
    ax.set_xlabel("generation")
    ax.set_ylabel("held-out score")
    ax.set_title(title or "fitness per generation")
    ax.xaxis.get_major_locator().set_params(integer=True)
    return fig


def save_png(fig: Figure, path: Path) -> None:
    """Write a PNG atomically (temp file + rename): ``lineage --plot`` and a live run's own plotting may
    draw into the same RUN_DIR/plots, and a reader (the MLflow upload, a browser) must never see half a
    file; the last writer wins whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".png")
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=110)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)                # a picture to open and share, unlike mkstemp's private mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    # Text stays text (searchable, selectable); a fixed salt keeps the file stable between redraws.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "evotrainer"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def genealogy_html(versions: list[BranchVersion], title: str, figures: list[Figure]) -> str:
    e = html.escape
    rows = []
    for v in versions:
        bad = v.is_invalid
        why = "; ".join(str(x.get("message") or x.get("name") or x) for x in v.violations) or v.status
        verdict = f"&#10007; INVALID: {e(why)}" if bad else e(v.status)
        rows.append(f'<tr class="{"invalid" if bad else v.status}"><td>{e(v.id)}</td><td>{v.generation}</td>'
                    f"<td>{e(', '.join(v.parents) or '—')}</td><td>{e(v.operator or 'seed')}</td>"
                    f"<td>{e(v.factor or '—')}</td><td>{_fmt(v.heldout_accuracy)}</td><td>{verdict}</td></tr>")
    scored = [(v.heldout_accuracy, v.id) for v in versions if v.heldout_accuracy is not None and not v.is_invalid]
    best = max(scored) if scored else None
    summary = (f"{len(versions)} versions, {sum(v.is_invalid for v in versions)} invalid"
               + (f", best valid {best[1]} ({best[0]:.3f})" if best else ""))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{e(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
svg {{ max-width: 100%; height: auto; }}
table {{ border-collapse: collapse; margin-top: 1em; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; font-size: 90%; }}
tr.invalid td {{ color: #b00; background: #fee; font-weight: bold; }}
tr.promoted td {{ background: #fff7d6; }}
</style></head><body>
<h1>{e(title)}</h1>
<p>{e(summary)}</p>
{"".join(f"<figure>{_svg(f)}</figure>" for f in figures)}
<table><tr><th>version</th><th>generation</th><th>parents</th><th>operator</th><th>factor</th>
<th>held-out</th><th>status</th></tr>
{chr(10).join(rows)}
</table></body></html>
"""


def genealogy_plot(run_dir: str | Path, out_dir: str | Path | None = None) -> tuple[Path, Path]:
    """Write genealogy.png and genealogy.html for a run; returns their paths."""
    run_dir = Path(run_dir)
    out = Path(out_dir) if out_dir else run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    versions = load_versions(run_dir)
    title = f"genealogy: {run_dir.resolve().name}"
    fig = genealogy_figure(versions, title)
    png, page = out / "genealogy.png", out / "genealogy.html"
    save_png(fig, png)
    write_atomic(page, genealogy_html(versions, title, [fig, fitness_figure(versions)]))
    page.chmod(0o644)                       # a page to open and share, unlike the private temp file mode
    return png, page


def fitness_plot(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the best/mean held-out score per generation as a PNG; returns its path."""
    run_dir = Path(run_dir)
    path = Path(out) if out else run_dir / "plots" / "fitness.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_png(fitness_figure(load_versions(run_dir), f"fitness: {run_dir.resolve().name}"), path)
    return path
