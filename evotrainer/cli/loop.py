"""CLI commands of the co-evolution loop: run, resume, status, and the human gate's approve, revise, abort
(reject = abort)."""

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
    from evotrainer.loop.tools.validate import validate_resources

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
    _print_pending(exp)
    exp.print_summary(console)
    return 0


def _decide(args: argparse.Namespace, action: str) -> int:
    """approve | abort (reject is abort) | revise, through loop/human/decisions.py; then what comes next."""
    exp = _experiment(args.run_dir)
    from evotrainer.loop.human import decisions, human_gate

    try:
        if not human_gate.pending(exp):   # nothing to decide: the run is left exactly as it is
            console.print(f"[red]nothing awaits a decision in {args.run_dir}[/red] (the run is {exp.state.status})")
            return 1
        if action == "revise":
            point = decisions.revise(exp, args.version, genome=args.genome, hypothesis=args.hypothesis,
                                     note=args.note, outcome=args.outcome, reason=args.reason, by=args.by)
            ids = [args.version]
            verdict = "revised" + (" (approve or abort it now)" if point in ("design", "backtest") else "")
        else:
            ids = (decisions.approve if action == "approve" else decisions.abort)(
                exp, args.versions, reason=args.reason, by=args.by)
            verdict = "approved" if action == "approve" else "rejected"
        for vid in ids:
            console.print(f"{vid}: {verdict}")
        if exp.state.stop_reason and action == "abort" and exp.state.status == "running":
            console.print(f"the run stops: {exp.state.stop_reason}")
            _run(exp)   # closes it cleanly now: the final pick on test, every version recorded
            exp.print_summary(console)
        elif not human_gate.pending(exp):
            console.print(f"all decided: continue with `evotrainer resume {args.run_dir}`")
    finally:
        exp.close()
    return 0


def _print_pending(exp) -> None:
    from evotrainer.loop.human import human_gate

    waiting = human_gate.pending(exp)
    if waiting:
        console.print(f"[bold yellow]{human_gate.pause_line(exp, waiting)}[/bold yellow]")
        console.print(human_gate.request_text(exp, waiting), markup=False)


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
    helps = {"approve": "let what waits at the human gate go ahead",
             "abort": "drop children waiting at the human gate (at diagnosis: no children; all: stop the run)",
             "reject": "drop children waiting at the human gate (the same as abort)"}
    for name, action in (("approve", "approve"), ("abort", "abort"), ("reject", "abort")):
        p = sub.add_parser(name, help=helps[name])
        p.add_argument("run_dir")
        p.add_argument("versions", nargs="*", help="version ids (default: all awaiting a decision)")
        p.add_argument("--reason", default="", required=name == "abort", help="why, recorded with the decision")
        p.add_argument("--by", help="who decides (default: the user name)")
        p.set_defaults(func=lambda a, v=action: _decide(a, v))
    p = sub.add_parser("revise", help="change what waits at the human gate, then approve or abort it")
    p.add_argument("run_dir")
    p.add_argument("version")
    p.add_argument("--genome", help="design/backtest: a harness file that replaces the child's genome")
    p.add_argument("--hypothesis", help="design/backtest: the child's new hypothesis")
    p.add_argument("--note", help="diagnosis: a hint the operators see among the survivor's alerts")
    p.add_argument("--outcome", choices=("kept", "rejected"), help="completion: hold back the gate's verdict")
    p.add_argument("--reason", default="", help="why, recorded with the decision")
    p.add_argument("--by", help="who decides (default: the user name)")
    p.set_defaults(func=lambda a: _decide(a, "revise"))
