"""Whether a harness's ``prompt`` hook put the answer (or hidden data) into what the policy was asked.

A harness never receives answers, but it can compute one (evaluate the arithmetic in the prompt) or
echo hidden data that leaked into a visible field. The engine compares what each rollout was asked
(its messages) with the task's own prompt: a leak is text of the reference answer, or of a hidden
value, that the harness's messages carry more often than the task's own prompt does. As a control,
the same count is taken for another task's answer: a fixed example in a system prompt ("Answer: 5")
matches one answer in many by chance and is not a leak; a prompt that writes each task's own answer is.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from evotrainer.records.rollout import Rollout

if TYPE_CHECKING:
    from evotrainer.fitness.cache import CachedVersion

MIN_HIDDEN_CHARS = 8   # shorter hidden strings match ordinary text by chance


def occurrences(needle: str, text: str) -> int:
    """Whole-token occurrences of ``needle`` in ``text`` ('7' is not in '17')."""
    needle = needle.strip()
    if not needle:
        return 0
    return len(re.findall(r"(?<![\w.])" + re.escape(needle) + r"(?![\w]|\.\d)", text))


def _asked(r: Rollout) -> str:
    """What the harness's prompt asked. A multi-turn rollout may carry the conversation after the
    prompt in its messages (tool results, which show the repository's code): that is the episode, so
    the messages are cut at the policy's first turn (the assistant message that is ``turns[0]``'s
    text). An assistant message of the prompt itself (a few-shot example) is not cut at. The engine's
    episodes count their turns in ``turns`` and keep the turn dicts (``text``) in ``turn_log``."""
    turns = r.turns if isinstance(r.turns, list) else r.turn_log
    first = next((t.get("content", t.get("text")) for t in turns if isinstance(t, dict)
                  and t.get("role", "assistant") == "assistant"), None)
    asked = []
    for m in r.messages:
        if first is not None and m.get("role") == "assistant" and m.get("content") == first:
            break
        asked.append(str(m.get("content", "")))
    return "\n".join(asked)


def _hidden_strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if len(value.strip()) >= MIN_HIDDEN_CHARS else []
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _hidden_strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _hidden_strings(v)]
    return []


def prompt_leak_stats(v: CachedVersion) -> dict[str, Any]:
    """Share of rollouts whose messages add their own answer (``own``) vs another task's (``other``),
    and the rollouts whose messages add a hidden value of their task."""
    rollouts = [r for r in v.train + v.heldout if r.task_id in v.tasks]
    if not rollouts:
        return {"judged": 0, "own_share": None, "other_share": None, "hidden_leaks": 0, "examples": []}
    answers = [str(v.tasks[r.task_id].answer) for r in rollouts]
    shifted = answers[len(answers) // 2:] + answers[: len(answers) // 2]   # another task's answer, as a control
    own = other = hidden = 0
    examples: list[str] = []
    for r, ans, ctl in zip(rollouts, answers, shifted):
        task, asked = v.tasks[r.task_id], _asked(r)
        if occurrences(ans, asked) > occurrences(ans, task.prompt):
            own += 1
            if len(examples) < 3:
                examples.append(f"{r.task_id}: answer {ans!r} in {asked[-120:]!r}")
        if ctl != ans and occurrences(ctl, asked) > occurrences(ctl, task.prompt):
            other += 1
        if any(s in asked and s not in task.prompt for s in _hidden_strings(task.hidden)):
            hidden += 1
            if len(examples) < 3:
                examples.append(f"{r.task_id}: a hidden value of the task is in its messages")
    n = len(rollouts)
    return {"judged": n, "own_share": own / n, "other_share": other / n, "hidden_leaks": hidden, "examples": examples}
