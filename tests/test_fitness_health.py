"""Health reports on real version dirs written by ``train_branch`` on the tiny model, and the report command.

The dirs come from the planted-leak scenario (built once per test process, shared read-only); the
``honest`` one is a plain ``train_branch`` run of the reference harness.
"""

import argparse
import statistics
import json

import pytest

from evotrainer.records.version import VersionDir
from evotrainer.records.scores import heldout_accuracy as accuracy
from evotrainer.fitness.cache import write_version
from evotrainer.cli.fitness import register
from evotrainer.fitness.engine_metrics import changed_rate, engine_alerts, outcome_flow
from evotrainer.fitness.health import SEVERITY_RANK, health_report
from evotrainer.testing.planted import planted_leak_scenario
from evotrainer.records.rollout import Rollout, group_rollouts


@pytest.fixture(scope="module")
def dirs():
    return planted_leak_scenario()


def test_report_of_a_trained_version(dirs):
    v = VersionDir(dirs["honest"])
    train, held, base = v.rollouts("train"), v.rollouts("heldout"), v.rollouts("heldout_base")
    r = health_report(dirs["honest"])
    e = r.engine
    # Engine numbers are the cache's own: recomputed here independently.
    assert e["heldout_accuracy"] == accuracy(held) == v.meta().metrics["heldout_accuracy"]
    assert e["heldout_accuracy_base"] == accuracy(base)
    assert e["train_rollouts"] == len(train) == 24 and e["train_steps"] == 3
    groups = group_rollouts(train)
    dead = sum(len({x.reward for x in g.rollouts}) == 1 for g in groups) / len(groups)
    assert e["dead_group_ratio"] == pytest.approx(dead)
    assert e["truncation_rate"] == pytest.approx(sum(x.truncated for x in train) / len(train))
    assert e["train_reward_std"] == pytest.approx(statistics.pstdev([x.reward for x in train]))
    tokens = sum(len(x.logprobs) for x in train)
    assert e["mean_logprob"] == pytest.approx(sum(sum(x.logprobs) for x in train) / tokens)
    assert e["leaked_rollouts"] > 0 and e["leak_p_value"] is not None       # the domain was rebuilt
    # The harness's diagnostics ran in the sandbox on the cache: the reference harness's metric names.
    assert {"reward_mean", "dead_group_ratio", "reward_spread"} <= set(r.harness_metrics) and not r.errors
    assert len(r.history) == 0    # 3 steps, window 3: everything is "current"
    # Whether training moved any greedy held-out answer: recomputed from the tokens.
    before = {(x.task_id, x.seed): x.completion_ids for x in base}
    moved = [x.completion_ids != before[(x.task_id, x.seed)] for x in held]
    assert e["heldout_changed_rate"] == pytest.approx(sum(moved) / len(moved))
    # Outcome flow base -> after covers every held-out (task, seed) once.
    f = r.flow
    assert f["fixed"] + f["broken"] + f["kept_correct"] + f["kept_wrong"] == len(held) and f["unpaired"] == 0
    # Alerts: most severe first, each with its suggested intervention.
    ranks = [SEVERITY_RANK[a["severity"]] for a in r.alerts]
    assert ranks == sorted(ranks) and r.alerts and all(a["suggestion"] for a in r.alerts)
    d = json.loads(r.to_json())
    assert d["metrics"]["heldout_accuracy"] == e["heldout_accuracy"] and d["alerts"] == r.alerts
    md = r.to_markdown()
    assert md.index("## Alerts") < md.index("## Validity") and "suggested intervention:" in md


def test_history_and_current_window(dirs):
    r = health_report(dirs["honest"], window=1)
    assert len(r.history) == 2 and r.harness_metrics["num_rollouts"] == 8    # steps 0-1 history, 2 current


def test_broken_genome_still_gets_a_report(tmp_path, dirs):
    v = VersionDir(dirs["honest"])
    bad = 'def metrics(rollouts, groups):\n    return {"x": float("nan")}\n'
    path = write_version(tmp_path / "v", v.rollouts("train"), v.rollouts("heldout"), genome=bad)
    r = health_report(path)
    assert r.errors and "metrics" in r.errors[0] and r.engine["heldout_accuracy"] is not None
    assert "Harness errors" in r.to_markdown()


def test_outcome_flow_counts():
    def ro(task, seed, ok):
        return Rollout(task_id=task, messages=[], completion="", seed=seed, split="heldout", hidden={"correct": ok})
    before = [ro("a", 0, False), ro("b", 0, True), ro("c", 0, True), ro("d", 0, False), ro("e", 0, True)]
    after = [ro("a", 0, True), ro("b", 0, False), ro("c", 0, True), ro("d", 0, False), ro("e", 1, True)]
    f = outcome_flow(before, after)
    assert (f["fixed"], f["broken"], f["kept_correct"], f["kept_wrong"], f["unpaired"]) == (1, 1, 1, 1, 2)
    assert f["fixed_tasks"] == ["a"] and f["broken_tasks"] == ["b"]


def test_report_command(dirs, capsys):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))

    def run(*argv):
        args = parser.parse_args(list(argv))
        return args.func(args)

    assert run("report", str(dirs["leaky"])) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Health report") and "leak_used" in out
    assert run("report", str(dirs["leaky"]), "--json", "--compare", str(dirs["honest"])) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["flow"]["before"] == "honest" and d["engine"]["leak_copy_rate"] > 0.5
    assert run("report", "/nonexistent") == 2


def test_cli_plugs_the_fitness_commands():
    """report, backtest and gate are reachable from the main command line."""
    from evotrainer.cli import app as cli
    from evotrainer.cli import fitness

    assert fitness in cli.COMMAND_GROUPS
    sub = cli.build_parser()._subparsers._group_actions[0].choices
    assert {"report", "backtest", "gate"} <= set(sub)


def test_commands_work_through_the_cli_once_plugged(dirs, monkeypatch, capsys):
    from evotrainer.cli import app as cli

    assert cli.main(["report", str(dirs["honest"]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["engine"]["train_rollouts"] == 24
    assert cli.main(["gate", str(dirs["leaky"]), "--parent", str(dirs["honest"])]) == 1
    assert "INVALID" in capsys.readouterr().out


@pytest.mark.parametrize("rates, says", [
    ({"train_valid_call_rate": 0.9, "train_progress_rate": 0.0}, ["late episodes"]),
    # greedy held-out episodes reread one file, well formed, while sampled training calls are malformed
    ({"train_valid_call_rate": 0.2, "train_progress_rate": 0.0,
      "heldout_valid_call_rate": 0.96, "heldout_progress_rate": 0.0}, ["held-out episodes"]),
    ({"train_valid_call_rate": 0.9, "train_progress_rate": 0.0,
      "heldout_valid_call_rate": 0.9, "heldout_progress_rate": 0.0}, ["late episodes", "held-out episodes"]),
    ({"heldout_valid_call_rate": 0.9, "heldout_progress_rate": 0.2}, []),      # the calls go somewhere
    ({"train_valid_call_rate": 0.3, "train_progress_rate": 0.0}, []),          # mostly malformed: another alert's
])
def test_calls_without_progress_reads_both_splits(rates, says):
    found = [a for a in engine_alerts(rates) if a["name"] == "calls_without_progress"]
    assert len(found) == (1 if says else 0)
    for where in says:
        assert where in found[0]["message"] and found[0]["source"] == "engine"


@pytest.mark.parametrize("changed, dead, fires", [
    (0.0, 0.75, True),     # math-misfit-lr at TRL's 1e-6: live groups, no held-out answer changed
    (0.0, 1.0, False),     # every group dead: no gradient, nothing to conclude about the step size
    (0.25, 0.875, False),  # math-learns at 5e-4: a quarter of the answers moved
])
def test_an_adapter_that_live_groups_do_not_move_is_a_critical_pointer_to_the_learning_rate(changed, dead, fires):
    from evotrainer.operators.evidence import Evidence
    from evotrainer.operators.library import LibraryOperator

    alerts = engine_alerts({"heldout_changed_rate": changed, "dead_group_ratio": dead})
    found = [a for a in alerts if a["name"] == "adapter_stuck"]
    assert len(found) == fires
    weights = LibraryOperator(seed=0).draw_weights(Evidence(health_report={"alerts": alerts}))
    plain = LibraryOperator(seed=0).draw_weights(Evidence())
    # the library (and the knobs operator's draw of a knob) weighs the learning-rate entries 9x where it fires
    assert weights["unstick_learning_rate"] == plain["unstick_learning_rate"] * (9.0 if fires else 1.0)
    assert weights["more_generations"] == plain["more_generations"]


def test_a_compared_version_is_the_base_of_the_delta_and_the_changed_rate(dirs):
    """The loop reports a version against its parent: the held-out delta and the changed rate read the
    parent's held-out outcomes on the same (task, seed) units, not the version's own base record."""
    leaky, honest = VersionDir(dirs["leaky"]), VersionDir(dirs["honest"])
    e = health_report(dirs["leaky"], compare=dirs["honest"]).engine
    assert e["heldout_accuracy_base"] == accuracy(honest.rollouts("heldout"))
    assert e["heldout_delta"] == pytest.approx(accuracy(leaky.rollouts("heldout")) - accuracy(honest.rollouts("heldout")))
    assert e["heldout_changed_rate"] == changed_rate(honest.rollouts("heldout"), leaky.rollouts("heldout"))
    assert health_report(dirs["honest"], compare=dirs["honest"]).engine["heldout_changed_rate"] == 0.0


def test_changed_rate_pairs_units_and_counts_token_changes():
    def r(task, seed, ids):
        return Rollout(task_id=task, messages=[], completion="", completion_ids=ids, seed=seed)
    before = [r("a", 0, [1, 2]), r("b", 0, [3]), r("c", 0, [4])]
    after = [r("a", 0, [1, 2]), r("b", 0, [3, 5]), r("c", 1, [4]), r("d", 0, [9])]
    assert changed_rate(before, after) == 0.5        # a kept, b changed; c (other seed) and d unpaired
    assert changed_rate([], after) is None
