"""CLI commands of the co-evolution loop: run, resume, status, approve, reject."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

from evotrainer.cli.errors import number
from evotrainer.records.run_dir import require
from evotrainer.records.run_state import load_state
from evotrainer.records.version import read_json

console = Console(highlight=False)


def _precheck(run_dir: str) -> None:
    """A missing, foreign or damaged run directory is reported before the loop (and torch) is imported."""
    require(run_dir, "run")
    load_state(run_dir)
    read_json(Path(run_dir) / "config.json", "the run's configuration")


def _experiment(run_dir: str, progress=None):
    _precheck(run_dir)
    from evotrainer.loop.experiment import Experiment

    return Experiment.resume(run_dir, on_event=lambda m: console.print(f"[dim]{m}[/dim]"), progress=progress)


def _run(exp) -> None:
    try:
        exp.run()
    finally:
        exp.progress.close()


def first_difference(frozen: Any, given: Any, where: str = "") -> str | None:
    """The dotted name of the first field where two config dumps differ (``evolution.generations``)."""
    if isinstance(frozen, dict) and isinstance(given, dict):
        for key in sorted(frozen.keys() | given.keys()):
            found = first_difference(frozen.get(key), given.get(key), f"{where}.{key}" if where else key)
            if found:
                return found
        return None
    return None if frozen == given else (where or "(the whole config)")


def _same_config(cfg, source: str) -> None:
    """Refuse ``run --resume`` with a config that is not the run's own: a resumed run must go on with
    the data, model and budgets its versions were made with (the location itself may differ)."""
    from evotrainer.config import ConfigError, parse_config

    path = Path(cfg.run_dir) / "config.json"
    _precheck(cfg.run_dir)
    frozen = parse_config(read_json(path, "the run's configuration"), str(path)).model_dump(mode="json")
    given = cfg.model_dump(mode="json")
    frozen.pop("run_dir", None)
    given.pop("run_dir", None)
    field = first_difference(frozen, given)
    if field:
        def at(d):
            for part in field.split("."):
                d = d.get(part) if isinstance(d, dict) else None
            return d
        raise ConfigError(f"{source} differs from the config frozen in {path} at {field} ({at(given)!r} here, "
                          f"{at(frozen)!r} in the run): continue the run as it was with `evotrainer resume "
                          f"{cfg.run_dir}`, or start a new run with another --run-dir")


def cmd_run(args: argparse.Namespace) -> int:
    from evotrainer.config import load_config
    from evotrainer.loop.validate import validate_resources

    cfg = load_config(args.config)   # a ConfigError is reported by the CLI's error policy (cli/errors.py)
    if args.run_dir:
        cfg.run_dir = args.run_dir
    if (Path(cfg.run_dir) / "state.json").is_file() and not args.resume:
        console.print(f"[red]{cfg.run_dir} already holds a run[/red]: continue it with "
                      f"`evotrainer resume {cfg.run_dir}` or choose another --run-dir")
        return 2
    if not (Path(cfg.run_dir) / "state.json").is_file():   # a new run: its config is checked first, light
        validate_resources(cfg, loop=True)
    else:                       # --resume: the run continues under the config frozen in it, or not at all
        _same_config(cfg, args.config)
    from evotrainer.loop.experiment import Experiment
    from evotrainer.loop.progress import RichProgress

    exp = Experiment(cfg, on_event=lambda m: console.print(f"[dim]{m}[/dim]"), progress=RichProgress(console))
    _run(exp)
    exp.print_summary(console)
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from evotrainer.loop.progress import RichProgress

    exp = _experiment(args.run_dir, RichProgress(console))
    _run(exp)
    exp.print_summary(console)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    _precheck(args.run_dir)
    from evotrainer.loop.experiment import Experiment

    exp = Experiment.resume(args.run_dir, readonly=True)   # a live run's status: read, never write
    s = exp.state
    console.print(f"[bold]{args.run_dir}[/bold]: {s.status}, generation {s.generation}/"
                  f"{exp.cfg.evolution.generations}, stage {s.stage}, live {', '.join(s.live) or '-'}")
    for line in s.events[-args.events:]:
        console.print(f"  [dim]{line}[/dim]")
    exp.print_summary(console)
    return 0


def _decide(args: argparse.Namespace, verdict: str) -> int:
    exp = _experiment(args.run_dir)
    pending = [k for k, v in exp.state.approvals.items() if v == "pending"]
    if not pending:   # nothing to decide: the run is left exactly as it is (a finished run stays finished)
        console.print(f"[red]nothing awaits approval in {args.run_dir}[/red] (the run is {exp.state.status})")
        return 1
    ids = args.versions or pending
    unknown = [i for i in ids if i not in pending]
    if unknown:
        console.print(f"[red]not awaiting approval: {', '.join(unknown)}[/red]; pending: {', '.join(pending)}")
        return 2
    for vid in ids:
        vd = exp.vdir(vid)
        meta = vd.meta()
        exp.state.approvals[vid] = verdict
        if verdict == "approved":
            meta.status = "pending"
        else:
            meta.status = "rejected"
            meta.decision = {"reasons": [f"rejected by a person{': ' + args.reason if args.reason else ''}"]}
            if vid in exp.state.live:
                exp.state.live.remove(vid)
        vd.save_meta(meta)
        exp.record(vid)
        console.print(f"{vid}: {verdict}")
    if exp.state.status == "paused" and not any(v == "pending" for v in exp.state.approvals.values()):
        exp.state.status = "running"
        console.print(f"all decided: continue with `evotrainer resume {args.run_dir}`")
    exp.save()
    return 0


def register(sub) -> None:
    p = sub.add_parser("run", help="run the co-evolution loop from a config")
    p.add_argument("config")
    p.add_argument("--run-dir", help="override run_dir")
    p.add_argument("--resume", action="store_true", help="continue if the run dir already holds this run")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("resume", help="continue a run (after a crash, kill -9 or a human gate)")
    p.add_argument("run_dir")
    p.set_defaults(func=cmd_resume)
    p = sub.add_parser("status", help="show a live or finished run")
    p.add_argument("run_dir")
    p.add_argument("--events", type=number(int, 1), default=10, help="recent events to show")
    p.set_defaults(func=cmd_status)
    for verdict, name in (("approved", "approve"), ("rejected", "reject")):
        p = sub.add_parser(name, help=f"{name} children waiting at the human gate")
        p.add_argument("run_dir")
        p.add_argument("versions", nargs="*", help="version ids (default: all pending)")
        p.add_argument("--reason", default="", help="feedback recorded with the decision")
        p.set_defaults(func=lambda a, v=verdict: _decide(a, v))
