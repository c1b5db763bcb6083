"""The ``evotrainer`` command line.

    evotrainer run CONFIG             the co-evolution loop; resume/status/approve/reject RUN_DIR
    evotrainer train CONFIG           train one branch under its harness, print held-out before/after
    evotrainer genome check|run ...   check a harness genome, run one hook in the sandbox
    evotrainer mutate PATH ...        propose an intervention with an operator
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from rich.console import Console
from rich.table import Table

console = Console(highlight=False)

# Subcommands other modules contribute: module path -> register(subparsers)
PLUGGED = ("evotrainer.loop_commands", "evotrainer.genome.commands", "evotrainer.operators.commands",
           "evotrainer.fitness.commands", "evotrainer.run_commands")


def _fmt(v) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def cmd_train(args: argparse.Namespace) -> int:
    from evotrainer.config import ConfigError, load_config
    from evotrainer.train import STEP_COLUMNS, train_branch

    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        console.print(f"[red]config error[/red]\n{e}")
        return 2
    if args.steps is not None:
        cfg.train.steps = args.steps
    if args.run_dir:
        cfg.run_dir = args.run_dir
    columns = ("step",) + STEP_COLUMNS + ("step_seconds",)
    # Plain prints: one row per step stays one line whatever the terminal width.
    print(" ".join(f"{c[:11]:>11}" for c in columns), flush=True)

    def on_step(m: dict) -> None:
        print(" ".join(f"{_fmt(m.get(c, float('nan'))):>11}" for c in columns), flush=True)

    try:
        result = train_branch(cfg, on_step=on_step, on_event=lambda msg: console.print(f"[dim]{msg}[/dim]"))
    except ConfigError as e:
        console.print(f"[red]config error[/red]\n{e}")
        return 2
    table = Table(title=f"held-out accuracy ({cfg.domain.name})")
    table.add_column("before")
    table.add_column("after")
    table.add_column("version dir")
    table.add_row(f"{result.heldout_before:.3f}", f"{result.heldout_after:.3f}", str(result.version_dir))
    console.print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="evotrainer", description="RL training that evolves its own harness.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train one branch under the reference recipe (or a harness file)")
    p.add_argument("config", help="YAML config file")
    p.add_argument("--steps", type=int, help="override train.steps")
    p.add_argument("--run-dir", help="override run_dir (the version directory written)")
    p.set_defaults(func=cmd_train)
    for module in PLUGGED:
        try:
            importlib.import_module(module).register(sub)
        except ModuleNotFoundError as e:  # a plugged module not built yet must not break the rest
            if e.name != module:
                raise
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
