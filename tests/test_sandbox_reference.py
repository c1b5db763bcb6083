"""The reference harness through the Harness facade, in the sandbox and in-process, on real Rollouts."""

from __future__ import annotations

import numpy as np
import pytest

from evotrainer.domains.task import Task
from evotrainer.genome import Harness, HarnessProgram, SandboxError, check_contract, reference_program
from evotrainer.records.rollout import Rollout, group_rollouts

CORRECT = [[1, 1, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0]]


def batch():
    rollouts, tasks = [], []
    for g, row in enumerate(CORRECT):
        task = Task(id=f"t{g}", prompt=f"{g} + 1 = ?", answer=str(g + 1), split="train", domain="math",
                    hidden={"tests": ["secret"]})
        for k, c in enumerate(row):
            n = 10 * (k + 1)
            rollouts.append(Rollout(task_id=task.id, messages=task.messages(), completion=str(g + 1 if c else 0),
                                    completion_ids=list(range(n)), logprobs=[-0.2] * n, truncated=k == 3,
                                    group=g, visible={"correct": bool(c), "format_ok": k < 2, "extracted": "x"},
                                    hidden={"correct": bool(c), "answer": str(g + 1)}))
            tasks.append(task)
    return rollouts, tasks


@pytest.fixture(scope="module")
def sandboxed():
    with Harness() as h:
        yield h


def expected_grpo(rewards):
    out = []
    for rs in rewards:
        rs = np.asarray(rs, dtype=float)
        out.append(((rs - rs.mean()) / (rs.std(ddof=1) + 1e-4)).tolist())  # sample std, as TRL
    return out


def test_reference_in_the_sandbox_gives_grpo_advantages_and_metrics(sandboxed):
    rollouts, tasks = batch()
    groups = group_rollouts(rollouts)
    rewards = sandboxed.reward(rollouts, tasks)
    assert rewards == [float(c) for row in CORRECT for c in row]
    assert sandboxed.keep_groups(groups) == [True] * 4
    per_group = [rewards[4 * g: 4 * g + 4] for g in range(4)]
    adv = sandboxed.advantages(groups, per_group)
    assert np.allclose(adv, expected_grpo(per_group), atol=1e-12)
    assert adv[0] == [0.0] * 4 and adv[1][0] == pytest.approx(0.5 / (np.std([1, 0, 1, 0], ddof=1) + 1e-4))

    rds = [r.for_harness() for r in rollouts]
    for d, r, a in zip(rds, rewards, [a for row in adv for a in row]):
        d["reward"], d["advantage"] = r, a
    m = sandboxed.metrics(rds, [rds[4 * g: 4 * g + 4] for g in range(4)])
    flat = np.array(rewards)
    stds = [np.std(rs) for rs in per_group]
    lengths = [len(r.completion_ids) for r in rollouts]
    assert m["reward_mean"] == pytest.approx(flat.mean()) and m["reward_std"] == pytest.approx(flat.std())
    assert m["correct_rate"] == pytest.approx(7 / 16)
    assert m["dead_group_ratio"] == pytest.approx(0.5)  # all-correct and all-wrong groups
    assert m["reward_spread"] == pytest.approx(np.mean(stds))
    assert m["response_length_p50"] == pytest.approx(np.percentile(lengths, 50))
    assert m["response_length_p90"] == pytest.approx(np.percentile(lengths, 90))
    assert m["truncation_rate"] == pytest.approx(0.25) and m["format_compliance"] == pytest.approx(0.5)
    assert m["mean_logprob"] == pytest.approx(-0.2)

    assert sandboxed.alerts(m, []) == [{
        "name": "insufficient_signal", "severity": "warning",
        "message": "50% of groups have no reward variance (dead groups)",
        "suggestion": "make the reward more continuous or add an auxiliary signal; or filter dead groups"}]
    assert sandboxed.validity(rds, m, []) == []


def test_alert_rules_of_the_reference(sandboxed):
    def names(found):
        return {(f["name"], f["severity"]) for f in found}

    m = {"dead_group_ratio": 0.6, "reward_spread": 0.01, "mean_logprob": -0.01}
    assert names(sandboxed.alerts(m, [])) == {("insufficient_signal", "critical"), ("weak_reward_spread", "warning"),
                                             ("exploration_collapse", "critical")}
    history = [{"reward_mean": 0.1 * i, "correct_rate": 0.2} for i in range(3)]
    hacked = {"reward_mean": 0.4, "correct_rate": 0.2, "dead_group_ratio": 0.0, "reward_spread": 0.3}
    assert names(sandboxed.alerts(hacked, history)) == {("reward_hacking", "critical")}
    honest = dict(hacked, correct_rate=0.4)
    assert sandboxed.alerts(honest, history) == []


def test_in_process_and_sandboxed_reference_agree(sandboxed):
    rollouts, tasks = batch()
    groups = group_rollouts(rollouts)
    local = Harness(sandbox=False)
    assert local.reward(rollouts, tasks) == sandboxed.reward(rollouts, tasks)
    rewards = [[float(c) for c in row] for row in CORRECT]
    assert local.advantages(groups, rewards) == sandboxed.advantages(groups, rewards)
    assert local.metrics(rollouts, groups) == sandboxed.metrics(rollouts, groups)


def test_hidden_outcomes_never_reach_the_harness():
    spy = HarnessProgram(
        "def reward(rollouts, tasks):\n"
        "    return [1.0 if 'hidden' in r or 'answer' in t or 'hidden' in t else 0.0\n"
        "            for r, t in zip(rollouts, tasks)]\n")
    rollouts, tasks = batch()
    with Harness(spy) as h:
        assert h.reward(rollouts, tasks) == [0.0] * len(rollouts)
        assert h.reward([r.to_dict() for r in rollouts], [t.to_dict() for t in tasks]) == [0.0] * len(rollouts)


def test_missing_hooks_fall_back_to_the_reference_in_the_sandbox():
    partial = HarnessProgram(
        "KNOBS = {'temperature': {'value': 0.7, 'range': [0.3, 1.5]}, 'scale_rewards': {'value': 'none', "
        "'choices': ['group', 'batch', 'none']}}\n\n"
        "def reward(rollouts, tasks):\n    return [0.5 for r in rollouts]\n")
    rollouts, tasks = batch()
    groups = group_rollouts(rollouts)
    with Harness(partial) as h:
        assert h.reward(rollouts, tasks) == [0.5] * 16
        assert h.keep_groups(groups) == [True] * 4  # reference
        assert h.metrics(rollouts, groups)["correct_rate"] == pytest.approx(7 / 16)  # reference
        # The reference advantages hook follows the genome's knobs (scale_rewards="none" here).
        assert h.advantages(groups, [[1.0, 0.0, 1.0, 0.0]] * 4)[1] == [0.5, -0.5, 0.5, -0.5]
    assert h.knob_values["temperature"] == 0.7 and h.knob_values["learning_rate"] == 1e-04


def test_scale_rewards_knob_drives_the_reference_advantages():
    rollouts, _ = batch()
    groups = group_rollouts(rollouts)
    rewards = [[float(c) for c in row] for row in CORRECT]
    none = Harness(reference_program().with_knobs(scale_rewards="none"), sandbox=False)
    assert none.advantages(groups, rewards)[1] == [0.5, -0.5, 0.5, -0.5]
    batch_std = np.std(np.array(rewards).ravel(), ddof=1)
    scaled = Harness(reference_program().with_knobs(scale_rewards="batch"), sandbox=False)
    assert scaled.advantages(groups, rewards)[1][0] == pytest.approx(0.5 / (batch_std + 1e-4))


def test_facade_rejects_bad_results_and_contract_failures():
    with pytest.raises(SandboxError) as info:
        Harness(HarnessProgram("import os\n"))
    assert info.value.kind == "contract"
    nan = HarnessProgram("def metrics(rollouts, groups):\n    return {'x': float('nan')}\n")
    rollouts, _ = batch()
    with Harness(nan) as h, pytest.raises(SandboxError) as info:
        h.metrics(rollouts, group_rollouts(rollouts))
    assert info.value.kind == "bad_result" and "metrics['x'] is nan" in str(info.value)


def test_a_well_behaved_numpy_harness_is_not_refused():
    """The guards must not break ordinary harness code: allowed imports (also lazy numpy
    submodules), numpy warnings, prints (captured), closures, caches, regexes."""
    program = HarnessProgram('''
import collections
import functools
import itertools
import re
import statistics

import numpy as np

ANSWER = re.compile(r"answer is (-?\\d+)")


@functools.lru_cache(maxsize=None)
def _weight(n):
    return 1.0 / (1 + n)


def reward(rollouts, tasks):
    import numpy.polynomial  # not loaded before: imported lazily inside the sandbox
    rng = np.random.default_rng(0)
    counts = collections.Counter(r["task_id"] for r in rollouts)
    lengths = [len(r["completion_ids"]) for r in rollouts]
    print("median length", statistics.median(lengths))
    np.mean(np.array([]))  # RuntimeWarning, written to the captured stderr
    pairs = list(itertools.pairwise(lengths))
    out = []
    for r in rollouts:
        m = ANSWER.search(r["completion"])
        base = 1.0 if r["visible"].get("correct") else 0.0
        bonus = 0.0 * rng.random() * _weight(counts[r["task_id"]]) * len(pairs)
        out.append(base + bonus + float(np.polynomial.polynomial.polyval(0.0, [0.0, 1.0])) * (m is None))
    return np.asarray(out)
''')
    check_contract(program)
    rollouts, tasks = batch()
    with Harness(program) as h:
        assert h.reward(rollouts, tasks) == [float(c) for row in CORRECT for c in row]
        assert "median length" in h.sandbox.last_output and "RuntimeWarning" in h.sandbox.last_output
