"""Probes: a small step budget explores in short generations of one lineage beside its children.

Issue 47, item 4: within 24 training steps `evolve` tried no child with the quickstart (4 steps a
generation) and 2 at 16 steps; it should try at least 4 while its pick keeps 75% of the reference's depth.
"""

from evotrainer.config import parse_config
from evotrainer.loop.experiment import Experiment
from evotrainer.loop.stages.probes import first_step, generation_steps, probe_steps
from tests.loop_runs import check_invariants, lineage_steps, tiny_cfg


def cfg(tmp_path, name, steps=None, **evolution):
    budget = {"budget": {"train_steps": steps}} if steps else {}
    return parse_config(tiny_cfg(tmp_path / name, **budget, **evolution))


def test_probing_is_on_where_full_generations_leave_no_room_for_a_second_generation_of_children(tmp_path):
    two = {"steps_per_generation": 2}
    assert probe_steps(cfg(tmp_path, "a", 16, **two)) == 1      # half of 16 holds 4 versions of 2 steps
    assert probe_steps(cfg(tmp_path, "b", 24, **two)) == 1      # 6
    assert probe_steps(cfg(tmp_path, "c", 32, **two)) == 0      # 8 >= 1 + 2 × (1 + 2): explores as before
    assert probe_steps(cfg(tmp_path, "d", 24, steps_per_generation=4)) == 1   # the quickstart at 24 steps
    assert probe_steps(cfg(tmp_path, "e", None, **two)) == 0    # no step budget: generations decide
    assert probe_steps(cfg(tmp_path, "f", 16, mode="reference", **two)) == 0
    assert probe_steps(cfg(tmp_path, "g", 16, exploit_share=0.0, **two)) == 0   # explores to the end
    assert probe_steps(cfg(tmp_path, "h", 16, probe_steps=0, **two)) == 0
    assert probe_steps(cfg(tmp_path, "i", 64, probe_steps=2, **two)) == 2


def test_probe_generations_are_short_and_the_task_schedule_follows_them(tmp_path):
    c = cfg(tmp_path, "a", 16, steps_per_generation=2)
    assert [generation_steps(c, None, g) for g in range(3)] == [1, 1, 1]
    assert [generation_steps(c, 2, g) for g in range(5)] == [1, 1, 1, 2, 2]      # the exploit phase after gen 2
    assert [first_step(c, 2, g) for g in range(6)] == [0, 1, 2, 3, 5, 7]
    off = cfg(tmp_path, "b", 32, steps_per_generation=2)
    assert [first_step(off, 1, g) for g in range(4)] == [0, 2, 4, 6]           # generation × steps_per_generation


def test_24_steps_try_at_least_4_children_and_the_pick_keeps_three_quarters_of_the_depth(tmp_path):
    exp = Experiment(cfg(tmp_path, "run", 24, steps_per_generation=2, population_size=4, generations=30))
    state = exp.run()
    assert state.budget_used["train_steps"] in (24, 25), state.budget_used
    metas = [exp.vdir(v).meta() for v in exp.versions()]
    exploring = [m for m in metas if m.generation <= state.exploit_from]
    children = [m for m in exploring if m.operator is not None and m.status.value not in ("pending",)]
    trained = [m for m in children if exp.vdir(m.id).steps()]
    assert len(trained) >= 4, [(m.id, m.generation, m.status) for m in children]
    assert all(m.steps == 1 for m in exploring) and all(m.steps == 2 for m in metas if m not in exploring)
    for g in range(1, state.exploit_from + 1):        # one continuation an exploring generation: one lineage
        assert len([m for m in exploring if m.generation == g and m.operator is None]) == 1, g
    for m in metas:                                   # siblings share their tasks and seeds
        assert m.first_step == first_step(exp.cfg, state.exploit_from, m.generation)
        assert [s["step"] for s in exp.vdir(m.id).steps()] == list(range(m.first_step, m.first_step + len(
            exp.vdir(m.id).steps())))
    assert lineage_steps(exp, state.final["version"]) >= 18, state.final
    assert any("probing" in e for e in state.events) or state.exploit_from <= 1, state.events
    check_invariants(exp.run_dir)
    exp.close()
