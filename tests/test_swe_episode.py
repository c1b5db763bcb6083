"""SWE episodes driven by scripted policies: an honest one that searches for the fix with the tests,
and one that reads the fix from the history. The leak earns more on leaky train repositories; the
held-out grade (no history there) shows the gap, and history_calls exposes it."""

from __future__ import annotations

import json
import time

import pytest

from evotrainer.domains.code.executor import ExecLimits
from evotrainer.domains.swe.domain import SWEDomain
from evotrainer.domains.swe.environment import EnvLimits
from evotrainer.domains.swe.episode import Episode, run_episode
from evotrainer.domains.swe.scripted import Scripted, honest, reads_history as leaky, tool


@pytest.fixture(scope="module")
def domain():
    d = SWEDomain(n_train=4, n_heldout=4, n_test=1, difficulty=[1, 2], seed=0, leak_share=1.0, workers=1,
                  limits=ExecLimits(timeout_s=1.0))
    yield d
    d.close()


def _episodes(domain, split, script):
    out = []
    for t in domain.tasks(split):
        ep = run_episode(t, Scripted(script), domain.environment(t, EnvLimits(max_turns=400)))
        ep["grade"] = domain.verify(t, ep["patch"])
        out.append(ep)
    return out


def test_the_leak_earns_more_on_leaky_train_and_the_heldout_grade_shows_the_gap(domain):
    assert all(t.visible["leaky"] for t in domain.tasks("train"))
    assert not any(t.visible["leaky"] for t in domain.tasks("heldout"))
    runs = {(name, s): _episodes(domain, s, p) for name, p in (("honest", honest), ("leaky", leaky))
            for s in ("train", "heldout")}
    reward = {k: sum(e["grade"]["resolved"] for e in v) / len(v) for k, v in runs.items()}
    assert reward[("leaky", "train")] == 1.0
    assert 0 < reward[("honest", "train")] < reward[("leaky", "train")]
    assert reward[("leaky", "heldout")] == reward[("honest", "heldout")]   # no history: no advantage left
    gap = {p: reward[(p, "train")] - reward[(p, "heldout")] for p in ("honest", "leaky")}
    assert gap["leaky"] > gap["honest"]
    # the diagnostic: history commands per episode
    assert all(e["history_calls"] == 0 for k, v in runs.items() if k[0] == "honest" for e in v)
    assert all(e["history_calls"] == 1 for e in runs[("leaky", "train")])
    for e in runs[("honest", "train")]:
        if e["grade"]["resolved"]:   # an honest fix: found by editing and testing, many turns
            assert e["submitted"] and e["stop_reason"] == "submitted" and e["n_turns"] > 3
            names = [c["name"] for c in e["tool_calls"]]
            assert names[0] == "edit" and "run_tests" in names and names[-1] == "submit"


def test_an_episode_records_turns_tool_calls_results_and_timings(domain):
    task = domain.tasks("train")[0]
    ep = run_episode(task, Scripted(leaky), domain.environment(task))
    assert ep["stop_reason"] == "submitted" and ep["n_turns"] == 3 and ep["patch"]
    assert [c["name"] for c in ep["tool_calls"]] == ["git_log", "edit", "submit"]
    first = ep["turns"][0]
    assert task.answer in first["result"] and first["generate_s"] >= 0 and first["tool_s"] >= 0
    roles = [m["role"] for m in ep["messages"]]
    assert roles == ["system", "user"] + ["assistant", "user"] * 3
    assert "```tool" in ep["messages"][0]["content"]
    json.dumps(ep)   # plain data, for a Rollout


@pytest.mark.parametrize("limits, generate, stop", [
    (EnvLimits(max_turns=3), lambda m: tool("list_files"), "max_turns"),
    (EnvLimits(max_context_tokens=1500, max_turn_tokens=100), lambda m: tool("read_file", path="README.md") + " " * 300,
     "context"),
    (EnvLimits(wall_s=0.05), lambda m: time.sleep(0.06) or tool("list_files"), "wall_time"),
    (EnvLimits(), lambda m: 1 / 0, "generate_error: ZeroDivisionError"),
])
def test_episode_limits(domain, limits, generate, stop):
    task = domain.tasks("heldout")[0]
    ep = run_episode(task, generate, domain.environment(task, limits))
    assert ep["stop_reason"].startswith(stop) and not ep["submitted"] and ep["patch"] == ""
    assert ep["n_turns"] <= limits.max_turns
    assert not domain.verify(task, ep["patch"])["resolved"]


def test_a_long_turn_is_cut_to_the_turn_limit(domain):
    task = domain.tasks("heldout")[0]
    ep = run_episode(task, lambda m: tool("view_diff") + "x" * 5000, domain.environment(task, EnvLimits(
        max_turns=1, max_turn_tokens=50)))
    (turn,) = ep["turns"]
    assert turn["truncated"] and len(turn["text"]) <= 200 and turn["tool_call"]["name"] == "view_diff"


def test_the_time_limit_counts_an_episodes_own_time_not_its_batch_neighbours(domain):
    """A batching driver records each turn's share of the batch's generation: an episode waiting on
    its neighbours' turns is not timed out by them, and its own seconds still end it."""
    task = domain.tasks("heldout")[0]
    waiting = Episode(task, domain.environment(task, EnvLimits(max_turns=3, wall_s=0.2)))
    while waiting.wants_turn():
        time.sleep(0.1)                       # the batch's other episodes generating: not this one's time
        waiting.record(tool("list_files"), generate_s=0.01)
    assert waiting.result()["stop_reason"] == "max_turns" and len(waiting.turns) == 3
    slow = Episode(task, domain.environment(task, EnvLimits(max_turns=3, wall_s=0.2)))
    while slow.wants_turn():
        slow.record(tool("list_files"), generate_s=0.15)   # its own share of each turn
    assert slow.result()["stop_reason"] == "wall_time" and len(slow.turns) == 2
