"""Validation of hook results: what a harness returns is untrusted data until it passes here.

Both the sandboxed and the in-process harness go through ``validate_result``, so the engine only
ever sees well-typed, finite, correctly shaped values. Errors name the hook, the index and the
problem in one line ("reward[3] is nan; rewards must be finite").
"""

from __future__ import annotations

import math
from typing import Any

SEVERITIES = ("info", "warning", "critical")
MAX_METRICS = 10_000
MAX_FINDINGS = 1_000
MAX_PROMPT_CHARS = 20_000
ROLES = ("system", "user", "assistant")


class BadResult(ValueError):
    pass


def _number(x: Any, where: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise BadResult(f"{where} is a {type(x).__name__}, not a number")
    x = float(x)
    if not math.isfinite(x):
        raise BadResult(f"{where} is {x}; values must be finite")
    return x


def _numbers(xs: list, where: str) -> list[float]:
    if all(type(x) is float for x in xs) and all(map(math.isfinite, xs)):
        return xs  # the common case, checked at C speed
    return [_number(x, f"{where}[{i}]") for i, x in enumerate(xs)]


def _list(x: Any, n: int, where: str, what: str) -> list:
    if not isinstance(x, list):
        raise BadResult(f"{where} must be a list, got a {type(x).__name__}")
    if len(x) != n:
        raise BadResult(f"{where} must have {n} values ({what}), got {len(x)}")
    return x


def _text(d: dict, key: str, where: str, required: bool = True) -> str:
    v = d.get(key, None if required else "")
    if not isinstance(v, str):
        raise BadResult(f"{where}[{key!r}] must be a string")
    return v


def validate_result(hook: str, result: Any, args: tuple | list) -> Any:
    """The result in canonical form, or BadResult naming what is wrong."""
    if hook == "reward":
        return _numbers(_list(result, len(args[0]), "reward", "one per rollout"), "reward")
    if hook == "keep_groups":
        ks = _list(result, len(args[0]), "keep_groups", "one per group")
        for i, k in enumerate(ks):
            if not isinstance(k, bool):
                raise BadResult(f"keep_groups[{i}] is a {type(k).__name__}, not a bool")
        return ks
    if hook == "advantages":
        groups = args[0]
        adv = _list(result, len(groups), "advantages", "one list per group")
        return [_numbers(_list(row, len(groups[i]), f"advantages[{i}]", "one per rollout"), f"advantages[{i}]")
                for i, row in enumerate(adv)]
    if hook == "metrics":
        if not isinstance(result, dict):
            raise BadResult(f"metrics must be a dict of name -> number, got a {type(result).__name__}")
        if len(result) > MAX_METRICS:
            raise BadResult(f"metrics has {len(result)} entries; the limit is {MAX_METRICS}")
        for k in result:
            if not isinstance(k, str):
                raise BadResult(f"metrics key {k!r} is not a string")
        return {k: float(v) if isinstance(v, bool) else _number(v, f"metrics[{k!r}]") for k, v in result.items()}
    if hook in ("alerts", "validity"):
        if not isinstance(result, list):
            raise BadResult(f"{hook} must be a list of dicts, got a {type(result).__name__}")
        if len(result) > MAX_FINDINGS:
            raise BadResult(f"{hook} returned {len(result)} entries; the limit is {MAX_FINDINGS}")
        out = []
        for i, d in enumerate(result):
            where = f"{hook}[{i}]"
            if not isinstance(d, dict):
                raise BadResult(f"{where} must be a dict, got a {type(d).__name__}")
            if hook == "alerts":
                sev = d.get("severity")
                if sev not in SEVERITIES:
                    raise BadResult(f"{where}['severity'] must be one of {', '.join(SEVERITIES)}, got {sev!r}")
                out.append({"name": _text(d, "name", where), "severity": sev, "message": _text(d, "message", where),
                            "suggestion": _text(d, "suggestion", where, required=False)})
            else:
                out.append({"name": _text(d, "name", where), "message": _text(d, "message", where),
                            "evidence": d.get("evidence", "")})
        return out
    if hook == "select_tasks":
        pool, n = args[0], args[3]
        ids = _list(result, min(int(n), len(pool)), "select_tasks", "one task id per training task of the step")
        for i, t in enumerate(ids):
            if not isinstance(t, str):
                raise BadResult(f"select_tasks[{i}] is a {type(t).__name__}, not a task id string")
        if len(set(ids)) != len(ids):
            raise BadResult("select_tasks returned a task id twice; a step trains on distinct tasks")
        return ids   # whether the ids are train tasks is the engine's check, not a shape rule
    if hook == "prompt":
        if not isinstance(result, list) or not result:
            raise BadResult("prompt must be a non-empty list of chat messages ({'role', 'content'})")
        total = 0
        for i, m in enumerate(result):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise BadResult(f"prompt[{i}] must be {{'role': one of {', '.join(ROLES)}, 'content': str}}")
            total += len(m["content"])
        if result[-1]["role"] != "user":
            raise BadResult("prompt must end with the user's message (the task)")
        if total > MAX_PROMPT_CHARS:
            raise BadResult(f"prompt has {total} characters; the limit is {MAX_PROMPT_CHARS}")
        return [{"role": m["role"], "content": m["content"]} for m in result]
    raise BadResult(f"unknown hook {hook!r}")
