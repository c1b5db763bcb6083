"""The episode driver: a multi-turn SWE episode with any ``generate(messages) -> text`` policy.

No model code here (domains import no torch): the policy layer plugs its rollout engine in as
``generate``. ``Episode`` is one episode as a state machine, so that a driver can batch the turns
of many episodes (``policy/episodes.py``); ``run_episode`` drives one serially. Each turn: the
policy writes a message (cut to ``max_turn_tokens``), the environment runs the one tool call in it
and the result is the next user message. The episode ends on ``submit``, or when the turns, the
context or the wall clock run out (``stop_reason``); without a submit, nothing is handed in (an
empty patch grades as unresolved). The returned dict is plain data (domains may not import
records): ``turns`` and ``tool_calls`` map onto a Rollout's fields, and ``history_calls`` is the
leak diagnostic.
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
    """The whole episode with one ``generate``: the serial driver (the policy layer's batches turns
    of many episodes at once through :class:`Episode`)."""
    episode = Episode(task, env, limits, count_tokens)
    while episode.wants_turn():
        t0 = time.monotonic()
        try:
            text = generate(list(episode.messages))
        except Exception as e:  # noqa: BLE001 - a failing policy ends its own episode, never the batch
            episode.end(f"generate_error: {type(e).__name__}: {e}"[:200])
            break
        episode.record(text, time.monotonic() - t0)
    return episode.result()


class Episode:
    """One episode as a state machine: ``wants_turn()`` (checks the limits, in the order submit,
    turns, time (:meth:`own_seconds`), context), ``record(text)`` (runs the turn's tool call), ``end(reason)`` (a
    driver's own limit), ``result()``. ``opening`` replaces the default first messages (the tool
    prompt as system message, the issue as user message)."""

    def __init__(self, task: Task, env: SWEEnvironment, limits: EnvLimits | None = None,
                 count_tokens: Callable[[str], int] = approx_tokens,
                 opening: list[dict[str, str]] | None = None) -> None:
        self.task, self.env, self.limits, self.count_tokens = task, env, limits or env.limits, count_tokens
        self.messages = [dict(m) for m in opening] if opening else [
            {"role": "system", "content": tool_prompt()}, {"role": "user", "content": task.prompt}]
        self.turns: list[dict[str, Any]] = []
        self.stop: str | None = None
        self.start = time.monotonic()

    def wants_turn(self) -> bool:
        """Whether the policy writes another turn; if not, ``stop`` says why."""
        if self.stop is None:
            if self.env.done:
                self.stop = "submitted"
            elif len(self.turns) >= self.limits.max_turns:
                self.stop = "max_turns"
            elif self.own_seconds() > self.limits.wall_s:
                self.stop = "wall_time"
            elif (sum(self.count_tokens(m["content"]) for m in self.messages) + self.limits.max_turn_tokens
                  > self.limits.max_context_tokens):
                self.stop = "context"
        return self.stop is None

    def own_seconds(self) -> float:
        """The episode's own time: its turns' generation and its tool calls. What ``wall_s`` limits: a
        driver that batches the turns of many episodes records each turn's share of the batch, so an
        episode's fate does not depend on how many others it was batched with."""
        return sum(t["generate_s"] + t["tool_s"] for t in self.turns)

    def end(self, reason: str) -> None:
        if self.stop is None:
            self.stop = reason

    def record(self, text: str, generate_s: float = 0.0, tokens: int | None = None) -> dict[str, Any]:
        """One model turn (cut to ``max_turn_tokens``): its tool call runs, the result is the next
        user message. Returns the turn's record. ``tokens``: the turn's sampled token count, from a
        driver whose sampler kept the limit; such a turn is never cut (its text re-encoded may count
        more tokens than were sampled, and the policy is trained on what it sampled)."""
        text = text if isinstance(text, str) else str(text)
        within = tokens is not None and tokens <= self.limits.max_turn_tokens
        cut = text if within else _cut(text, self.limits.max_turn_tokens, self.count_tokens)
        result, call = self.env.step(cut)
        turn = {"index": len(self.turns), "text": cut, "truncated": cut != text, "tool_call": call,
                "result": result, "generate_s": generate_s, "tool_s": call["seconds"]}
        self.turns.append(turn)
        self.messages += [{"role": "assistant", "content": cut}, {"role": "user", "content": result}]
        return turn

    def result(self) -> dict[str, Any]:
        self.wants_turn()   # settles ``stop`` for an episode a driver stopped asking
        env = self.env
        return {"task_id": self.task.id, "messages": self.messages, "turns": self.turns, "n_turns": len(self.turns),
                "tool_calls": [t["tool_call"] for t in self.turns], "submitted": env.done,
                "patch": env.submitted or "", "stop_reason": self.stop, "history_calls": env.history_calls,
                # an environment other than SWE's (a test's notes app) has no issue to quote a line
                "quotes_line": bool(getattr(env, "quotes_a_line", False)), "seconds": time.monotonic() - self.start}
