"""Harness: the engine-side facade of one genome, the object the trainer and backtests call.

``Harness(program)`` runs the hooks in a ``Sandbox`` (the default; required for any genome an
operator wrote). ``sandbox=False`` runs them in-process, after the same contract check, which is only
for trusted programs: the reference harness (benchmarks, fast tests) or a harness file the user
wrote and named (``loop/tools/validate.py`` refuses it when operators that write code are configured).
Either way missing hooks fall back to the reference harness and every result is validated. Inputs
may be engine objects (``Rollout``, ``Task``, ``Group``) or plain dicts; hidden outcomes are
stripped before a harness sees them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .contract import check_contract
from .program import HOOKS, HarnessProgram, reference_program
from .results import validate_result
from .sandbox import Sandbox, SandboxLimits


class Harness:
    def __init__(self, program: HarnessProgram | None = None, sandbox: bool = True,
                 limits: SandboxLimits | None = None, check: bool = True):
        self.program = program or reference_program()
        self.reference = reference_program()
        if not sandbox and check:   # in-process code passes the same contract check as sandboxed code
            check_contract(self.program)
        self.sandbox = Sandbox(self.program, limits, check=check) if sandbox else None
        self._hooks: dict[str, Any] | None = None

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.sandbox:
            self.sandbox.close()

    @property
    def knobs(self) -> dict[str, dict[str, Any]]:
        """Declared knobs: the reference recipe's, overridden and extended by the genome's."""
        return {**self.reference.knobs, **self.program.knobs}

    @property
    def knob_values(self) -> dict[str, Any]:
        return {name: spec["value"] for name, spec in self.knobs.items()}

    # ---- hooks -------------------------------------------------------------------------------
    def reward(self, rollouts: Iterable, tasks: Iterable) -> list[float]:
        return self.call("reward", _rollouts(rollouts), _tasks(tasks))

    def keep_groups(self, groups: Iterable) -> list[bool]:
        return self.call("keep_groups", _groups(groups))

    def advantages(self, groups: Iterable, rewards: list[list[float]]) -> list[list[float]]:
        return self.call("advantages", _groups(groups), [list(map(float, rs)) for rs in rewards])

    def metrics(self, rollouts: Iterable, groups: Iterable) -> dict[str, float]:
        memo: dict[int, dict] = {}  # one dict per rollout in both arguments: pickled once, shared
        return self.call("metrics", _rollouts(rollouts, memo), _groups(groups, memo))

    def alerts(self, metrics: dict[str, float], history: Iterable[dict] = ()) -> list[dict]:
        return self.call("alerts", dict(metrics), list(history))

    def validity(self, rollouts: Iterable, metrics: dict[str, float], history: Iterable[dict] = ()) -> list[dict]:
        return self.call("validity", _rollouts(rollouts), dict(metrics), list(history))

    def select_tasks(self, pool: Iterable, stats: dict[str, dict[str, int]], step: int, n: int) -> list[str]:
        return self.call("select_tasks", _tasks(pool), {k: dict(v) for k, v in stats.items()}, int(step), int(n))

    def prompt(self, task: Any) -> list[dict[str, str]]:
        return self.call("prompt", _tasks([task])[0])

    def uses_reference(self, hook: str) -> bool:
        """Whether ``hook`` is the reference's own code (or absent, so the reference's runs): the
        engine may then do the reference's work itself, without a sandbox round trip. Only for hooks
        that read nothing but their arguments (``select_tasks``, ``prompt``)."""
        own = self.program.hooks.get(hook)
        return own is None or own == self.reference.hooks.get(hook)

    def call(self, hook: str, *args: Any) -> Any:
        if self.sandbox is not None:
            return self.sandbox.call(hook, *args)
        fn = self._in_process().get(hook)
        return validate_result(hook, fn(*args), args)

    def _in_process(self) -> dict[str, Any]:
        if self._hooks is None:  # trusted code only: see the module docstring
            ref: dict[str, Any] = {"__name__": "reference_harness"}
            exec(compile(self.reference.source, "reference_harness.py", "exec"), ref)
            own: dict[str, Any] = {"__name__": "harness"}
            exec(compile(self.program.source, self.program.name, "exec"), own)
            ref["KNOBS"] = {**ref["KNOBS"], **own.get("KNOBS", {})}  # fallback hooks follow the genome's knobs
            self._hooks = {h: own[h] if callable(own.get(h)) else ref[h] for h in HOOKS}
        return self._hooks


def _rollout(r: Any) -> dict:
    # A shallow dict, not Rollout.for_harness(): that deep-copies (dataclasses.asdict) and costs
    # more than the sandbox round trip itself. The sandbox copies the data anyway (pickling).
    if hasattr(r, "for_harness"):
        d = dict(vars(r))  # also carries attributes the engine set, e.g. reward and advantage
        d.pop("hidden", None)  # never hand hidden verification to a harness
        return d
    return {k: v for k, v in r.items() if k != "hidden"} if "hidden" in r else r


def _rollouts(rollouts: Iterable, memo: dict[int, dict] | None = None) -> list[dict]:
    if memo is None:
        return [_rollout(r) for r in rollouts]
    out = []
    for r in rollouts:
        if id(r) not in memo:
            memo[id(r)] = _rollout(r)
        out.append(memo[id(r)])
    return out


def _groups(groups: Iterable, memo: dict[int, dict] | None = None) -> list[list[dict]]:
    return [_rollouts(g.rollouts if hasattr(g, "rollouts") else g, memo) for g in groups]


def _tasks(tasks: Iterable) -> list[dict]:
    """Task dicts without hidden data; a task repeated across its group is converted once (and,
    being one object, pickled once)."""
    seen: dict[int, dict] = {}
    out = []
    for t in tasks:
        if id(t) not in seen:
            if hasattr(t, "to_dict"):
                seen[id(t)] = t.to_dict(include_hidden=False)
            else:
                seen[id(t)] = {k: v for k, v in t.items() if k not in ("hidden", "answer")}
        out.append(seen[id(t)])
    return out
