"""``genome`` CLI commands: check a harness file, run one of its hooks in the sandbox.

``register(subparsers)`` adds the command to the main CLI's argparse subparsers; each subcommand
sets ``func(args) -> int`` (the exit status). Standalone: ``python -m evotrainer.cli.genome``.

    genome check PATH                      ok <hash>            | exit 1, one line naming the problem
    genome run PATH --hook NAME [--rollouts FILE.jsonl] [--timeout S]
                                           the result as JSON   | exit 2, "failure <kind>: <message>"
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from evotrainer.cli.errors import number
from evotrainer.domains.task import Task
from evotrainer.records.rollout import Rollout, group_rollouts, load_rollouts
from evotrainer.genome.contract import check_contract
from evotrainer.genome.errors import ContractError
from evotrainer.genome.program import HOOKS, HarnessProgram
from evotrainer.genome.sandbox import Sandbox, SandboxError, SandboxLimits


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("genome", help="check a harness genome or run one of its hooks")
    sub = parser.add_subparsers(dest="genome_command", metavar="{check,run}")
    sub.required = True
    check = sub.add_parser("check", help="check a harness file against the contract")
    check.add_argument("path")
    check.set_defaults(func=cmd_check)
    run = sub.add_parser("run", help="run one hook of a harness file in the sandbox")
    run.add_argument("path")
    run.add_argument("--hook", required=True, choices=HOOKS)
    run.add_argument("--rollouts", help="rollouts as JSON lines (default: a built-in sample batch)")
    run.add_argument("--timeout", type=number(float, 0, 3600, low_open=True), default=10.0,
                     help="seconds for the whole run (default 10)")
    run.set_defaults(func=cmd_run)
    return parser


def _load(path: str) -> HarnessProgram:
    try:
        return HarnessProgram.from_file(path)
    except (OSError, UnicodeDecodeError) as e:
        raise ContractError(f"cannot read {path}: {e}") from None


def cmd_check(args: argparse.Namespace) -> int:
    try:
        program = _load(args.path)
        check_contract(program)
    except ContractError as e:
        print(f"{args.path}: {e}")
        return 1
    print(f"ok {program.hash}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    try:
        program = _load(args.path)
        rollouts, tasks = (_from_file(args.rollouts) if args.rollouts else sample_batch())
    except (ContractError, ValueError, OSError) as e:
        print(f"{e}")
        return 1
    deadline = time.monotonic() + args.timeout
    limits = SandboxLimits(timeout_s=args.timeout, start_timeout_s=args.timeout)
    try:
        with Sandbox(program, limits) as sandbox:
            result = _chain(sandbox, args.hook, rollouts, tasks, deadline)
    except SandboxError as e:
        print(f"failure {e.kind}: {e.failure.message}")
        if e.failure.output:
            print(e.failure.output[-2000:], file=sys.stderr)
        return 1 if e.kind == "contract" else 2
    print(json.dumps(result, indent=2))
    return 0


def _chain(sandbox: Sandbox, hook: str, rollouts: list[Rollout], tasks: list[dict], deadline: float) -> Any:
    """Runs the hooks ``hook`` depends on first (reward -> advantages -> metrics -> ...)."""
    def call(name: str, *a: Any) -> Any:
        return sandbox.call(name, *a, timeout=max(0.05, deadline - time.monotonic()))

    rds = [r.for_harness() for r in rollouts]
    if hook == "reward":
        return call("reward", rds, tasks)
    index = {id(r): i for i, r in enumerate(rollouts)}
    groups = [[index[id(r)] for r in g.rollouts] for g in group_rollouts(rollouts)]
    if hook == "keep_groups":
        return call("keep_groups", [[rds[i] for i in g] for g in groups])
    rewards = call("reward", rds, tasks)
    per_group = [[rewards[i] for i in g] for g in groups]
    advs = call("advantages", [[rds[i] for i in g] for g in groups], per_group)
    if hook == "advantages":
        return advs
    for g, adv in zip(groups, advs):
        for i, a in zip(g, adv):
            rds[i]["reward"], rds[i]["advantage"] = rewards[i], a
    grouped = [[rds[i] for i in g] for g in groups]
    metrics = call("metrics", rds, grouped)
    if hook == "metrics":
        return metrics
    if hook == "alerts":
        return call("alerts", metrics, [])
    return call("validity", rds, metrics, [])


def _from_file(path: str) -> tuple[list[Rollout], list[dict]]:
    rollouts = load_rollouts(path)
    tasks = [{"id": r.task_id, "prompt": r.messages[-1]["content"] if r.messages else "", "split": r.split,
              "domain": "unknown", "difficulty": 0, "visible": {}} for r in rollouts]
    return rollouts, tasks


def sample_batch(num_tasks: int = 3, group_size: int = 4) -> tuple[list[Rollout], list[dict]]:
    """A small, deterministic batch: one task solved by all, one by some, one by none."""
    rollouts, tasks = [], []
    for t in range(num_tasks):
        task = Task(id=f"sample-{t}", prompt=f"What is {t} + {t + 1}?", answer=str(2 * t + 1), split="train",
                    domain="math", difficulty=t)
        for k in range(group_size):
            correct = t == 0 or (t == 1 and k % 2 == 0)
            n = 8 + 4 * k
            rollouts.append(Rollout(
                task_id=task.id, messages=task.messages(), completion=f"The answer is {2 * t + 1 if correct else 0}.",
                completion_ids=list(range(n)), logprobs=[-0.4 - 0.05 * k] * n, truncated=k == 3 and t == 2,
                stop_reason="length" if k == 3 and t == 2 else "eos", group=t, step=0,
                visible={"correct": correct, "format_ok": k != 3, "extracted": str(2 * t + 1 if correct else 0)}))
            tasks.append(task.to_dict(include_hidden=False))
    return rollouts, tasks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="evotrainer")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main(["genome", *sys.argv[1:]]))
