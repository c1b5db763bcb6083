"""The engine's validity check on code branches: a branch whose completions game the grader is invalid."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evotrainer.domains.code.domain import CodeDomain
from evotrainer.domains.code.executor import ExecLimits
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


# -- tamper: batched re-verification, and timeouts are not evidence of an edit -----------------------

class CountingCodeDomain(CodeDomain):
    """A real code domain that counts how the tamper check grades."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.batches, self.singles = [], 0

    def verify(self, task, completion):
        self.singles += 1
        return super().verify(task, completion)

    def verify_batch(self, tasks, completions):
        self.batches.append(len(tasks))
        return super().verify_batch(tasks, completions)


def _slow(task, seconds):
    """The task's reference solution, after sleeping ``seconds`` per call."""
    head, body = task.answer.split("\n", 1)
    return f"```python\nimport time\n{head}\n    time.sleep({seconds})\n{body}```"


def _tamper_check(domain, train, heldout, heldout_base=()):
    v = CachedVersion(path=None, meta=None, program=reference_program(), train=list(train),
                      heldout=list(heldout), heldout_base=list(heldout_base), domain=domain,
                      tasks={t.id: t for s in ("train", "heldout", "test") for t in domain.tasks(s)})
    return next(c for c in engine_checks(v, SimpleNamespace(engine={}), GateConfig()) if c.name == "tamper")


def test_tamper_regrades_each_split_in_one_batch(domain):
    counting = CountingCodeDomain(n_train=4, n_heldout=4, n_test=1, difficulty=1, seed=2, workers=2)
    try:
        train, held = counting.tasks("train"), counting.tasks("heldout")
        rollouts = _rollouts(domain, train + held + held, [f"```python\n{t.answer}```" for t in train + held + held])
        check = _tamper_check(counting, rollouts[:4], rollouts[4:8], rollouts[8:])
        assert check.passed and check.numbers["reverified"] == 12 and check.numbers["mismatches"] == 0
        assert counting.batches == [4, 4, 4] and counting.singles == 0
    finally:
        counting.close()


def test_an_edited_verdict_is_still_a_mismatch(domain):
    train, held = domain.tasks("train"), domain.tasks("heldout")
    wrong = f"```python\n{held[0].visible['header'].splitlines()[0]}\n    return None\n```"
    rollouts = _rollouts(domain, train + held[:1], [f"```python\n{t.answer}```" for t in train] + [wrong])
    assert not rollouts[-1].hidden["correct"] and "wrong_answer" in rollouts[-1].hidden["verdicts"]
    rollouts[-1].hidden = {**rollouts[-1].hidden, "correct": True}  # the edit
    check = _tamper_check(domain, rollouts[:4], rollouts[4:])
    assert not check.passed and check.numbers["mismatches"] == 1 and check.numbers["not_rejudged"] == 0
    assert "heldout:0 stored correct=True but the verifier says correct=False" in check.message


def test_the_tamper_line_names_the_field_that_differs(domain):
    """An edited format_ok on a wrong answer: the line used to say "stored correct=False but verifier
    says False", printing the one field that agreed."""
    held = domain.tasks("heldout")
    wrong = f"```python\n{held[0].visible['header'].splitlines()[0]}\n    return None\n```"
    rollouts = _rollouts(domain, held[:1], [wrong])
    assert not rollouts[0].hidden["correct"] and rollouts[0].hidden["format_ok"]
    rollouts[0].hidden = {**rollouts[0].hidden, "format_ok": False}  # the edit
    check = _tamper_check(domain, [], rollouts)
    assert not check.passed and check.numbers["mismatches"] == 1
    assert "heldout:0 stored format_ok=False but the verifier says format_ok=True" in check.message
    assert "correct=" not in check.message


@pytest.fixture(scope="module")
def loaded():
    """The same tasks graded under load: a per-test limit a slow-but-correct program overruns."""
    d = CodeDomain(n_train=4, n_heldout=4, n_test=1, difficulty=1, seed=2, workers=2,
                   limits=ExecLimits(timeout_s=0.3))
    yield d
    d.close()


def test_a_pass_that_times_out_on_regrading_is_not_rejudged(domain, loaded):
    held = domain.tasks("heldout")
    rollouts = _rollouts(domain, held[:2], [_slow(held[0], 0.5), f"```python\n{held[1].answer}```"])
    assert rollouts[0].hidden["correct"]  # under the normal limit it passes
    again = loaded.verify(held[0], rollouts[0].completion)
    assert not again["correct"] and "timeout" in again["verdicts"]
    check = _tamper_check(loaded, [], rollouts)
    assert check.passed and check.numbers["mismatches"] == 0 and check.numbers["not_rejudged"] == 1
    assert "1 not re-judged" in check.message and "heldout:0" in check.message


def test_a_stored_timeout_that_passes_on_regrading_is_not_rejudged(domain, loaded):
    train = domain.tasks("train")
    rollouts = _rollouts(loaded, train[:1], [_slow(train[0], 0.5)])
    assert not rollouts[0].visible["correct"] and "timeout" in rollouts[0].visible["verdicts"]
    check = _tamper_check(domain, rollouts, [])
    assert check.passed and check.numbers["not_rejudged"] == 1 and check.numbers["reverified"] == 1


def test_a_timeout_does_not_excuse_a_format_edit(domain, loaded):
    held = domain.tasks("heldout")
    rollouts = _rollouts(domain, held[:1], [_slow(held[0], 0.5)])
    rollouts[0].hidden = {**rollouts[0].hidden, "format_ok": False}  # the edit
    check = _tamper_check(loaded, [], rollouts)
    assert not check.passed and check.numbers["mismatches"] == 1 and check.numbers["not_rejudged"] == 0
