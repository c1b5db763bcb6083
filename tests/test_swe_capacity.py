"""SWE bug capacity: how many distinct bugs each level holds per split, that a split never repeats
one (and says so when it cannot fill its size), and that every level-1 bug is what level 1 means and
is real under the real grader (its FAIL_TO_PASS tests fail before the reference fix, all pass after)."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

import pytest

from evotrainer.config import load_config
from evotrainer.domains import build_domain
from evotrainer.domains.code.executor import ExecLimits
from evotrainer.domains.swe.domain import SWEDomain
from evotrainer.domains.swe.generator import build_task, capacity, catalogue, make_split, split_of, task_bug
from evotrainer.domains.swe.patching import diff_files
from evotrainer.domains.swe.scripted import L1_RE
from evotrainer.domains.swe.templates import TEMPLATES

SPLITS = ("train", "heldout", "test")
ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "benchmarks/configs/suite/swe_1.yaml"


def _tokens(line: str) -> list[str]:
    return [t.string for t in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline)]


@pytest.mark.parametrize("seed", [0, 46])
def test_the_suite_config_draws_distinct_bugs_in_every_split(seed):
    cfg = load_config(SUITE)
    cfg.domain.seed = seed
    d = build_domain(cfg.domain)
    keys = {s: [task_bug(t) for t in d.tasks(s)] for s in SPLITS}
    assert len(keys["test"]) == len(set(keys["test"])) == 24
    assert all(len(set(k)) == len(k) for k in keys.values())               # held-out and train too
    assert not set(keys["train"]) & set(keys["heldout"]) and not set(keys["heldout"]) & set(keys["test"])
    assert not set(keys["train"]) & set(keys["test"])


def test_level_1_holds_enough_distinct_bugs_in_each_split():
    held = {s: capacity(1, s) for s in SPLITS}
    assert held["test"] >= 32 and held["heldout"] >= 32 and held["train"] >= 128   # the config's default sizes
    assert sum(held.values()) == sum(1 for b in catalogue() if b.level == 1)
    assert len({b.key for b in catalogue()}) == len(catalogue())                   # a key is one bug


def test_a_split_larger_than_its_bugs_is_refused_with_the_way_out():
    have = capacity(1, "test")
    tasks = make_split("test", have, [1], seed=0)                # the bound is exact: every bug once
    assert len({task_bug(t) for t in tasks}) == have
    with pytest.raises(ValueError, match=rf"level 1 holds {have} distinct bugs in the test split.*"
                                         rf"ask for at most {have} \(domain.n_test\).*another level"):
        make_split("test", have + 1, [1], seed=0)
    with pytest.raises(ValueError, match="in the heldout split.*domain.n_heldout"):
        SWEDomain(n_train=1, n_heldout=capacity(1, "heldout") + 1, n_test=1, difficulty=1)
    # Levels in turn, a level listed twice included: its two turns take two different bugs.
    mixed = make_split("train", 9, [1, 1, 2], seed=0)
    assert len({task_bug(t) for t in mixed}) == 9 and [t.difficulty for t in mixed[:3]] == [1, 1, 2]


def test_every_level_1_bug_names_file_and_function_and_is_fixed_by_one_token():
    for i, bug in enumerate(b for b in catalogue() if b.level == 1):
        t = build_task(bug, split_of(bug), i, seed=0, leaky=False)
        path = f"{t.visible['package']}/{bug.module}.py"
        assert f"`{path}`" in t.prompt and f"`{bug.mutation.function}`" in t.prompt, bug.key
        assert L1_RE.search(t.visible["issue"]), bug.key          # the scripted honest policy reads it
        removed = [ln[1:] for ln in t.answer.splitlines() if ln.startswith("-") and not ln.startswith("---")]
        added = [ln[1:] for ln in t.answer.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
        assert len(removed) == len(added) == 1, bug.key
        before, after = _tokens(removed[0]), _tokens(added[0])
        assert len(before) == len(after) and sum(a != b for a, b in zip(before, after)) == 1, bug.key


def test_every_level_1_test_bug_fails_before_the_fix_and_passes_after_under_the_real_grader():
    """The test split's level-1 bugs, plus one level-1 bug of each template the test split lacks,
    graded as a policy's patch is: the buggy repository (a README-only patch) fails exactly its
    FAIL_TO_PASS tests; the reference fix resolves it."""
    level1 = [b for b in catalogue() if b.level == 1]
    bugs = [b for b in level1 if split_of(b) == "test"]
    bugs += [next(b for b in level1 if b.module == m) for m in sorted(TEMPLATES) if m not in {b.module for b in bugs}]
    assert {b.module for b in bugs} == set(TEMPLATES)
    tasks = [build_task(b, "test", i, seed=0, leaky=False) for i, b in enumerate(bugs)]
    untouched = [diff_files(t.visible["files"], {**t.visible["files"], "README.md": t.visible["files"]["README.md"] + "\n"})
                 for t in tasks]
    d = SWEDomain(n_train=1, n_heldout=1, n_test=1, difficulty=1, workers=2, limits=ExecLimits(timeout_s=5.0))
    try:
        verdicts = d.verify_batch(tasks + tasks, untouched + [t.answer for t in tasks])
    finally:
        d.close()
    for t, before, after in zip(tasks, verdicts[: len(tasks)], verdicts[len(tasks):]):
        assert before["patch_applied"] and not before["resolved"], t.id
        assert not any(r["passed"] for r in before["fail_to_pass"].values()), t.id
        assert all(r["passed"] for r in before["pass_to_pass"].values()), t.id
        assert after["resolved"] and after["passed"] == after["total"], t.id


def test_the_swe_page_states_the_capacities():
    page = (ROOT / "docs/domains/swe.md").read_text(encoding="utf-8").replace("\n  ", " ")
    assert f"3 modules from {len(TEMPLATES)} templates" in page
    for level in (1, 2, 3):
        counts = " / ".join(str(capacity(level, s)) for s in SPLITS)
        assert f"level {level}: {counts}" in page, counts
