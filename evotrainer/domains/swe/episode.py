"""The episode driver: a multi-turn SWE episode with any ``generate(messages) -> text`` policy.

No model code here (domains import no torch): the policy layer plugs its rollout engine in as
``generate``. Each turn: the policy writes a message (cut to ``max_turn_tokens``), the environment
runs the one tool call in it and the result is the next user message. The episode ends on
``submit``, or when the turns, the context or the wall clock run out (``stop_reason``); without a
submit, nothing is handed in (an empty patch grades as unresolved). The returned dict is plain data
(domains may not import records): ``turns`` and ``tool_calls`` map onto a Rollout's fields, and
``history_calls`` is the leak diagnostic.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from evotrainer.domains.swe.environment import EnvLimits, SWEEnvironment, approx_tokens, tool_prompt
from evotrainer.domains.task import Task

Generate = Callable[[list[dict[str, str]]], str]


def _cut(text: str, limit: int, count: Callable[[str], int]) -> str:
    if count(text) <= limit:
        return text
    lo, hi = 0, len(text)   # the longest prefix within the limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if count(text[:mid]) <= limit else (lo, mid - 1)
    return text[:lo]


def run_episode(task: Task, generate: Generate, env: SWEEnvironment, limits: EnvLimits | None = None,
                count_tokens: Callable[[str], int] = approx_tokens) -> dict[str, Any]:
    limits = limits or env.limits
    messages = [{"role": "system", "content": tool_prompt()}, {"role": "user", "content": task.prompt}]
    turns: list[dict[str, Any]] = []
    start = time.monotonic()
    stop = "max_turns"
    for index in range(limits.max_turns):
        if time.monotonic() - start > limits.wall_s:
            stop = "wall_time"
            break
        if sum(count_tokens(m["content"]) for m in messages) + limits.max_turn_tokens > limits.max_context_tokens:
            stop = "context"
            break
        t0 = time.monotonic()
        try:
            text = generate(list(messages))
        except Exception as e:  # noqa: BLE001 - a failing policy ends its own episode, never the batch
            stop = f"generate_error: {type(e).__name__}: {e}"[:200]
            break
        gen_s = time.monotonic() - t0
        text = text if isinstance(text, str) else str(text)
        cut = _cut(text, limits.max_turn_tokens, count_tokens)
        result, call = env.step(cut)
        turns.append({"index": index, "text": cut, "truncated": cut != text, "tool_call": call,
                      "result": result, "generate_s": gen_s, "tool_s": call["seconds"]})
        messages += [{"role": "assistant", "content": cut}, {"role": "user", "content": result}]
        if env.done:
            stop = "submitted"
            break
    return {"task_id": task.id, "messages": messages, "turns": turns, "n_turns": len(turns),
            "tool_calls": [t["tool_call"] for t in turns], "submitted": env.done, "patch": env.submitted or "",
            "stop_reason": stop, "history_calls": env.history_calls, "seconds": time.monotonic() - start}
