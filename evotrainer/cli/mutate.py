"""``evotrainer mutate``: run one operator on a harness file and print the intervention as JSON.

    evotrainer mutate harness.py --operator knobs
    evotrainer mutate harness.py --operator llm_diff --evidence report.json --llm-url http://localhost:8000/v1 --llm-model qwen
    evotrainer mutate a.py --operator crossover --second-parent b.py
    evotrainer mutate harness.py --operator llm_choice --evidence report.json     # the local model, constrained
    evotrainer mutate harness.py --operator library --evidence report.json        # no LLM

Exit code 0 with the intervention on stdout, or 1 with the rejection reason (and kind) on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from evotrainer.cli.errors import number
from evotrainer.config import ConfigError
from evotrainer.genome.program import HarnessProgram
from evotrainer.operators.base import OperatorError
from evotrainer.operators.evidence import Evidence, evidence_shape
from evotrainer.operators.llm_client import proposal_deadline

LLM_OPERATORS = ("llm_diff", "llm_rewrite", "llm_crossover", "llm_repair", "llm_choice")


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("mutate", help="propose one intervention on a harness with one operator",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", help="the parent harness file")
    p.add_argument("--operator", default="llm_diff", help="operator name (built-in, registered or plugin)")
    p.add_argument("--evidence", help="JSON file: a health report (a version's health.json), or "
                                        "{health_report, skills, history, known_hashes}")
    p.add_argument("--second-parent", help="second parent harness file (crossover operators)")
    p.add_argument("--failed-child", help="llm_repair: the child harness file that failed")
    p.add_argument("--failure", help="llm_repair: the error text it failed with")
    p.add_argument("--llm-url", help="OpenAI-compatible server URL (default: the local base model)")
    p.add_argument("--llm-model", help="model name on the server, or a local model spec/folder")
    p.add_argument("--structured-output", choices=("json_schema", "structured_outputs", "none"), default="json_schema",
                   help="how a server is asked to follow llm_choice's reply schema: response_format json_schema "
                        "(default), vLLM's structured_outputs field, or none (the prompt alone asks for JSON)")
    p.add_argument("--max-tokens", type=number(int, 16, 32768), default=1024, help="LLM completion tokens (default 1024)")
    p.add_argument("--temperature", type=number(float, 0), default=0.7)
    p.add_argument("--timeout", type=number(float, 0, 7200, low_open=True), default=300.0,
                   help="total seconds for the proposal, every LLM call and retry included (default 300)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--allow-multi-factor", action="store_true", help="accept children that change several factors")
    p.set_defaults(func=run_mutate)
    return p


def read_evidence(path: str) -> Evidence:
    """The --evidence file, or a ConfigError naming the file and where its JSON went wrong."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"--evidence {path}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--evidence {path}: not a UTF-8 text file") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--evidence {path}: expected a JSON object (a health report, or "
                          f"{{health_report, skills, history, known_hashes}}), got a {type(data).__name__}")
    shape = evidence_shape(data)
    if shape is None:
        raise ConfigError(f"--evidence {path}: neither a health report (a version's health.json: fields such as "
                          f"'metrics', 'engine', 'alerts') nor an evidence wrapper (a field 'health_report', "
                          f"beside 'skills', 'history', 'known_hashes'); its fields: {', '.join(sorted(data)) or 'none'}")
    wrapped = shape == "wrapper"
    problems = _shape_problems(data.get("health_report") if wrapped else data, data if wrapped else {})
    if problems:
        raise ConfigError(f"--evidence {path}: " + "; ".join(problems))
    return Evidence.from_dict(data)


def _shape_problems(report: Any, outer: dict[str, Any]) -> list[str]:
    """What in an evidence file has the wrong type (operators would fail on it with a raw error)."""
    out = []
    if report is not None and not isinstance(report, dict):
        return [f"field 'health_report' must be an object (a health report), got {type(report).__name__}"]
    report = report or {}
    metrics = report.get("metrics", {})
    if not isinstance(metrics, dict) or not all(v is None or isinstance(v, (int, float)) for v in metrics.values()):
        out.append("field 'metrics' must be an object of numbers (metric name -> value)")
    for key in ("alerts", "findings"):
        if key in report and not isinstance(report[key], list):
            out.append(f"field {key!r} must be a list")
    for key in ("skills", "history", "gaps"):
        if key in outer and not (isinstance(outer[key], list) and all(isinstance(x, dict) for x in outer[key])):
            out.append(f"field {key!r} must be a list of objects")
    if "known_hashes" in outer and not (isinstance(outer["known_hashes"], list)
                                        and all(isinstance(x, str) for x in outer["known_hashes"])):
        out.append("field 'known_hashes' must be a list of genome hashes (strings)")
    return out


def run_mutate(args: argparse.Namespace) -> int:
    from evotrainer.operators.registry import accepted_kwargs, get_operator

    parents = [HarnessProgram.from_file(args.path)]
    if args.second_parent:
        parents.append(HarnessProgram.from_file(args.second_parent))
    evidence = read_evidence(args.evidence) if args.evidence else Evidence()
    evidence.allow_multi_factor = evidence.allow_multi_factor or args.allow_multi_factor
    if args.failed_child:
        evidence.failed_source = Path(args.failed_child).read_text()
        evidence.failure = args.failure or "(no error text given)"
    shared: dict = {"seed": args.seed, "max_tokens": args.max_tokens, "temperature": args.temperature}
    try:
        if args.operator in LLM_OPERATORS or args.llm_url:
            from evotrainer.operators.llm_client import make_client

            structured = None if args.structured_output == "none" else args.structured_output
            extra = {"timeout": args.timeout, "on_wait": lambda m: print(m, file=sys.stderr, flush=True),
                     "notice_s": min(15.0, args.timeout / 4), "structured_output": structured
                     } if (args.llm_url or os.environ.get("EVOTRAINER_LLM_URL")) else {}
            shared["client"] = make_client(args.llm_url, args.llm_model, **extra)
        op = get_operator(args.operator, **accepted_kwargs(args.operator, shared))
        with proposal_deadline(shared.get("client"), args.timeout):
            intervention = op.propose(parents, evidence)
    except OperatorError as err:
        print(json.dumps({"rejected": True, "operator": args.operator, "kind": err.kind, "reason": err.reason}),
              file=sys.stderr)
        return 1
    except (KeyError, ValueError) as err:   # unknown operator, bad arguments: the user's to fix
        print(f"evotrainer mutate: {err.args[0] if err.args else err}", file=sys.stderr)
        return 2
    print(json.dumps(intervention.to_dict(), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (``python -m evotrainer.cli.mutate``) until the CLI wires it in."""
    parser = argparse.ArgumentParser(prog="evotrainer")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
