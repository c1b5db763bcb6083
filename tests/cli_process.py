"""The real command line in a subprocess, as a user runs it (``cli``), and the reference harness
file its commands are given."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "evotrainer" / "genome" / "reference_harness.py"


def cli(args, cwd, stdout=subprocess.PIPE, env=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EVOTRAINER_DEBUG": "", **(env or {})}
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *map(str, args)], cwd=cwd, env=env,
                          stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=300)
