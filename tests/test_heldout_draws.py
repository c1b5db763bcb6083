"""Selection and gating on separate draws of the held-out pool, and the test split for the final pick.

One set of held-out tasks used to drive every gate, every selection and every revert, so the loop's
choices overfit it. Now the pool splits (seeded, by task id) into a gate draw, which decides
promotions and tests reverts, and a selection draw, which ranks survivors, parents, the final pick and
the revert's choice of ancestor; the final pick alone is then verified on the test split.
"""

import json

import mlflow
import pytest

from evotrainer.config import parse_config
from evotrainer.domains import get_domain
from evotrainer.domains.sampling import heldout_draws
from evotrainer.loop.experiment import Experiment
from evotrainer.loop.tools.validate import validate_resources

from tests.loop_runs import tiny_cfg


def test_the_draws_are_disjoint_cover_the_pool_and_depend_only_on_ids_and_seed():
    tasks = get_domain("math", difficulty=[1, 2], n_train=8, n_heldout=20, n_test=4).tasks("heldout")
    gate, sel = heldout_draws(tasks, 0.5, seed=3)
    assert len(gate) == len(sel) == 10
    assert not {t.id for t in gate} & {t.id for t in sel}
    assert {t.id for t in gate} | {t.id for t in sel} == {t.id for t in tasks}
    again = heldout_draws(list(reversed(tasks)), 0.5, seed=3)   # any listing order: the same two sets
    assert {t.id for t in again[0]} == {t.id for t in gate}
    assert {t.id for t in heldout_draws(tasks, 0.5, seed=4)[0]} != {t.id for t in gate}
    assert len(heldout_draws(tasks, 0.25, seed=3)[1]) == 5
    with pytest.raises(ValueError, match="at least one each"):
        heldout_draws(tasks[:1], 0.5, seed=0)


def test_a_gate_draw_too_small_to_promote_is_said_before_any_compute(tmp_path):
    said = []
    cfg = parse_config(tiny_cfg(tmp_path / "run"))   # 6 held-out tasks: a gate draw of 3 < min_tasks 5
    validate_resources(cfg, loop=True, say=said.append)
    assert any("gate draw holds 3 of the 6 held-out tasks" in s and "raise domain.n_heldout" in s for s in said)
    one = tiny_cfg(tmp_path / "run")
    one["domain"]["n_heldout"] = 1
    with pytest.raises(ValueError, match="domain.n_heldout"):
        validate_resources(parse_config(one), loop=True)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("draws") / "run"
    cfg = tiny_cfg(run_dir, generations=2, children_per_generation=2)
    cfg["domain"].update(n_heldout=12, n_test=5)
    exp = Experiment(parse_config(cfg))
    exp.run()
    return exp


def test_gates_see_only_the_gate_draw_and_selection_only_the_selection_draw(finished):
    exp = finished
    gate_ids = {t.id for t in exp.runtime.gate_tasks}
    sel_ids = {t.id for t in exp.runtime.selection_tasks}
    assert len(gate_ids) == len(sel_ids) == 6
    verified = [v for v in exp.versions() if exp.vdir(v).rollouts("heldout")]
    assert len(verified) >= 3
    for vid in verified:
        vd, meta = exp.vdir(vid), exp.vdir(vid).meta()
        assert {r.task_id for r in vd.rollouts("heldout")} == gate_ids
        assert {r.task_id for r in vd.rollouts("selection")} == sel_ids
        sel = vd.rollouts("selection")
        assert meta.metrics["selection_accuracy"] == sum(bool(r.hidden["correct"]) for r in sel) / len(sel)
    children = [exp.vdir(v).meta() for v in verified if exp.vdir(v).meta().operator]
    assert children
    for c in children:
        paired = c.decision["paired"]
        assert paired["n_tasks"] == len(gate_ids)          # the gate paired child and control on the gate draw
        assert "minimum detectable effect" in paired["reason"]
    # Selection ranks by the selection draw: the candidates carry selection_accuracy, not the gate's number.
    for cand in exp.candidates(verified):
        assert cand.score == exp.vdir(cand.version_id).meta().metrics["selection_accuracy"]
    assert any("minimum detectable effect" in e for e in exp.state.events)


def test_the_final_pick_is_reported_on_the_test_split(finished):
    exp = finished
    final = exp.state.final
    pick = final["version"]
    assert pick in exp.state.survivors
    # The elite's order: the harness the gate vouches for most, then the selection score.
    from evotrainer.loop.stages.selection import harness_evidence

    # (among the survivors the selection draw ranks at or above the untrained model)
    bar = (exp.state.start or {}).get("selection_accuracy", float("-inf"))
    above = [v for v in exp.state.survivors if exp.vdir(v).meta().metrics["selection_accuracy"] >= bar]
    assert above, "this fixture's run should train something above the untrained model"
    evidence = {v: harness_evidence(v, lambda u: exp.vdir(u).meta()) for v in above}
    first = [v for v in above if evidence[v] == min(evidence.values())]
    best = max(exp.vdir(v).meta().metrics["selection_accuracy"] for v in first)
    assert evidence[pick] == min(evidence.values()) and exp.vdir(pick).meta().metrics["selection_accuracy"] == best
    test = exp.vdir(pick).rollouts("test")
    assert {r.task_id for r in test} == {t.id for t in exp.runtime.domain.tasks("test")} and len(test) == 5
    assert all(r.split == "test" and "correct" in r.hidden for r in test)
    assert final["test_accuracy"] == exp.vdir(pick).meta().metrics["test_accuracy"] and final["test_tasks"] == 5
    # Only the pick is verified on test: no other version holds test rollouts.
    assert [v for v in exp.versions() if exp.vdir(v).rollouts("test")] == [pick]
    saved = json.loads((exp.run_dir / "state.json").read_text())
    assert saved["final"] == final

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{exp.run_dir}/mlflow.db")
    run = client.get_run(exp.tracker.run_id(pick))
    assert run.data.metrics["test_accuracy"] == final["test_accuracy"]
    assert run.data.tags["evotrainer.final_pick"] == "true"
    tags = client.get_experiment(exp.tracker.experiment_id).tags
    assert tags["evotrainer.final_pick"] == pick and float(tags["evotrainer.final_test_accuracy"]) == pytest.approx(
        final["test_accuracy"], abs=1e-4)

    from io import StringIO

    from rich.console import Console

    out = StringIO()
    exp.print_summary(Console(file=out, width=300))
    assert f"final pick {pick}: test accuracy {final['test_accuracy']:.3f} on 5 test task(s)" in out.getvalue()


def test_a_resumed_finish_reuses_the_test_rollouts(finished):
    exp = finished
    pick = exp.state.final["version"]
    before = (exp.vdir(pick).path / "rollouts" / "test.jsonl").stat().st_mtime_ns
    exp.state.status = "finished"
    exp.finish()
    assert (exp.vdir(pick).path / "rollouts" / "test.jsonl").stat().st_mtime_ns == before
    assert exp.state.final["version"] == pick


def test_a_budget_that_ends_at_a_generation_boundary_still_has_a_final_pick(tmp_path):
    # Two generations of one step fit train_steps=2; generation 2 is proposed but not trained. Its
    # selection used to find no candidates and leave no survivors, so the run reported no test score.
    cfg = tiny_cfg(tmp_path / "run", generations=4, population_size=1, operators={"knobs": 1.0})
    cfg["evolution"].update(mode="reference", budget={"train_steps": 2})
    exp = Experiment(parse_config(cfg))
    state = exp.run()
    assert state.status == "stopped"
    trained = [v for v in exp.versions() if exp.vdir(v).rollouts("selection")]
    assert len(trained) == 2
    assert state.final and state.final["version"] in trained and "test_accuracy" in state.final
    assert any("the survivors of the last selection stand" in e for e in state.events)
