"""``evotrainer strategies``: which interventions each domain proposed, promoted, confirmed and kept.

    evotrainer strategies RUN_DIR [RUN_DIR ...] [--by intervention|factor] [--plot OUT.png] [--json OUT.json]

It reads the runs' records only (``tracking/strategies.py`` says what each count means) and writes
nothing into them: ``--plot`` and ``--json`` go where they are told, outside every run given.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

console = Console(highlight=False)
# Short headers keep the table in 80 columns; LEGEND under it says what each counts.
HEADERS = ("runs", "prop", "child", "prom", "conf", "ret")
LEGEND = ("runs: runs of the domain that proposed it · prop: proposed · child: passed the backtest and trained · "
          "prom: promoted by a gate · conf: evidence of a validated skill · ret: in the final pick's harness")


def strategies_table(rows) -> Table:
    """One row per (domain, intervention); fits an 80-column terminal like the leaderboard: no borders
    between columns, the factor family under an entry's name, and only the name folds."""
    table = Table(title="interventions across domains", box=None, padding=(0, 1), pad_edge=False,
                  header_style="bold underline")
    table.add_column("domain", no_wrap=True)
    table.add_column("intervention", overflow="fold", min_width=16)
    for col in HEADERS:
        table.add_column(col, justify="right", no_wrap=True)
    last = None
    for r in rows:
        if last is not None and r.domain != last:
            table.add_section()
        name = r.intervention + (f" [dim]({r.factor})[/dim]" if r.factor != r.intervention else "")
        table.add_row(r.domain if r.domain != last else "", name, str(r.runs), str(r.proposed), str(r.children),
                      str(r.promoted), str(r.confirmed), str(r.retained), style="green" if r.retained else None)
        last = r.domain
    return table


def cmd_strategies(args: argparse.Namespace) -> int:
    from evotrainer.records.version import write_atomic
    from evotrainer.tracking.strategies import (domain_runs, read_runs, refuse_inside_runs, strategies_plot,
                                                tabulate)

    runs = read_runs(args.run_dirs)
    for out in (args.plot, args.json):        # refused before anything is written
        if out:
            refuse_inside_runs(Path(out), runs)
    rows = tabulate(runs, args.by)
    if rows:
        console.print(strategies_table(rows))
        console.print(f"[dim]{LEGEND}[/dim]")
    else:
        console.print("no intervention was proposed in these runs")
    for domain, (n, picked) in domain_runs(runs).items():
        console.print(f"{domain}: {n} run(s), {picked} with a final pick")
    for r in runs:
        pick = {None: "no final pick", "start": "final pick: the untrained model"}.get(r.final, f"final pick {r.final}")
        console.print(f"[dim]{r.name}[/dim] ({r.domain}): {len(r.proposals)} proposal(s), {pick}")
        for note in r.notes:
            console.print(f"  [yellow]{note}[/yellow]")
    if args.json:
        data = {"by": args.by, "rows": [r.to_dict() for r in rows], "runs": [r.to_dict() for r in runs]}
        write_atomic(Path(args.json), json.dumps(data, indent=2))
        console.print(f"json: {args.json}")
    if args.plot:
        console.print(f"plot: {strategies_plot(runs, args.plot, args.by)}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("strategies", help="which interventions each domain proposed, promoted and kept, over runs")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories written by `evotrainer run`")
    p.add_argument("--by", choices=("intervention", "factor"), default="intervention",
                   help="one row per library entry or factor family (default), or per factor family only")
    p.add_argument("--plot", metavar="OUT.png", help="also write the heatmaps (interventions × domains) here")
    p.add_argument("--json", metavar="OUT.json", help="also write the rows and each run's proposals here")
    p.set_defaults(func=cmd_strategies)
