"""The fitness commands of the CLI: ``report``, ``backtest`` and ``gate``.

    evotrainer report VERSION_DIR [--compare OTHER_DIR] [--json]
    evotrainer backtest GENOME --on VERSION_DIR [--expect "metric op value"] [--labels FILE] [--json]
    evotrainer gate CHILD_DIR [--parent PARENT_DIR] [--record [--labels FILE]] [--json]

``backtest`` exits 0 when the candidate is accepted and 1 when rejected; ``gate`` exits 0 when the
child is promoted, 1 when refused or invalid. Usage errors (missing dirs, bad expectations) exit 2.
On a loop's version (``RUN_DIR/versions/VID``) ``gate`` judges at the run's own ``evolution.gate_level``,
``evolution.min_delta`` and seed, read from ``RUN_DIR/config.json``, unless ``--level``/``--min-delta`` say
otherwise, so that a loop's child re-judged against its control is judged as the loop judged it.
The labelled history defaults to the run's ``labels.json`` (next to the version dir, or ``RUN_DIR`` for a
loop's ``RUN_DIR/versions/VID``), when that file exists. ``report``, ``backtest`` and ``gate`` without
``--record`` only read: they write nothing anywhere.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from evotrainer.cli.errors import number
from evotrainer.config import GATE_LEVEL, ConfigError, parse_config


def _labels(path: str | None, version_dir: str, create: bool = False):
    from evotrainer.fitness.labels import LabelStore

    if path:
        if not create and not Path(path).is_file():   # read-only use: a file that is not there is a typo
            raise FileNotFoundError(f"--labels {path} does not exist (backtest reads labelled history from it)")
        return LabelStore(path)
    here = Path(version_dir).resolve().parent
    # A loop run keeps its labels at RUN_DIR/labels.json and versions under RUN_DIR/versions/.
    default = here.parent / "labels.json" if here.name == "versions" else here / "labels.json"
    return LabelStore(default) if default.is_file() or create else None


def _fail(msg: str) -> int:
    print(f"error: {msg}")
    return 2


def _not_a_version(d: str, need_train: bool = False) -> str | None:
    """Why ``d`` cannot be judged as a version directory (None when it can): a folder without a
    version's record would give an empty report, and a backtest on 0 rollouts would say ACCEPT."""
    path = Path(d)
    if not path.is_dir():
        return f"{d} is not a version directory (it does not exist)"
    if not (path / "meta.json").is_file():
        return (f"{d} is not a version directory (no meta.json): give a directory written by "
                "`evotrainer train`, or RUN_DIR/versions/VID of a loop run")
    if need_train and not (path / "rollouts" / "train.jsonl").is_file():
        return f"{d} holds no cached training rollouts (rollouts/train.jsonl): there is nothing to replay"
    return None


def cmd_report(args: argparse.Namespace) -> int:
    for d in [args.version_dir] + ([args.compare] if args.compare else []):
        if why := _not_a_version(d):
            return _fail(why)
    from evotrainer.fitness.health import health_report

    report = health_report(args.version_dir, compare=args.compare, window=args.window)
    print((report.to_json() if args.json else report.to_markdown()).rstrip("\n"))
    return 0


def cmd_backtest(args: argparse.Namespace) -> int:
    if not Path(args.genome).is_file():
        return _fail(f"{args.genome} is not a genome file")
    if why := _not_a_version(args.on, need_train=True):
        return _fail(why)
    from evotrainer.fitness.backtest import backtest, parse_expectation

    try:
        expect = parse_expectation(args.expect) if args.expect else None
    except ValueError as e:
        return _fail(str(e))
    result = backtest(args.genome, args.on, expect=expect, labels=_labels(args.labels, args.on),
                      max_fpr=args.max_fpr)
    print((result.to_json() if args.json else result.to_markdown()).rstrip("\n"))
    if expect is not None and result.expectation_status == "untestable":
        _note_unknown_metric(expect.metric, result, Path(args.on))
    return 0 if result.accept else 1


def _note_unknown_metric(metric: str, result, version_dir: Path) -> None:
    """A metric nothing measures is most likely a typo: said, since 'judged after training' would
    otherwise accept it and it would never be judged."""
    import json
    import sys

    health = version_dir / "health.json"
    try:
        reported = set((json.loads(health.read_text()).get("metrics") or {})) if health.is_file() else set()
    except (OSError, ValueError, AttributeError):
        reported = set()
    known = set(result.before) | set(result.after) | reported | {"heldout_accuracy"}
    if metric not in known:
        print(f"note: --expect names {metric!r}, which neither the cache's replay nor {version_dir.name}'s health "
              f"report measures (they measure: {', '.join(sorted(known)[:12])}, ...); check its spelling",
              file=sys.stderr)


def _run_gate_settings(version_dir: str) -> dict:
    """The gate settings of the loop run that wrote ``version_dir`` (``RUN_DIR/versions/VID``), read from
    ``RUN_DIR/config.json``: level, min_delta, seed and validity thresholds as the loop gated with.
    Empty outside a run."""
    here = Path(version_dir).resolve().parent
    path = here.parent / "config.json"
    if here.name != "versions" or not path.is_file():
        return {}
    from evotrainer.fitness.gate_config import gate_config

    return dataclasses.asdict(gate_config(parse_config(json.loads(path.read_text()), str(path))))


def cmd_gate(args: argparse.Namespace) -> int:
    for d in [args.child] + ([args.parent] if args.parent else []):
        if why := _not_a_version(d):
            return _fail(why)
    from evotrainer.fitness.gates import GateConfig, gate

    if args.labels and not args.record:
        return _fail("--labels names where --record writes the verdict: add --record (without it, gate only reads)")
    try:
        settings = _run_gate_settings(args.child)
    except (ConfigError, ValueError) as e:
        return _fail(f"cannot read the gate settings of {args.child}'s run: {e}; pass --level and --min-delta")
    if args.level is not None:
        settings["level"] = args.level
    if args.min_delta is not None:
        settings["min_delta"] = args.min_delta
    cfg = GateConfig(**settings)
    # Without --record the gate is an inspection: it judges and writes nothing, labels.json included.
    labels = _labels(args.labels, args.child, create=True) if args.record else None
    decision = gate(args.child, args.parent, cfg, labels=labels)
    print((decision.to_json() if args.json else decision.to_markdown()).rstrip("\n"))
    return 0 if decision.promote else 1


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="health report of a branch version (Markdown, or --json)")
    p.add_argument("version_dir", help="a version directory written by `evotrainer train`")
    p.add_argument("--compare", metavar="OTHER_DIR", help="outcome flow from this earlier version's held-out results")
    p.add_argument("--window", type=number(int, 1), default=3, help="last training steps pooled as the current metrics")
    p.add_argument("--json", action="store_true", help="print JSON (what operators read)")
    p.set_defaults(func=cmd_report)

    p = subparsers.add_parser("backtest", help="replay a candidate genome on a version's cached rollouts")
    p.add_argument("genome", help="candidate harness file")
    p.add_argument("--on", required=True, metavar="VERSION_DIR", help="the parent version whose cache is replayed")
    p.add_argument("--expect", metavar='"METRIC OP VALUE"', help='expected effect, e.g. "dead_group_ratio < 0.3" '
                   "(ops: < > <= >= delta< delta>)")
    p.add_argument("--labels", metavar="FILE", help="labelled history (default: labels.json next to VERSION_DIR)")
    p.add_argument("--max-fpr", type=number(float, 0, 1), default=0.2, help="largest tolerated validity false-positive rate")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_backtest)

    p = subparsers.add_parser("gate", help="validity checks + paired statistics: may CHILD be promoted?")
    p.add_argument("child", help="the child version dir")
    p.add_argument("--parent", help="parent version dir (default: the child's own base-model held-out results)")
    p.add_argument("--labels", metavar="FILE", help="with --record: the labelled history to record the verdict in")
    p.add_argument("--record", action="store_true", help="record the verdict in the labelled history "
                   "(default: labels.json next to CHILD, created if missing); without it nothing is written")
    p.add_argument("--level", type=number(float, 0, 0.999, low_open=True), default=None,
                   help="confidence level of the paired bootstrap CI (default: for RUN_DIR/versions/VID the run's "
                   f"evolution.gate_level, else {GATE_LEVEL})")
    p.add_argument("--min-delta", type=float, default=None, help="the CI lower bound must exceed this (default: "
                   "for RUN_DIR/versions/VID the run's evolution.min_delta, else 0)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_gate)
