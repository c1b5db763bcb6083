"""``evotrainer rerun RUN_DIR VERSION``: train a recorded version again and compare with its record.

    evotrainer rerun RUN_DIR VERSION [--out DIR] [--tracking-uri URI]

The run is only read; the rerun goes to RUN_DIR/reruns/<VERSION>-<n> (a new n each time) or ``--out``.
Exit code 0 when every quantity matches the record (exactly, or within tolerance for float
quantities), 1 when one differs, 2 for a directory that is not a run or an unknown version.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from evotrainer.records.run_dir import require

console = Console(highlight=False)
VERDICT_STYLE = {"exact": "green", "within tolerance": "yellow", "differs": "bold red"}


def comparison_table(result) -> Table:
    table = Table(title=f"{result.version_id}: recorded vs rerun")
    for name, justify in (("quantity", "left"), ("kind", "left"), ("recorded", "left"), ("rerun", "left"),
                          ("verdict", "left"), ("max |Δ|", "right")):
        table.add_column(name, justify=justify, overflow="fold")
    for c in result.comparisons:
        style = VERDICT_STYLE[c.verdict]
        table.add_row(escape(c.name), c.kind, escape(c.recorded), escape(c.rerun), f"[{style}]{c.verdict}[/{style}]",
                      "" if c.max_abs_diff is None else f"{c.max_abs_diff:.3g}")
    return table


def cmd_rerun(args: argparse.Namespace) -> int:
    require(args.run_dir, "run")   # before torch is imported: a wrong directory is said at once
    from evotrainer.loop.tools.rerun import rerun_version
    from evotrainer.loop.tools.version_compare import ATOL, RTOL

    result = rerun_version(args.run_dir, args.version, out_dir=args.out, tracking_uri=args.tracking_uri,
                           say=lambda m: console.print(f"[dim]{m}[/dim]"))
    console.print(f"start: {escape(result.start['note'])}", soft_wrap=True)
    console.print(comparison_table(result))
    env = result.environment
    console.print(f"[dim]rerun on {env['device']}, engine {env['engine']}, torch {env['torch']}, {env['threads']} "
                  "threads: float quantities match bit for bit on the original's device, engine, thread count and "
                  f"library versions, else within rtol {RTOL:g} / atol {ATOL:g}[/dim]", soft_wrap=True)
    differing = [c.name for c in result.comparisons if not c.matches]
    if differing:
        line = f"[bold red]{result.version_id} does not reproduce[/bold red]: {', '.join(differing)} differ"
    elif result.verdict == "exact":
        line = f"[green]{result.version_id} reproduced bit for bit[/green]: every quantity equals the record"
    else:
        close = [c.name for c in result.comparisons if c.verdict == "within tolerance"]
        line = (f"[yellow]{result.version_id} reproduced within tolerance[/yellow]: {', '.join(close)} are close, "
                "not equal; the rest is exact")
    console.print(line, soft_wrap=True)
    if not result.start["recorded"]:
        console.print(f"[yellow]note[/yellow]: the rerun did not start from recorded weights ({result.start['source']})",
                      soft_wrap=True)
    console.print(f"rerun written to {result.out_dir}", soft_wrap=True)
    where = args.tracking_uri or f"sqlite:///{result.out_dir}/mlflow.db"
    console.print(f"in MLflow: run {result.mlflow_run_id} in {where}, tagged evotrainer.rerun_of={result.version_id}"
                  + (f" (the version's run {result.recorded_run_id} in the original run)" if result.recorded_run_id
                     else ""), soft_wrap=True)
    return 0 if result.matched else 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rerun", help="train a recorded version again into a new directory and compare with its record")
    p.add_argument("run_dir", help="run directory written by `evotrainer run` (only read)")
    p.add_argument("version", help="version id, e.g. v0003 (`evotrainer lineage RUN_DIR` lists them)")
    p.add_argument("--out", metavar="DIR",
                   help="new or empty directory for the rerun (default: RUN_DIR/reruns/<VERSION>-<n>, a new n each time)")
    p.add_argument("--tracking-uri", metavar="URI",
                   help="MLflow tracking URI to record the rerun in (default: the rerun directory's own mlflow.db)")
    p.set_defaults(func=cmd_rerun)
