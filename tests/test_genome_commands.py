"""The `genome check` / `genome run` commands, through a parser built the way the main CLI builds it."""

from __future__ import annotations

import argparse
import json
import time

import pytest

from evotrainer.genome import reference_program
from evotrainer.cli.genome import register, sample_batch
from evotrainer.genome.program import REFERENCE_PATH
from evotrainer.records.rollout import save_rollouts


def run_cli(argv, capsys):
    parser = argparse.ArgumentParser(prog="evotrainer")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code = args.func(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_check_ok_and_failure(tmp_path, capsys):
    code, out, _ = run_cli(["genome", "check", str(REFERENCE_PATH)], capsys)
    assert code == 0 and out == f"ok {reference_program().hash}\n"
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\ndef reward(rollouts, tasks):\n    return []\n")
    code, out, _ = run_cli(["genome", "check", str(bad)], capsys)
    assert code == 1 and out.count("\n") == 1 and "line 1: import of 'os' is not allowed" in out
    code, out, _ = run_cli(["genome", "check", str(tmp_path / "missing.py")], capsys)
    assert code == 1 and "cannot read" in out


@pytest.mark.parametrize("hook", ["reward", "keep_groups", "advantages", "metrics", "alerts", "validity"])
def test_run_each_hook_on_the_sample_batch(hook, capsys):
    code, out, _ = run_cli(["genome", "run", str(REFERENCE_PATH), "--hook", hook], capsys)
    assert code == 0
    result = json.loads(out)
    if hook == "reward":
        assert len(result) == len(sample_batch()[0])
    if hook == "metrics":
        assert result["dead_group_ratio"] == pytest.approx(2 / 3)
    if hook == "alerts":
        assert result[0]["name"] == "insufficient_signal"


def test_run_on_a_rollouts_file(tmp_path, capsys):
    path = tmp_path / "rollouts.jsonl"
    save_rollouts(path, sample_batch()[0])
    argv = ["genome", "run", str(REFERENCE_PATH), "--hook", "advantages", "--rollouts", str(path)]
    code, out, _ = run_cli(argv, capsys)
    assert code == 0 and len(json.loads(out)) == 3


def test_run_reports_violations_within_the_timeout(tmp_path, capsys):
    hang = tmp_path / "hang.py"
    hang.write_text("def reward(rollouts, tasks):\n    while True:\n        pass\n")
    t0 = time.monotonic()
    code, out, _ = run_cli(["genome", "run", str(hang), "--hook", "metrics", "--timeout", "1"], capsys)
    assert code == 2 and out.startswith("failure timeout:")
    assert time.monotonic() - t0 < 20.0   # the 1 s timeout killed it, not an endless loop (slack for load)
    nan = tmp_path / "nan.py"
    nan.write_text("def reward(rollouts, tasks):\n    return [float('nan') for r in rollouts]\n")
    code, out, _ = run_cli(["genome", "run", str(nan), "--hook", "reward"], capsys)
    assert code == 2 and out.startswith("failure bad_result: reward[0] is nan")
    code, out, _ = run_cli(["genome", "run", str(nan).replace("nan.py", "none.py"), "--hook", "reward"], capsys)
    assert code == 1
