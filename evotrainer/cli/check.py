"""``evotrainer check CONFIG``: everything a run of CONFIG would refuse, said at once, without compute.

A run stops at the first refusal; a user setting up a GPU node from a CPU laptop wants the whole list
(device, engine and extras, model folder, data files, LoRA targets, Ray's GPUs) before the first try.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from evotrainer.config import load_config

console = Console(highlight=False)


def cmd_check(args: argparse.Namespace) -> int:
    from evotrainer.loop.tools.validate import config_problems

    cfg = load_config(args.config)   # a config that does not parse is one refusal, reported as usual
    said: list[str] = []
    problems = config_problems(cfg, loop=not args.train, say=said.append)
    for msg in said:
        console.print(f"[yellow]{msg}[/yellow]")
    for msg in problems:
        console.print(f"[red]refused:[/red] {msg}")
    what = "`evotrainer train`" if args.train else "`evotrainer run`"
    if problems:
        console.print(f"{args.config}: {len(problems)} thing(s) {what} would refuse")
        return 1
    console.print(f"{args.config}: nothing {what} would refuse")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="say everything a run of a config would refuse, without compute")
    p.add_argument("config", help="YAML config file")
    p.add_argument("--train", action="store_true", help="check for `evotrainer train` (no loop settings)")
    p.set_defaults(func=cmd_check)
