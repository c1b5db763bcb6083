"""``evotrainer train CONFIG``: one branch under its harness, held-out accuracy before and after."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from evotrainer.cli.errors import number
from evotrainer.config import load_config

console = Console(highlight=False)


def _fmt(v) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def cmd_train(args: argparse.Namespace) -> int:
    from evotrainer.loop.tools.validate import validate_resources

    cfg = load_config(args.config)   # a ConfigError is reported by the CLI's error policy (cli/errors.py)
    if args.steps is not None:
        cfg.train.steps = args.steps
    if args.run_dir:
        cfg.run_dir = args.run_dir
    # The trainer pulls in torch and transformers: imported only when a branch is really trained.
    from evotrainer.loop.compute.train_branch import check_init_adapter, train_branch

    if args.init_adapter:   # a wrong folder is said before the resource checks and any compute
        check_init_adapter(cfg, args.init_adapter)
    validate_resources(cfg, loop=False, say=lambda msg: console.print(f"[yellow]{msg}[/yellow]"))
    from evotrainer.policy.train_step import STEP_COLUMNS

    columns = ("step",) + STEP_COLUMNS + ("step_seconds",)
    # Plain prints: one row per step stays one line whatever the terminal width.
    print(" ".join(f"{c[:11]:>11}" for c in columns), flush=True)

    def on_step(m: dict) -> None:
        print(" ".join(f"{_fmt(m.get(c, float('nan'))):>11}" for c in columns), flush=True)

    result = train_branch(cfg, on_step=on_step, on_event=lambda msg: console.print(f"[dim]{msg}[/dim]"),
                          validate=False, overwrite=args.overwrite, init_adapter=args.init_adapter,
                          restart=args.restart)
    table = Table(title=f"held-out accuracy ({cfg.domain.name})")
    table.add_column("before")
    table.add_column("after")
    table.add_column("version dir")
    table.add_row(f"{result.heldout_before:.3f}", f"{result.heldout_after:.3f}", str(result.version_dir))
    console.print(table)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train one branch under the reference recipe (or a harness file)")
    p.add_argument("config", help="YAML config file")
    p.add_argument("--steps", type=number(int, 0), help="override train.steps")
    p.add_argument("--run-dir", help="override run_dir (the version directory written)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the trained version in the directory (once the new training succeeded)")
    p.add_argument("--restart", action="store_true",
                   help="discard the checkpoint of an unfinished training in the run dir and start from step 0 "
                        "(by default a training of the same config and harness continues from it)")
    p.add_argument("--init-adapter", metavar="DIR",
                   help="start from this LoRA adapter (e.g. a version's adapter/ folder) instead of a fresh one")
    p.set_defaults(func=cmd_train)
