"""Writes the shipped library-entry prior (``evotrainer/operators/entry_prior.json``) from the committed
headroom screens: per domain, each single entry's paired per-seed deltas against the fixed recipe.

    python benchmarks/entry_prior.py                          # the shipped prior, printed with its weights
    python benchmarks/entry_prior.py --leave-out math --out /tmp/prior_no_math.json   # transfer: built without math

Only single entries count (``a+b`` combinations are not a library entry's evidence) and only screens
with a reference on the same seed. The screens scored domain seed 0's test splits, so a run that reads
this prior is judged on another draw (the suite's). SWE screens are left out: no variant resolved an
issue, so their deltas are all 0 and say nothing about which change helps.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evotrainer.operators.entry_prior import SHIPPED, deltas_for, weight  # noqa: E402
from evotrainer.operators.library import default_entries  # noqa: E402

SCREENS = {"math": "benchmarks/results/headroom_math.json", "code": "benchmarks/results/headroom_code.json"}


def paired_deltas(data: dict) -> dict[str, list[float]]:
    """Entry id -> its test accuracy minus the reference's, one per seed both ran."""
    known = {e.id for e in default_entries()}
    ref = {r["seed"]: r["test_accuracy"] for r in data["runs"] if r["variant"] == "reference"}
    out: dict[str, list[float]] = {}
    for r in sorted(data["runs"], key=lambda r: (r["variant"], r["seed"])):
        if r["variant"] in known and r["seed"] in ref:
            out.setdefault(r["variant"], []).append(round(r["test_accuracy"] - ref[r["seed"]], 6))
    return out


def build(leave_out: str | None = None) -> dict:
    domains = {d: paired_deltas(json.loads((ROOT / f).read_text())) for d, f in SCREENS.items() if d != leave_out}
    return {"generated_by": "benchmarks/entry_prior.py" + (f" --leave-out {leave_out}" if leave_out else ""),
            "sources": {d: f for d, f in SCREENS.items() if d in domains},
            "note": "per-seed paired deltas (entry alone minus the recipe, test accuracy on domain seed 0's split)",
            "domains": domains}


def draw_precision(weights: dict[str, float], deltas: dict[str, list[float]]) -> float:
    """The chance that a draw over the screened entries (by ``weights``, 1 where absent) picks one whose
    screened mean delta is above 0: the library's precision on that domain's screens."""
    total = sum(weights.get(e, 1.0) for e in deltas)
    return sum(weights.get(e, 1.0) for e, v in deltas.items() if sum(v) / len(v) > 0) / total


def precision_table() -> list[str]:
    """Per screened domain: the draw precision of a uniform draw, of the prior built from every screen
    (in-sample: it has seen these deltas) and of the prior built without this domain (transfer)."""
    shipped = build()
    lines = ["| domain | entries screened (helped) | uniform | prior, in-sample | prior, this domain left out |",
             "|---|---|---|---|---|"]
    for domain, deltas in shipped["domains"].items():
        helped = sum(sum(v) / len(v) > 0 for v in deltas.values())
        inside = {e: weight(v) for e, v in deltas_for(shipped, domain).items()}
        out = {e: weight(v) for e, v in deltas_for(build(leave_out=domain), domain).items()}
        lines.append(f"| {domain} | {len(deltas)} ({helped}) | {draw_precision({}, deltas):.0%} | "
                     f"{draw_precision(inside, deltas):.0%} | {draw_precision(out, deltas):.0%} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--leave-out", default=None, help="build without this domain's screens (a transfer test)")
    ap.add_argument("--out", default=str(SHIPPED))
    args = ap.parse_args()
    prior = build(args.leave_out)
    Path(args.out).write_text(json.dumps(prior, indent=1, sort_keys=True) + "\n")
    for domain in [*prior["domains"], "swe"]:
        weights = {e: weight(v) for e, v in deltas_for(prior, domain).items()}
        print(f"{domain}{'' if domain in prior['domains'] else ' (pooled: not screened)'}: " + ", ".join(
            f"{e} {w:.2f}" for e, w in sorted(weights.items(), key=lambda kv: -kv[1])))
    print(f"wrote {args.out}")
    print("\n".join(precision_table()))


if __name__ == "__main__":
    main()
