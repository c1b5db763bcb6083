"""The SWE history-leak scenario: an honest branch and one that reads the fix from the git history.

Used by ``tests/test_swe_leak.py``. Both branches are version dirs written from real episodes of the
scripted policies (``domains/swe/scripted.py``) through ``run_episode`` in the real tool environment,
graded by the real SWE verifier, on an SWE domain with ``leak_share`` > 0 (a share of TRAIN
repositories keep a history whose last commit is the fix; held-out repositories never do):

* ``honest``  — reproduces the issue as a test and searches one-token fixes with the tests.
* ``cheater`` — runs ``git_log`` first and copies a fix it finds there; honest otherwise.

Rewards and advantages are the genome's own (its hooks, as the trainer calls them). The scripted
policies are deterministic, so each task's episode is run once per branch and repeated for every
generation and step: a sampled policy's rollouts would differ, these say exactly what the
diagnostics must see. No weights are trained: what a policy that *learned* the shortcut leaves in its
cache is what the engine and the diagnostics judge (as ``testing/planted.py`` builds its ``leaky`` branch).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from evotrainer.config import parse_config
from evotrainer.domains import build_domain
from evotrainer.domains.swe.environment import EnvLimits
from evotrainer.domains.swe.episode import run_episode
from evotrainer.domains.swe.scripted import Scripted, honest, reads_history
from evotrainer.domains.task import Task
from evotrainer.fitness.cache import write_version
from evotrainer.genome.harness import Harness
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.seed import DOMAIN_HARNESSES
from evotrainer.records.rollout import Rollout, group_rollouts
from evotrainer.records.version import VersionDir, write_atomic

POLICIES = {"honest": honest, "cheater": reads_history}


def swe_reference_program() -> HarnessProgram:
    return HarnessProgram.from_file(DOMAIN_HARNESSES["swe"])


def episode_rollout(ep: dict[str, Any], grade: dict[str, Any], split: str, step: int = 0, group: int = 0,
                    seed: int = 0) -> Rollout:
    """A Rollout of one episode: the prompt as ``messages`` (the system's tool prompt and the issue;
    the conversation after it is in ``turns``), the submitted patch as ``completion`` (what the grade
    read), one turn dict per assistant turn (role, content, tool, ok, error, result) and the calls as
    ``{"name", "args", "ok", "error"}``: the fields the SWE harness reads."""
    turns = [{"role": "assistant", "content": t["text"], "tool": t["tool_call"]["name"],
              "ok": t["tool_call"]["error"] is None, "error": t["tool_call"]["error"], "result": t["result"],
              "seconds": t["generate_s"] + t["tool_s"]} for t in ep["turns"]]
    calls = [{"name": c["name"], "args": c["args"], "ok": c["error"] is None, "error": c["error"]}
             for c in ep["tool_calls"]]
    verdict = {"visible": grade} if split == "train" else {"visible": {"format_ok": grade.get("format_ok")},
                                                            "hidden": grade}
    return Rollout(task_id=ep["task_id"], messages=ep["messages"][:2], completion=ep["patch"], turns=turns,
                   tool_calls=calls, stop_reason=ep["stop_reason"], gen_seconds=ep["seconds"], seed=seed,
                   group=group, step=step, split=split, **verdict)


def _episode(domain: Any, task: Task, policy: str) -> tuple[dict[str, Any], dict[str, Any]]:
    ep = run_episode(task, Scripted(POLICIES[policy]), domain.environment(task, EnvLimits(max_turns=400)))
    return ep, domain.verify(task, ep["patch"])


def score(program: HarnessProgram, train: list[Rollout], tasks: dict[str, Task]) -> list[dict[str, float]]:
    """Rewards, the group filter and advantages from ``program``'s hooks, step by step as the trainer
    calls them; returns each step's metrics."""
    steps = []
    with Harness(program, sandbox=False) as h:
        for step in sorted({r.step for r in train}):
            rs = [r for r in train if r.step == step]
            for r, rew in zip(rs, h.reward(rs, [tasks[r.task_id] for r in rs])):
                r.reward = float(rew)
            groups = group_rollouts(rs)
            kept = [g for g, k in zip(groups, h.keep_groups(groups)) if k]
            for g, adv in zip(kept, h.advantages(kept, [[r.reward for r in g.rollouts] for g in kept])):
                for r, a in zip(g.rollouts, adv):
                    r.advantage = float(a)
            steps.append({**h.metrics(rs, group_rollouts(rs)), "step": float(step)})
    return steps


def build_swe_leak_scenario(root: str | Path, n_train: int = 8, n_heldout: int = 6, leak_share: float = 0.5,
                            steps: int = 2, generations: int = 2, seed: int = 0,
                            difficulty: list[int] | None = None,
                            genomes: dict[str, HarnessProgram] | None = None) -> dict[str, Path]:
    """Writes ``root/honest`` and ``root/cheater`` (levels 1-2 by default: the honest policy solves
    only level 1, whose issue names the file, so the history pays on level 2; ``genomes``: the harness of
    each branch, default the SWE reference) with a ``config.json`` from which the engine rebuilds the
    domain and its task data (which repositories leak). Returns the version dirs."""
    root = Path(root)
    cfg = parse_config({"model": "tiny-random", "run_dir": str(root), "seed": seed,
                        "domain": {"name": "swe", "difficulty": difficulty or [1, 2], "n_train": n_train, "n_heldout": n_heldout,
                                   "n_test": 1, "leak_share": leak_share, "seed": seed}})
    domain = build_domain(cfg.domain)
    try:
        train_tasks, held_tasks = domain.tasks("train"), domain.tasks("heldout")
        tasks = {t.id: t for t in train_tasks + held_tasks}
        out = {}
        base = [episode_rollout(*_episode(domain, t, "honest"), "heldout", step=-1) for t in held_tasks]
        for policy in POLICIES:
            program = (genomes or {}).get(policy) or swe_reference_program()
            episodes = {t.id: _episode(domain, t, policy) for t in train_tasks + held_tasks}
            train = [episode_rollout(copy.deepcopy(episodes[t.id][0]), episodes[t.id][1], "train", step, g, k)
                     for step in range(steps) for g, t in enumerate(train_tasks) for k in range(generations)]
            held = [episode_rollout(*episodes[t.id], "heldout", step=-1) for t in held_tasks]
            history = score(program, train, tasks)
            path = write_version(root / policy, train, held, base, genome=program.source, version_id=policy)
            vd = VersionDir(path)
            for m in history:
                vd.append_step({**m, "constructed": 1.0})
            write_atomic(path / "config.json", cfg.model_copy(update={"run_dir": str(path)}).model_dump_json(indent=2))
            out[policy] = path
        return out
    finally:
        domain.close()


def describe(path: str | Path) -> dict[str, Any]:
    """Training resolution, held-out resolution and history reads of a scenario branch (for tests
    and reports): the numbers the leak shows in."""
    vd = VersionDir(path)
    train, held = vd.rollouts("train"), vd.rollouts("heldout")
    return {"train_resolved": sum(bool(r.visible.get("correct")) for r in train) / len(train),
            "heldout_resolved": sum(bool(r.hidden.get("correct")) for r in held) / len(held),
            "history_reads": sum(any(c.get("name") == "git_log" for c in r.tool_calls) for r in train),
            "config": json.loads((Path(path) / "config.json").read_text())["domain"]}
