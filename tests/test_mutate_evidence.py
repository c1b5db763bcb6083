"""`evotrainer mutate --evidence` reads a health report as a health report, through the real command line.

A version's ``health.json`` has a ``history`` field of its own (the per-step metrics), so a file is an
evidence wrapper only when it has ``health_report``. The math report here is written by the engine's own
``health_report`` on a version dir whose groups are dead; the SWE one is the seed's report from a real
``evolve`` run on SWE (every call malformed), kept as a fixture."""

from __future__ import annotations

import json

import pytest

from evotrainer.fitness.cache import write_version
from evotrainer.fitness.health import health_report
from evotrainer.loop.seed import DOMAIN_HARNESSES
from evotrainer.operators.evidence import Evidence
from evotrainer.records.rollout import Rollout
from tests.cli_process import REFERENCE, ROOT, cli

SWE_REPORT = ROOT / "tests" / "fixtures" / "health_report_swe_seed.json"
SWE_HARNESS = DOMAIN_HARNESSES["swe"]


def dead_math_version(path):
    """Two steps of 4 groups of 4, every reward 0 (a wrong number each), and a held-out split."""
    train = [Rollout(task_id=f"t{g}", messages=[{"role": "user", "content": f"What is {g} + 2?"}],
                     completion="Answer: 7", logprobs=[-1.5, -0.7], seed=i, group=g, step=step, split="train",
                     visible={"correct": False, "format_ok": True}, reward=0.0)
             for step in range(2) for g in range(4) for i in range(4)]
    held = [Rollout(task_id=f"h{k}", messages=[{"role": "user", "content": "What is 1 + 1?"}], completion="3",
                    seed=0, split="heldout", hidden={"correct": k == 0}) for k in range(6)]
    return write_version(path, train, held)


@pytest.fixture(scope="module")
def math_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("math")
    report = health_report(dead_math_version(root / "v0001"), window=1)
    path = root / "health.json"
    path.write_text(report.to_json())
    return path


def mutate(tmp_path, harness, evidence, operator="library"):
    r = cli(["mutate", harness, "--operator", operator, "--evidence", evidence], tmp_path)
    return r, (json.loads(r.stdout) if r.returncode == 0 else None)


def test_a_real_math_health_json_gets_a_proposal_that_answers_its_alert(tmp_path, math_report):
    report = json.loads(math_report.read_text())
    assert report["history"], "the report carries its per-step history (the field that hid it before)"
    assert report["engine"]["dead_group_ratio"] == 1.0
    assert "insufficient_signal" in {a["name"] for a in report["alerts"]}
    r, iv = mutate(tmp_path, REFERENCE, math_report)
    assert r.returncode == 0, r.stderr
    assert "insufficient_signal" in iv["evidence"]["alerts"]
    # Every entry that fires on a fully dead report moves the signal: its expectation names a signal metric.
    assert iv["expected_effect"]["metric"] in {"dead_group_ratio", "reward_spread", "reward_std",
                                               "train_reward_std", "truncation_rate"} or iv["factor"].startswith(
        ("hook:reward", "hook:keep_groups", "hook:select_tasks", "knob:num_generations", "knob:temperature"))


def test_a_real_swe_health_json_with_malformed_calls_gets_a_proposal(tmp_path):
    report = json.loads(SWE_REPORT.read_text())
    assert "history" in report and report["metrics"]["malformed_call_rate"] == 1.0
    r, iv = mutate(tmp_path, SWE_HARNESS, SWE_REPORT)
    assert r.returncode == 0, r.stderr
    assert {"tool_failures", "insufficient_signal"} <= set(iv["evidence"]["alerts"])
    # The report's critical alerts point at the call form: the answer moves calls, not the task mix.
    assert iv["expected_effect"]["metric"] in {"malformed_call_rate", "tool_failure_rate", "valid_call_rate",
                                               "dead_group_ratio", "train_valid_call_rate"}, iv


def test_the_wrapper_is_read_with_its_fields(tmp_path, math_report):
    report = json.loads(math_report.read_text())
    wrapper = tmp_path / "wrapper.json"
    wrapper.write_text(json.dumps({"health_report": report, "history": [], "skills": [], "known_hashes": []}))
    r, iv = mutate(tmp_path, REFERENCE, wrapper)
    assert r.returncode == 0, r.stderr
    assert "insufficient_signal" in iv["evidence"]["alerts"]
    only = tmp_path / "only.json"
    only.write_text(json.dumps({"health_report": report}))
    r, iv2 = mutate(tmp_path, REFERENCE, only)
    assert r.returncode == 0 and iv2["evidence"]["alerts"] == iv["evidence"]["alerts"]


def test_a_hand_written_report_of_metrics_only(tmp_path):
    bare = tmp_path / "metrics.json"
    bare.write_text(json.dumps({"metrics": {"dead_group_ratio": 0.9, "reward_spread": 0.01, "correct_rate": 0.05}}))
    r, iv = mutate(tmp_path, REFERENCE, bare)
    assert r.returncode == 0, r.stderr
    assert iv["operator"] == "library"


@pytest.mark.parametrize("content", ['{}', '{"skills": [], "history": []}', '{"notes": "dead groups"}'])
def test_a_file_that_is_neither_is_named(tmp_path, content):
    bad = tmp_path / "ev.json"
    bad.write_text(content)
    r, _ = mutate(tmp_path, REFERENCE, bad)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert str(bad) in r.stderr and "neither a health report" in r.stderr and "'health_report'" in r.stderr


def test_an_empty_report_is_said_to_be_empty_not_read(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text('{"health_report": {}}')
    r, _ = mutate(tmp_path, REFERENCE, empty)
    assert r.returncode == 1
    reason = json.loads(r.stderr.strip().splitlines()[-1])["reason"]
    assert "no health report" in reason and "no trigger holds" not in reason
    r, iv = mutate(tmp_path, REFERENCE, empty, operator="random_library")   # the named way without a report
    assert r.returncode == 0, r.stderr


def test_evidence_from_dict_tells_the_shapes_apart():
    report = {"version": "v1", "metrics": {"dead_group_ratio": 1.0}, "history": [{"dead_group_ratio": 1.0}],
              "alerts": [{"name": "insufficient_signal", "severity": "critical", "message": "m"}]}
    ev = Evidence.from_dict(report)
    assert ev.health_report is report and ev.history == [] and ev.has_report()
    wrapped = Evidence.from_dict({"health_report": report, "history": [{"factor": "knob:beta"}]})
    assert wrapped.health_report is report and wrapped.history == [{"factor": "knob:beta"}]
    assert not Evidence.from_dict({"health_report": {}}).has_report()
    with pytest.raises(ValueError, match="neither a health report"):
        Evidence.from_dict({"skills": []})
