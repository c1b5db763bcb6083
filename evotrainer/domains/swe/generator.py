"""A seeded generator of small Python repositories with one injected bug each (the generated SWE tasks).

A repository is a package of three modules drawn from ``templates`` and a test folder. One module
carries one bug from the catalogue (``mutations``). The generator runs the correct and the buggy
module (its own code: trusted, and unable to hang, see ``templates``) on every test input, keeps a
mutation only when some test fails and others pass, and from that writes:

- ``FAIL_TO_PASS``: the tests the bug breaks; ``PASS_TO_PASS``: every other test of the repository;
- the visible tests (``tests/test_<module>.py`` without the failing cases, as in SWE-bench, where the
  failing tests arrive with the fix) and the hidden ones (all cases), restored at grading;
- an issue written from the failing behaviour; the fix as a unified diff (the task's answer).

Levels: 1 the issue names the file and the function and the fix is one token (operator,
comparison, constant); 2 the issue names the function only and the bug is any kind; 3 the issue
describes behaviour only and the bug is in a helper the failing function calls. Level 0 is a rung
below level 1 for training only: level 1's bugs, the issue also naming the wrong line (its number and
text), so the policy has only to write the replacement. Held-out and test never hold level 0 (a split
other than train drops it from the levels asked for), so a curriculum may start there while every
reported rate stays level 1. A bug is its
``Bug.key`` (template module + mutation: function, kind, site): two tasks with one key hold the same
bug whatever their package name and other modules. Splits are disjoint by bug: a bug is assigned to
one split by a hash of its key, so no seed or size can put a held-out bug into train. A split never
holds a bug twice (a rate over repeated bugs would count one bug several times): asking a level for
more tasks than its bugs in that split is an error (``capacity`` says how many it holds). A share
``leak_share`` of *train* repositories keep a history whose last commit is the fix (``git log -p``
shows it); other repositories' history is the initial import only.
"""

from __future__ import annotations

import copy
import hashlib
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from evotrainer.domains.swe.patching import diff_files
from evotrainer.domains.swe.mutations import ONE_TOKEN, Mutation, callers, mutations
from evotrainer.domains.swe.templates import PACKAGES, TEMPLATES
from evotrainer.domains.task import Task

LEVELS = (0, 1, 2, 3)
TRAIN_ONLY = (0,)   # levels only the train split holds


def bug_level(level: int) -> int:
    """The catalogue level a task level draws its bugs from (level 0 is level 1's bugs, better described)."""
    return max(level, 1)


def split_levels(split: str, levels: list[int]) -> list[int]:
    """The levels ``split`` holds of those asked for: every one for train, none of the train-only ones
    elsewhere."""
    return list(levels) if split == "train" else [lv for lv in levels if lv not in TRAIN_ONLY]
BUCKETS = {"train": range(0, 6), "heldout": range(6, 8), "test": range(8, 10)}


@dataclass(frozen=True)
class Bug:
    module: str
    mutation: Mutation
    level: int
    caller: str                                  # the public function the issue is about
    failing: tuple[tuple[str, int], ...]         # (function, case index) pairs the bug breaks
    observed: tuple[str, str, str]               # (call, what the buggy code does, what it should)

    @property
    def key(self) -> str:
        """The bug's identity: what splits are disjoint by and what a split never repeats."""
        return f"{self.module}.{self.mutation.key}"


def task_bug(task: Task) -> str:
    """The ``Bug.key`` of a generated task (its id is ``swe/L<level>/<key>/<split>-<index>``)."""
    return task.id.split("/")[2]


@lru_cache(maxsize=512)
def _namespace(source: str) -> dict[str, Any]:
    """The module's globals, executed once (templates keep no state between calls)."""
    ns: dict[str, Any] = {}
    exec(compile(source, "module.py", "exec"), ns)
    return ns


def _run(source: str, func: str, args: list) -> tuple[bool, Any]:
    ns = _namespace(source)
    try:
        return True, ns[func](*copy.deepcopy(args))
    except Exception as e:  # noqa: BLE001 - a buggy template may raise anything; that is its behaviour
        return False, f"{type(e).__name__}: {e}"


def _call_text(func: str, args: list) -> str:
    return f"{func}({', '.join(repr(a) for a in args)})"


@lru_cache(maxsize=1)
def catalogue() -> tuple[Bug, ...]:
    """Every catalogued mutation of every template that is a real bug, with its level."""
    bugs: list[Bug] = []
    for name, tpl in sorted(TEMPLATES.items()):
        src, cases = tpl["source"], tpl["cases"]
        calls = callers(src)
        want = {(f, i): _run(src, f, a) for f, cs in cases.items() for i, a in enumerate(cs)}
        for m in mutations(src):
            buggy = m.apply(src)
            try:
                compile(buggy, "module.py", "exec")
            except SyntaxError:
                continue
            got = {k: _run(buggy, k[0], cases[k[0]][k[1]]) for k in want}
            failing = tuple(k for k in want if got[k] != want[k])
            if not failing or len(failing) == len(want):
                continue
            helper = m.function.startswith("_")
            if helper and not calls.get(m.function):
                continue
            level = 3 if helper else 1 if m.kind in ONE_TOKEN else 2
            # Levels 1-2 name the function: it must be the one that holds the bug (a public function
            # another public function calls breaks both; the issue is about its own failing call).
            own = [k for k in failing if helper or k[0] == m.function]
            if not own:
                continue
            f, i = own[0]
            ok, value = got[(f, i)]
            seen = repr(value) if ok else f"raises {value}"
            bugs.append(Bug(name, m, level, f, failing, (_call_text(f, cases[f][i]), seen, repr(want[(f, i)][1]))))
    return tuple(bugs)


def split_of(bug: Bug) -> str:
    bucket = int(hashlib.sha256(bug.key.encode()).hexdigest(), 16) % 10
    return next(s for s, r in BUCKETS.items() if bucket in r)


def _test_file(pkg: str, module: str, keep: set[tuple[str, int]] | None) -> str:
    """tests/test_<module>.py with every case (``keep`` None) or only the kept ones."""
    cases = TEMPLATES[module]["cases"]
    funcs = sorted(f for f in cases if keep is None or any(k[0] == f for k in keep))
    out = [f"from {pkg}.{module} import {', '.join(funcs)}\n"] if funcs else []
    src = TEMPLATES[module]["source"]
    for f in sorted(cases):
        for i, args in enumerate(cases[f]):
            if keep is not None and (f, i) not in keep:
                continue
            out.append(f"\n\ndef test_{f}_{i}():\n    assert {_call_text(f, args)} == {_run(src, f, args)[1]!r}\n")
    return "".join(out)


def _issue(bug: Bug, pkg: str, level: int) -> tuple[str, str]:
    call, seen, want = bug.observed
    seen = seen if seen.startswith("raises ") else f"gives `{seen}`"
    path = f"{pkg}/{bug.module}.py"
    if level <= 1:
        title = f"`{bug.caller}` in `{path}` returns a wrong result"
        body = f"`{bug.caller}` in `{path}` is wrong: `{call}` {seen}, but it should give `{want}`."
        if level == 0:   # the buggy line, as the repository the policy reads shows it
            text = bug.mutation.apply(TEMPLATES[bug.module]["source"]).splitlines()[bug.mutation.line - 1].strip()
            body += f" The wrong line is line {bug.mutation.line} of `{path}`: `{text}`."
    elif level == 2:
        title = f"`{bug.caller}` misbehaves"
        body = f"The function `{bug.caller}` does not do what it should: `{call}` {seen}; expected `{want}`."
    else:
        title = f"Wrong result from {pkg}.{bug.module}"
        body = (f"Using `{pkg}.{bug.module}`, running `from {pkg}.{bug.module} import {bug.caller}` and then `{call}` "
                f"{seen}. I expected `{want}`.")
    return title, body


def _sha(*parts: str) -> str:
    return hashlib.sha1("\0".join(parts).encode()).hexdigest()


def build_task(bug: Bug, split: str, index: int, seed: int, leaky: bool, level: int | None = None) -> Task:
    """The task of ``bug`` at ``level`` (default: the bug's own; 0 for a level-1 bug's line-naming issue)."""
    level = bug.level if level is None else level
    rng = random.Random(f"evotrainer-swe-{seed}-{split}-{index}")
    pkg = rng.choice(PACKAGES)
    others = rng.sample(sorted(set(TEMPLATES) - {bug.module}), 2)
    modules = sorted([bug.module, *others])
    clean = TEMPLATES[bug.module]["source"]
    buggy = bug.mutation.apply(clean)
    files = {f"{pkg}/__init__.py": f'"""{pkg}: small utilities ({", ".join(modules)})."""\n',
             "README.md": f"# {pkg}\n\nModules: {', '.join(modules)}. Tests live in `tests/` "
                          "(plain `test_*` functions with asserts).\n"}
    hidden_files, tests, f2p, p2p = {}, {}, [], []
    for mod in modules:
        files[f"{pkg}/{mod}.py"] = buggy if mod == bug.module else TEMPLATES[mod]["source"]
        cases = TEMPLATES[mod]["cases"]
        broken = set(bug.failing) if mod == bug.module else set()
        keep = {(f, i) for f in cases for i in range(len(cases[f]))} - broken
        files[f"tests/test_{mod}.py"] = _test_file(pkg, mod, keep)
        hidden_files[f"tests/test_{mod}.py"] = _test_file(pkg, mod, None)
        for f in sorted(cases):
            for i, args in enumerate(cases[f]):
                tid = f"tests/test_{mod}.py::test_{f}_{i}"
                tests[tid] = {"module": f"{pkg}.{mod}", "func": f, "args": args,
                              "want": _run(TEMPLATES[mod]["source"], f, args)[1]}
                (f2p if (f, i) in broken else p2p).append(tid)
    title, body = _issue(bug, pkg, level)
    path = f"{pkg}/{bug.module}.py"
    fix = diff_files({path: buggy}, {path: clean})
    init = _sha(pkg, *modules, str(index))
    history = [{"commit": init, "message": "Initial import", "diff": ""}]
    if leaky:
        history.append({"commit": _sha(init, fix), "message": f"Fix {bug.caller}: {title}", "diff": fix})
    tid = f"swe/L{level}/{bug.key}/{split}-{index}"
    prompt = f"Repository `{pkg}` has an open issue.\n\n## {title}\n\n{body}\n\nFix the bug with a patch."
    return Task(id=tid, prompt=prompt, answer=fix, split=split, domain="swe", difficulty=level,
                visible={"files": files, "history": history, "issue": body, "title": title, "package": pkg,
                         "leaky": leaky},
                hidden={"tests": tests, "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "test_files": hidden_files,
                        "bug": {"module": bug.module, "kind": bug.mutation.kind, "function": bug.mutation.function,
                                "line": bug.mutation.line, "before": bug.mutation.before,
                                "after": bug.mutation.after}})


def capacity(level: int, split: str) -> int:
    """How many distinct bugs of ``level`` the catalogue holds in ``split`` (levels 0 and 1 share theirs)."""
    return sum(1 for b in catalogue() if b.level == bug_level(level) and split_of(b) == split)


def _check_capacity(split: str, n: int, levels: list[int]) -> None:
    """Raises ValueError, before any repository is built, when ``n`` tasks over ``levels`` (taken in
    turn) need more bugs of a level than the split holds."""
    for lv in dict.fromkeys(map(bug_level, levels)):
        turns = [j for j, x in enumerate(levels) if bug_level(x) == lv]   # where lv's turns fall in one round
        full, rest = divmod(n, len(levels))
        need = full * len(turns) + sum(1 for j in turns if j < rest)
        have = capacity(lv, split)
        if need > have:
            rounds, r = divmod(have, len(turns))
            most = rounds * len(levels) + turns[r]               # the task that would take bug have+1
            raise ValueError(f"swe level {lv} holds {have} distinct bugs in the {split} split, but {n} {split} "
                             f"tasks over levels {levels} need {need} of them (a split never repeats a bug); "
                             f"ask for at most {most} (domain.n_{split}), or choose or add another level "
                             "(domain.difficulty)")


def make_split(split: str, n: int, levels: list[int], seed: int, leak_share: float = 0.0) -> list[Task]:
    """``n`` tasks of one split, levels taken in turn, each task a distinct bug in a fresh repository
    (ValueError when a level has too few bugs in the split); the leak only ever reaches train. Levels
    0 and 1 draw from one pool of bugs, so a split holding both still never repeats a bug."""
    levels = split_levels(split, levels)
    if not levels:
        raise ValueError(f"swe levels {TRAIN_ONLY} are train-only rungs: the {split} split needs a level of "
                         "1-3 among domain.difficulty")
    _check_capacity(split, n, levels)
    pools = {lv: [b for b in catalogue() if b.level == lv and split_of(b) == split]
             for lv in dict.fromkeys(map(bug_level, levels))}
    rng = random.Random(f"evotrainer-swe-order-{seed}-{split}")
    for pool in pools.values():
        rng.shuffle(pool)
    taken = {lv: 0 for lv in pools}
    out = []
    for i in range(n):
        lv = levels[i % len(levels)]
        bug = pools[bug_level(lv)][taken[bug_level(lv)]]
        taken[bug_level(lv)] += 1
        leaky = split == "train" and rng.random() < leak_share
        out.append(build_task(bug, split, i, seed, leaky, lv))
    return out
