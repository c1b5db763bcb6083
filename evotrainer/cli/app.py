"""The ``evotrainer`` command line, assembled from one module per command group.

    evotrainer check CONFIG                   everything a run would refuse, without compute (cli/check.py)
    evotrainer train CONFIG                   train one branch under its harness (cli/train.py)
    evotrainer run|resume|status|approve|reject   the co-evolution loop (cli/loop.py)
    evotrainer lineage|skills RUN_DIR         inspect a run (cli/run_views.py)
    evotrainer rerun RUN_DIR VERSION          train a recorded version again, compare with its record (cli/rerun.py)
    evotrainer strategies RUN_DIR ...         interventions proposed, promoted and kept per domain (cli/strategies.py)
    evotrainer genome check|run ...           check a harness genome, run one hook in the sandbox (cli/genome.py)
    evotrainer mutate PATH ...                propose an intervention with an operator (cli/mutate.py)
    evotrainer report|backtest|gate ...       health reports, backtests and gates (cli/fitness.py)
    evotrainer domain show|verify ...         a domain's tasks; grade one completion (cli/domain.py)
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from evotrainer.cli import check, domain, fitness, genome, loop, mutate, run_views, train
from evotrainer.cli import strategies
from evotrainer.cli import rerun
from evotrainer.cli.errors import run_command

# The command groups, in the order `evotrainer --help` lists them.
COMMAND_GROUPS = (check, train, loop, run_views, rerun, strategies, genome, mutate, fitness, domain)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="evotrainer", description="RL training that evolves its own harness.")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of a failure (also: EVOTRAINER_DEBUG=1)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also show evotrainer's info-level log messages (warnings are always shown)")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        log = logging.getLogger("evotrainer")
        log.setLevel(logging.INFO)
        log.addHandler(handler)
    return run_command(args.func, args, debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
