"""The start (loop/stages/start.py): a run scores the untrained model before training and at the end, the
final pick is never a version ranked below it, and a run whose every lineage stays below it stops."""

import json

from evotrainer.config import parse_config
from evotrainer.loop.experiment import Experiment
from evotrainer.loop.stages.start import START, start_dir, verify_start
from evotrainer.loop.tools.summary import final_line
from evotrainer.records.rollout import Rollout

from tests.loop_runs import tiny_cfg as _tiny


def tiny_cfg(run_dir, **evolution):
    cfg = _tiny(run_dir, **evolution)
    cfg["domain"]["n_heldout"] = 12   # a gate draw of 6 tasks: the paired rule needs 5
    return cfg


def _all_correct(path):
    """Rewrites a rollout file as if the untrained model had answered every task right."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for r in rows:
        r["hidden"] = {**(r.get("hidden") or {}), "correct": True}
    path.write_text("".join(json.dumps(Rollout.from_dict(r).to_dict()) + "\n" for r in rows))


def _start_answers_everything(exp):
    """The untrained model's held-out record rewritten as if it had answered every task right."""
    verify_start(exp)
    for name in ("heldout", "selection"):
        _all_correct(start_dir(exp).rollouts_path(name))
    exp.state.start.update(heldout_accuracy=1.0, selection_accuracy=1.0, both_draws_accuracy=1.0)
    exp.save()


def test_a_run_scores_the_start_and_reports_it_beside_the_pick(tmp_path):
    exp = Experiment(parse_config(tiny_cfg(tmp_path / "run", generations=2)))
    state = exp.run()
    assert state.start is not None and set(state.start) >= {"heldout_accuracy", "selection_accuracy"}
    sd = start_dir(exp)
    gate_ids = {t.id for t in exp.runtime.gate_tasks}
    assert {r.task_id for r in sd.rollouts("heldout")} == gate_ids
    assert {r.task_id for r in sd.rollouts("selection")} == {t.id for t in exp.runtime.selection_tasks}
    assert all(r.hidden for r in sd.rollouts("heldout"))                    # engine verdicts, hidden
    assert len(sd.rollouts("test")) == len(exp.runtime.test_tasks)          # and the test split, once
    assert state.final["start_test_accuracy"] is not None
    assert "untrained model scores" in final_line(state.final)


def test_the_pick_falls_back_to_the_start_when_every_survivor_ranks_below_it(tmp_path):
    exp = Experiment(parse_config(tiny_cfg(tmp_path / "run", generations=1, stop_below_start=False)))
    verify_start(exp)
    assert exp.state.start["both_draws_accuracy"] is not None   # the start's record pools both draws
    exp.state.start["both_draws_accuracy"] = 1.01   # no trained version can reach this
    exp.save()
    state = exp.run()
    assert all("both_draws_accuracy" in exp.vdir(v).meta().metrics for v in state.survivors)
    assert state.final["version"] == START
    assert state.final["test_accuracy"] == state.final["start_test_accuracy"]
    assert "training made the policy worse" in final_line(state.final)
    assert any("the untrained model" in e for e in state.events)


def test_a_run_whose_lineages_stay_below_the_start_stops(tmp_path):
    """The untrained model made to answer every held-out task right (the tiny model answers none):
    the start beats the best survivor at every selection, and the run stops after the second."""
    exp = Experiment(parse_config(tiny_cfg(tmp_path / "run", generations=5)))
    _start_answers_everything(exp)
    state = exp.run()
    assert state.status == "stopped" and "regressed below the untrained model" in state.stop_reason
    assert state.generation == 1 and state.start["below"] == [0, 1]   # stopped after gen 1's selection
    assert state.final["version"] == START


def test_without_stop_below_start_the_run_goes_on(tmp_path):
    exp = Experiment(parse_config(tiny_cfg(tmp_path / "run", generations=3, stop_below_start=False)))
    _start_answers_everything(exp)
    state = exp.run()
    assert state.status == "finished" and state.generation == 3 and state.start["below"] == [0, 1, 2]


def test_the_stop_rule_agrees_with_the_bar_the_final_pick_applies(tmp_path):
    """A lineage that the start beats on the selection draw and the paired gate-draw rule, yet that
    reaches the start on both draws pooled, is what the final pick would take: it has not regressed."""
    from evotrainer.loop.stages.start import regressed_below_start

    exp = Experiment(parse_config(tiny_cfg(tmp_path / "run", generations=1, stop_below_start=False)))
    _start_answers_everything(exp)
    state = exp.run()
    assert regressed_below_start(exp, state.survivors) is not None       # below on every draw
    for vid in state.survivors:     # as if the lineage drew well on the gate draw: pooled at the bar
        meta = exp.vdir(vid).meta()
        meta.metrics["both_draws_accuracy"] = 1.0
        exp.vdir(vid).save_meta(meta)
    assert regressed_below_start(exp, state.survivors) is None
    exp.cfg.evolution.start_bar = "selection"      # the rule before draw 53: the selection draw alone
    assert regressed_below_start(exp, state.survivors) is not None
