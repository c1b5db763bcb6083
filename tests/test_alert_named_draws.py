"""The diagnosis steers the no-LLM draws: a knob the health report's alerts name is likelier to be drawn,
by the knobs operator and by a library entry that moves it, most of all when the alert is critical.

On SWE the reference harness's alerts name the guided-call knobs when calls are malformed, since no
other change can show an effect then: every episode's calls reach no tool. The draws below are the real
operators on the real reference SWE harness, its alerts computed in the sandbox."""

from __future__ import annotations

import pytest

from evotrainer.genome.harness import Harness
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.seed import DOMAIN_HARNESSES
from evotrainer.operators.evidence import NAMED_WEIGHT, Evidence
from evotrainer.operators.knobs import KnobOperator
from evotrainer.operators.library import LibraryOperator

GUIDED_KNOBS = {"guided_call_share", "guided_plan_share"}
GUIDED_ENTRIES = {"swe_guided_tool_calls", "swe_guided_tool_plan"}
# The reference SWE recipe's first report on the 135M policy: every call malformed, every group dead.
MALFORMED = {"turns_mean": 4.0, "tool_calls_mean": 4.0, "tool_failure_rate": 1.0, "malformed_call_rate": 1.0,
             "dead_group_ratio": 1.0, "correct_rate": 0.0, "train_correct_rate": 0.0, "train_progress_rate": 0.0,
             "train_valid_call_rate": 0.0, "guided_episode_rate": 0.0, "submit_without_edit_rate": 0.0,
             "reward_std": 0.0, "mean_logprob": -3.2}
# Well-formed calls the environment refuses (bad paths): the calls reach the tools, the cause is elsewhere.
REFUSED = {**MALFORMED, "malformed_call_rate": 0.1}


@pytest.fixture(scope="module")
def swe():
    program = HarnessProgram.from_file(DOMAIN_HARNESSES["swe"])
    with Harness(program) as h:
        yield program, h


def report(harness, metrics, named=True):
    alerts = harness.alerts(metrics, [])
    if not named:   # the same alerts with no pointer in them
        alerts = [{**a, "message": a["name"], "suggestion": "change something"} for a in alerts]
    return Evidence(health_report={"metrics": metrics, "engine": {"dead_group_ratio": 1.0}, "alerts": alerts},
                    adapter_trained=False)


def test_named_weight_reads_whole_words_and_severity():
    ev = Evidence(health_report={"alerts": [
        {"name": "a", "severity": "warning", "message": "raise the temperature"},
        {"name": "b", "severity": "critical", "message": "x", "suggestion": "set guided_call_share"}]})
    assert ev.named_weight("temperature") == NAMED_WEIGHT["warning"] == 3.0
    assert ev.named_weight("guided_call_share") == NAMED_WEIGHT["critical"] == 9.0
    assert ev.named_weight("guided_call") == 1.0          # part of a longer name is not a mention
    assert ev.named_weight("beta") == 1.0 and Evidence().named_weight("temperature") == 1.0


def test_swe_alerts_name_the_guided_knobs_only_when_calls_are_malformed(swe):
    _, h = swe
    malformed = {a["name"]: a for a in h.alerts(MALFORMED, [])}
    assert {"tool_failures", "insufficient_signal"} <= set(malformed)
    for name in ("tool_failures", "insufficient_signal"):
        assert malformed[name]["severity"] == "critical"
        assert GUIDED_KNOBS <= set(malformed[name]["suggestion"].replace(",", " ").replace(")", " ")
                                   .replace("(", " ").split())
    assert "curriculum" not in malformed["insufficient_signal"]["suggestion"].split(":")[0]
    refused = {a["name"]: a for a in h.alerts(REFUSED, [])}
    assert not any(k in str(a) for a in refused.values() for k in GUIDED_KNOBS)
    assert "easier curriculum" in refused["insufficient_signal"]["suggestion"]


def share(draw, n=160):
    return sum(draw(seed) for seed in range(n)) / n


def test_library_draws_the_named_guided_entries_most(swe):
    program, h = swe
    found, _ = LibraryOperator(seed=0).applicable(program, report(h, MALFORMED))
    fired = {a.entry.id for a in found}
    assert GUIDED_ENTRIES <= fired and len(fired - GUIDED_ENTRIES) >= 3   # a real choice among others

    def guided(ev):
        return lambda seed: LibraryOperator(seed=seed).propose([program], ev).details["entry"] in GUIDED_ENTRIES

    named, unnamed = share(guided(report(h, MALFORMED))), share(guided(report(h, MALFORMED, named=False)))
    # 2 of the fired entries at weight 9 against the others at 1 (0.82 with 6 fired), and 2 of 6 unnamed
    assert named > 0.7 and unnamed < 0.5, (named, unnamed)


def test_knobs_operator_draws_the_named_guided_knobs_most(swe):
    program, h = swe

    def guided(ev):
        return lambda seed: KnobOperator(seed=seed, n_startup_trials=8).propose([program], ev).details["knob"] \
            in GUIDED_KNOBS

    named, unnamed = share(guided(report(h, MALFORMED))), share(guided(report(h, MALFORMED, named=False)))
    assert named > 0.7 and unnamed < 0.55, (named, unnamed)
