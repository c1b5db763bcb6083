"""``domain`` CLI commands: look at a domain's tasks, grade one completion with the engine's verifier.

    domain show NAME [--split S] [--n K] [--json]        tasks with their ids (every registered domain)
    domain verify code --task ID COMPLETION_FILE         JSON: visible and hidden outcomes, per-test
                                                         verdicts, tamper flags; exit 0 when grading ran
    domain verify swe --task ID PATCH_FILE               JSON: visible tests and the hidden grade (resolved,
                                                         fail-to-pass and pass-to-pass results)

The domain is built from ``--config FILE`` (its ``domain:`` section) or from ``--difficulty`` and
``--seed`` over the domain's defaults; a ``HumanEval/N`` id is looked up in all of HumanEval.
Errors are one line and exit 1.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from evotrainer.config import ConfigError, load_config
from evotrainer.domains import build_domain, get_domain, known_domains
from evotrainer.domains.base import Domain
from evotrainer.domains.task import SPLITS, Task


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("domain", help="show a domain's tasks or grade a completion")
    sub = parser.add_subparsers(dest="domain_command", metavar="{show,verify}")
    sub.required = True
    show = sub.add_parser("show", help="list a domain's tasks with their ids")
    show.add_argument("name", help=f"a registered domain ({', '.join(known_domains())})")
    show.add_argument("--split", choices=SPLITS, default="train")
    show.add_argument("--n", type=int, default=5, help="tasks to show (default 5; 0 = all)")
    show.add_argument("--json", action="store_true", help="one JSON list (tasks without answers or hidden data)")
    verify = sub.add_parser("verify", help="grade one completion on one task with the engine's verifier")
    verify.add_argument("name", help="a registered domain")
    verify.add_argument("--task", required=True, help="the task id (see `evotrainer domain show NAME`)")
    verify.add_argument("completion", help="a file holding the completion text")
    for p in (show, verify):
        p.add_argument("--config", help="build the domain from this config's domain: section")
        p.add_argument("--difficulty", help="level(s), comma separated (default: the domain's own)")
        p.add_argument("--seed", type=int, default=0)
    show.set_defaults(func=cmd_show)
    verify.set_defaults(func=cmd_verify)
    return parser


class _Fail(Exception):
    pass


def _domain(args: argparse.Namespace, task_id: str | None = None) -> Domain:
    try:
        if args.config:
            cfg = load_config(args.config)
            if cfg.domain.name != args.name:
                raise _Fail(f"{args.config} describes the {cfg.domain.name!r} domain, not {args.name!r}")
            return build_domain(cfg.domain)
        if args.name not in known_domains():
            raise _Fail(f"unknown domain {args.name!r}; known domains: {', '.join(known_domains())}")
        kwargs: dict[str, Any] = {"seed": args.seed}
        if args.difficulty:
            try:
                levels = [int(x) for x in args.difficulty.split(",")]
            except ValueError:
                raise _Fail(f"--difficulty must be integers separated by commas, got {args.difficulty!r}") from None
            kwargs["difficulty"] = levels[0] if len(levels) == 1 else levels
        elif args.name == "code" and task_id and task_id.startswith("HumanEval/"):
            kwargs["difficulty"] = 4   # every HumanEval problem, whatever split it fell in
        return get_domain(args.name, **kwargs)
    except (ConfigError, ValueError, OSError) as e:
        raise _Fail(str(e).splitlines()[0]) from None


def _summary(t: Task) -> str:
    first = "\n".join(t.prompt.strip().splitlines()[:12])
    return f"{t.id}  [{t.split}, difficulty {t.difficulty}]\n" + "\n".join("    " + ln for ln in first.splitlines())


def cmd_show(args: argparse.Namespace) -> int:
    try:
        domain = _domain(args)
        tasks = domain.tasks(args.split)
    except _Fail as e:
        print(f"error: {e}")
        return 2   # the user's to fix (an unknown domain, a bad option): the CLI's policy
    shown = tasks if args.n <= 0 else tasks[: args.n]
    if args.json and args.name == "swe":
        print(json.dumps([_swe_summary(domain, t) for t in shown], indent=2))
    elif args.json:
        print(json.dumps([t.to_dict(include_hidden=False) for t in shown], indent=2))
    else:
        print(f"{args.name} {args.split}: {len(shown)} of {len(tasks)} tasks")
        for t in shown:
            print(_summary(t))
    _close(domain)
    return 0


def _swe_summary(domain: Domain, t: Task) -> dict[str, Any]:
    """A repository task without its hidden data: the issue and the file list (not the history)."""
    return {"id": t.id, "split": t.split, "difficulty": t.difficulty, "issue": t.prompt,
            "files": sorted(domain.repo_files(t)), "leaky": bool(t.visible.get("leaky"))}  # type: ignore[attr-defined]


def _with_tests(outcome: dict[str, Any], tests: list[Any]) -> dict[str, Any]:
    per = [{"test": t, "verdict": v, "error": e}
           for t, v, e in zip(tests, outcome["verdicts"], outcome["errors"])]
    return {k: v for k, v in outcome.items() if k not in ("verdicts", "errors")} | {"tests": per}


def cmd_verify(args: argparse.Namespace) -> int:
    domain = None
    try:
        domain = _domain(args, args.task)
        if not hasattr(domain, "verify_full"):
            raise _Fail(f"domain verify grades code completions; the {args.name!r} domain has no per-test verdicts")
        try:
            task = domain.task_by_id(args.task)
        except KeyError:
            raise _Fail(f"no task {args.task!r} in the {args.name} domain built from these options; "
                        f"list ids with `evotrainer domain show {args.name} --split SPLIT`") from None
        try:
            completion = Path(args.completion).read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise _Fail(f"cannot read the completion file {args.completion}: {e.strerror}") from None
        full = domain.verify_full(task, completion)
    except (_Fail, ValueError) as e:
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        _close(domain)
        return 2
    if args.name == "swe":
        print(json.dumps({"task": task.id, "split": task.split} | full, indent=2))
        _close(domain)
        return 0
    report = {"task": task.id, "split": task.split, "method": full["method"], "format_ok": full["format_ok"],
              "visible": _with_tests(full["visible"], task.visible["tests"]),
              "hidden": _with_tests(full["hidden"], task.hidden["tests"]), "tamper": full["tamper"],
              "program": full["program"]}
    print(json.dumps(report, indent=2))
    _close(domain)
    return 0


def _close(domain: Domain | None) -> None:
    close = getattr(domain, "close", None)
    if callable(close):
        close()
