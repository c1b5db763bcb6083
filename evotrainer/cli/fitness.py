"""The fitness commands of the CLI: ``report``, ``backtest`` and ``gate``.

    evotrainer report VERSION_DIR [--compare OTHER_DIR] [--json]
    evotrainer backtest GENOME --on VERSION_DIR [--expect "metric op value"] [--labels FILE] [--json]
    evotrainer gate CHILD_DIR [--parent PARENT_DIR] [--labels FILE] [--json]

``backtest`` exits 0 when the candidate is accepted and 1 when rejected; ``gate`` exits 0 when the
child is promoted, 1 when refused or invalid. Usage errors (missing dirs, bad expectations) exit 2.
The labelled history defaults to the run's ``labels.json`` (next to the version dir, or ``RUN_DIR`` for a
loop's ``RUN_DIR/versions/VID``), when that file exists.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def _labels(path: str | None, version_dir: str, create: bool = False):
    from evotrainer.fitness.labels import LabelStore

    if path:
        return LabelStore(path)
    here = Path(version_dir).resolve().parent
    # A loop run keeps its labels at RUN_DIR/labels.json and versions under RUN_DIR/versions/.
    default = here.parent / "labels.json" if here.name == "versions" else here / "labels.json"
    return LabelStore(default) if default.is_file() or create else None


def _fail(msg: str) -> int:
    print(f"error: {msg}")
    return 2


def cmd_report(args: argparse.Namespace) -> int:
    from evotrainer.fitness.health import health_report

    for d in [args.version_dir] + ([args.compare] if args.compare else []):
        if not Path(d).is_dir():
            return _fail(f"{d} is not a version directory")
    report = health_report(args.version_dir, compare=args.compare, window=args.window)
    print((report.to_json() if args.json else report.to_markdown()).rstrip("\n"))
    return 0


def cmd_backtest(args: argparse.Namespace) -> int:
    from evotrainer.fitness.backtest import backtest, parse_expectation

    if not Path(args.genome).is_file():
        return _fail(f"{args.genome} is not a genome file")
    if not Path(args.on).is_dir():
        return _fail(f"{args.on} is not a version directory")
    try:
        expect = parse_expectation(args.expect) if args.expect else None
    except ValueError as e:
        return _fail(str(e))
    result = backtest(args.genome, args.on, expect=expect, labels=_labels(args.labels, args.on),
                      max_fpr=args.max_fpr)
    print((result.to_json() if args.json else result.to_markdown()).rstrip("\n"))
    return 0 if result.accept else 1


def cmd_gate(args: argparse.Namespace) -> int:
    from evotrainer.fitness.gates import GateConfig, gate

    for d in [args.child] + ([args.parent] if args.parent else []):
        if not Path(d).is_dir():
            return _fail(f"{d} is not a version directory")
    cfg = GateConfig(level=args.level, min_delta=args.min_delta)
    decision = gate(args.child, args.parent, cfg, labels=_labels(args.labels, args.child, create=args.record))
    print((decision.to_json() if args.json else decision.to_markdown()).rstrip("\n"))
    return 0 if decision.promote else 1


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="health report of a branch version (Markdown, or --json)")
    p.add_argument("version_dir", help="a version directory written by `evotrainer train`")
    p.add_argument("--compare", metavar="OTHER_DIR", help="outcome flow from this earlier version's held-out results")
    p.add_argument("--window", type=int, default=3, help="last training steps pooled as the current metrics")
    p.add_argument("--json", action="store_true", help="print JSON (what operators read)")
    p.set_defaults(func=cmd_report)

    p = subparsers.add_parser("backtest", help="replay a candidate genome on a version's cached rollouts")
    p.add_argument("genome", help="candidate harness file")
    p.add_argument("--on", required=True, metavar="VERSION_DIR", help="the parent version whose cache is replayed")
    p.add_argument("--expect", metavar='"METRIC OP VALUE"', help='expected effect, e.g. "dead_group_ratio < 0.3" '
                   "(ops: < > <= >= delta< delta>)")
    p.add_argument("--labels", metavar="FILE", help="labelled history (default: labels.json next to VERSION_DIR)")
    p.add_argument("--max-fpr", type=float, default=0.2, help="largest tolerated validity false-positive rate")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_backtest)

    p = subparsers.add_parser("gate", help="validity checks + paired statistics: may CHILD be promoted?")
    p.add_argument("child", help="the child version dir")
    p.add_argument("--parent", help="parent version dir (default: the child's own base-model held-out results)")
    p.add_argument("--labels", metavar="FILE", help="labelled history to record the verdict in")
    p.add_argument("--record", action="store_true", help="create labels.json next to CHILD if missing")
    p.add_argument("--level", type=float, default=0.95, help="confidence level of the paired bootstrap CI")
    p.add_argument("--min-delta", type=float, default=0.0, help="the CI lower bound must exceed this")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_gate)
