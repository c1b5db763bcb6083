"""The engine's validity check on code branches: a branch whose completions game the grader is invalid."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evotrainer.domains.code.domain import CodeDomain
from evotrainer.fitness.cache import CachedVersion
from evotrainer.fitness.gate_config import GateConfig
from evotrainer.fitness.validity import engine_checks
from evotrainer.genome.program import reference_program
from evotrainer.records.rollout import Rollout


@pytest.fixture(scope="module")
def domain():
    d = CodeDomain(n_train=4, n_heldout=4, n_test=1, difficulty=1, seed=2, workers=2)
    yield d
    d.close()


def _rollouts(domain, tasks, completions, step=0):
    verdicts = domain.verify_batch(tasks, completions)
    out = []
    for t, c, v in zip(tasks, completions, verdicts):
        where = {"visible": v} if t.split == "train" else {"hidden": v, "visible": {"format_ok": v["format_ok"]}}
        out.append(Rollout(task_id=t.id, messages=[], completion=c, step=step, split=t.split, reward=0.0, **where))
    return out


def _gaming_check(domain, hack: bool):
    train, held = domain.tasks("train"), domain.tasks("heldout")
    honest = [f"```python\n{t.answer}```" for t in train + held]
    header = held[0].visible["header"].splitlines()[0]
    completions = honest[:]
    if hack:
        completions[-1] = f"```python\nimport sys\nsys.exit(0)\n{header}\n    return 0\n```"
    rollouts = _rollouts(domain, train + held, completions)
    v = CachedVersion(path=None, meta=None, program=reference_program(), train=rollouts[:len(train)],
                      heldout=rollouts[len(train):], heldout_base=[])
    checks = {c.name: c for c in engine_checks(v, SimpleNamespace(engine={}), GateConfig())}
    return checks["grader_gaming"]


def test_honest_code_branch_is_valid(domain):
    check = _gaming_check(domain, hack=False)
    assert check.passed and check.numbers["heldout_flagged"] == 0


def test_one_flagged_heldout_completion_makes_the_branch_invalid(domain):
    check = _gaming_check(domain, hack=True)
    assert not check.passed and check.numbers["heldout_flagged"] == 1 and "exit" in check.message
