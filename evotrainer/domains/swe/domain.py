"""SWEDomain: repository-level bug fixing, graded in a clean copy in the code domain's sandbox.

Tasks are generated repositories (``generator``: levels 1-3) or SWE-bench-format instances over
repositories on disk (``files={"train": path, ...}``, see ``loader``). A completion is the final
patch: a unified diff (paths relative to the repository root), raw, in a ```diff block, or the diff
an episode submitted (``episode``).

Grading (``verify``): a fresh copy of the repository at its base, the patch applied with every
change to tests, conftest, test configuration or interpreter start-up files left out
(``patching.protected``; reported as ``ignored_paths``), the hidden tests restored over it, then
FAIL_TO_PASS and PASS_TO_PASS run in the sandbox. ``correct`` (resolved) only when every one of
them ran and passed; a patch that does not apply, or a run whose tests did not execute, is not a
pass. ``verify_full`` adds the *visible* outcome, the repository's own tests as the policy sees
them, with the same patch. Verdicts never raise on any completion. The verdict is the same on
every split (SWE rewards are the tests' verdict, as in SWE-bench); whether a harness may see it
is the engine's decision by split, as for every domain.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evotrainer.domains.code.executor import ExecLimits
from evotrainer.domains.code.sandboxed import SandboxedDomain
from evotrainer.domains.code.hacks import static_flags
from evotrainer.domains.swe.environment import EnvLimits, SWEEnvironment
from evotrainer.domains.swe.generator import LEVELS, make_split
from evotrainer.domains.swe.loader import load_swebench, read_tree
from evotrainer.domains.swe.patching import PatchError, apply_patch, protected
from evotrainer.domains.swe.runner import checker_program, collect_tests, run_many, runner_program
from evotrainer.domains.task import SPLITS, Task, text_key

DEFAULT_SIZES = {"train": 64, "heldout": 16, "test": 16}
DIFF_FENCE_RE = re.compile(r"```[ \t]*(?:diff|patch)[ \t]*\n(.*?)(?:```|\Z)", re.S | re.I)
DIFF_START_RE = re.compile(r"^(?:diff --git |--- )", re.M)


def extract_patch(completion: str) -> tuple[str, str]:
    """(patch, method): the last ```diff block (``fenced``), else the text from its first diff
    header (``raw``), else ("", ``none``)."""
    blocks = DIFF_FENCE_RE.findall(completion)
    if blocks:
        return blocks[-1], "fenced"
    m = DIFF_START_RE.search(completion)
    return (completion[m.start():], "raw") if m else ("", "none")


class SWEDomain(SandboxedDomain):
    name = "swe"

    def __init__(self, n_train: int | None = None, n_heldout: int | None = None, n_test: int | None = None,
                 difficulty: int | Sequence[int] = (1,), seed: int = 0, leak_share: float = 0.0,
                 files: dict[str, str | Path] | None = None, workers: int | None = None,
                 limits: ExecLimits | None = None, episode_limits: EnvLimits | None = None) -> None:
        levels = [difficulty] if isinstance(difficulty, int) else list(difficulty)
        if not levels or any(lv not in LEVELS for lv in levels):
            raise ValueError(f"swe difficulty must be one or more of {list(LEVELS)}, got {difficulty!r}")
        if not 0.0 <= leak_share <= 1.0:
            raise ValueError(f"leak_share must be in [0, 1], got {leak_share}")
        self.seed, self.levels, self.leak_share = seed, levels, leak_share
        self.episode_limits = episode_limits or EnvLimits()   # turns, tokens, context, wall time per episode
        super().__init__(workers, limits)
        self._trees: dict[tuple[str, str], dict[str, str]] = {}
        sizes = {"train": n_train, "heldout": n_heldout, "test": n_test}
        if files:
            unknown = set(files) - set(SPLITS)
            if unknown:
                raise ValueError(f"files: unknown split(s) {sorted(unknown)}; use {SPLITS}")
            self._splits = {s: load_swebench(files[s], s)[: sizes[s]] if s in files else [] for s in SPLITS}
            self._check_disjoint()
        else:
            self._splits = {s: make_split(s, DEFAULT_SIZES[s] if sizes[s] is None else sizes[s], levels, seed,
                                          leak_share) for s in SPLITS}

    def _check_disjoint(self) -> None:
        owner: dict[str, str] = {}
        for s in SPLITS:
            for t in self._splits[s]:
                key = text_key(t.id)
                if owner.get(key, s) != s:
                    raise ValueError(f"swe files overlap: instance {t.id!r} is in {s} and {owner[key]}")
                owner.setdefault(key, s)

    def tasks(self, split: str) -> list[Task]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return list(self._splits[split])

    # -- repositories ---------------------------------------------------------------------------
    def repo_files(self, task: Task) -> dict[str, str]:
        """The repository at its base, as the policy starts from it."""
        if "files" in task.visible:
            return dict(task.visible["files"])
        key = (task.visible["repo_path"], task.visible["base_commit"])
        if key not in self._trees:
            self._trees[key] = read_tree(*key)
        return dict(self._trees[key])

    def hidden_files(self, task: Task, files: dict[str, str]) -> dict[str, str]:
        """``files`` with the hidden tests restored (the generated test files, or the test_patch)."""
        if "test_files" in task.hidden:
            return {**{p: t for p, t in files.items() if p not in task.hidden["test_files"]}, **task.hidden["test_files"]}
        base = self.repo_files(task)
        kept = {p: t for p, t in files.items() if not protected(p)} | {p: t for p, t in base.items() if protected(p)}
        return apply_patch(kept, task.hidden["test_patch"])[0]

    def environment(self, task: Task, limits: EnvLimits | None = None) -> SWEEnvironment:
        """A tool environment over a scratch copy of the task's repository (and its history: the
        leak channel, present only in leaky train repositories), under ``limits`` or the domain's."""
        return SWEEnvironment(self.repo_files(task), task.visible.get("history"), self.executor,
                              limits or self.episode_limits, issue=task.visible.get("issue") or "")

    # -- grading -------------------------------------------------------------------------------
    def verify_batch(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[dict[str, Any]]:
        if len(tasks) != len(completions):
            raise ValueError(f"{self.name}: {len(tasks)} tasks but {len(completions)} completions")
        return [f["hidden"] for f in self._grade(tasks, completions, visible=False)]

    def verify_full(self, task: Task, completion: str, visible: bool = True) -> dict[str, Any]:
        """The hidden grade and (``visible``) the repository's own tests, with the patch and how
        it was read (what ``evotrainer domain verify swe`` prints)."""
        return self._grade([task], [completion], visible)[0]

    def _grade(self, tasks: Sequence[Task], completions: Sequence[str], visible: bool) -> list[dict[str, Any]]:
        """Every sandbox run of the batch goes to the executor at once (its workers in parallel)."""
        preps = [self._prepare(t, c, visible) for t, c in zip(tasks, completions)]
        runnable = [job for p in preps if p["runnable"] for job in p["jobs"]]
        done = iter(run_many(self.executor, runnable) if runnable else [])
        return [self._assemble(t, p, [next(done) for _ in p["jobs"]] if p["runnable"] else [
            {i: {"passed": False, "verdict": "not_run", "detail": p["error"] or "no patch"} for i in ids}
            for _, ids in p["jobs"]]) for t, p in zip(tasks, preps)]

    def _prepare(self, task: Task, completion: str, visible: bool) -> dict[str, Any]:
        patch, method = extract_patch(completion)
        base = self.repo_files(task)
        try:
            patched, ignored = apply_patch(base, patch, drop_protected=True)
            error = ""
        except PatchError as e:
            patched, ignored, error = base, [], str(e)
        ids = list(task.hidden["FAIL_TO_PASS"]) + list(task.hidden["PASS_TO_PASS"])
        graded = self.hidden_files(task, patched)
        if "tests" in task.hidden:
            jobs = [(checker_program(graded, [task.hidden["tests"][i] for i in ids]), ids)]
        else:
            jobs = [(runner_program(graded, ids), ids)]
        if visible:   # the patch's test edits were left out: these are the repository's own tests
            shown = collect_tests(patched)
            jobs.append((runner_program(patched, shown), shown))
        return {"patch": patch, "method": method, "error": error, "ignored": ignored, "jobs": jobs,
                "runnable": bool(patch) and not error, "tamper": _tamper(base, patched)}

    def _assemble(self, task: Task, prep: dict[str, Any], results: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
        f2p, p2p = task.hidden["FAIL_TO_PASS"], task.hidden["PASS_TO_PASS"]
        hid = results[0]
        resolved = bool(f2p) and all(hid[i]["passed"] for i in [*f2p, *p2p])
        fmt = prep["method"] != "none"
        out: dict[str, Any] = {"method": prep["method"], "format_ok": fmt, "patch": prep["patch"]}
        out["hidden"] = {"correct": resolved, "resolved": resolved, "format_ok": fmt, "patch_applied": prep["runnable"],
                         "patch_error": prep["error"], "ignored_paths": prep["ignored"], "tamper": prep["tamper"],
                         "fail_to_pass": {i: hid[i] for i in f2p}, "pass_to_pass": {i: hid[i] for i in p2p},
                         "passed": sum(r["passed"] for r in hid.values()), "total": len(hid)}
        if len(results) > 1:
            vis = results[1]
            out["visible"] = {"correct": bool(vis) and all(r["passed"] for r in vis.values()),
                              "passed": sum(r["passed"] for r in vis.values()), "total": len(vis), "tests": vis}
        return out


def _tamper(base: dict[str, str], patched: dict[str, str]) -> list[str]:
    """The code domain's static hack flags that the patch *added* (an ``__eq__`` override, patched
    builtins, exits, risky imports): for validity checks and reports, never for the verdict."""
    flags: list[str] = []
    for path, text in sorted(patched.items()):
        if path.endswith(".py") and text != base.get(path):
            before = set(static_flags(base.get(path, ""), "function"))
            flags += [f"{path}: {f}" for f in static_flags(text, "function") if f not in before]
    return flags
