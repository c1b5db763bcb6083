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
    # probe_patience null: the side share decides alone (by default ties end probing: the test below)
    exp = Experiment(cfg(tmp_path, "run", 24, steps_per_generation=2, population_size=4, generations=30,
                         probe_patience=None))
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


def test_a_probe_generation_that_promotes_nothing_beside_a_moving_elite_ends_probing(tmp_path):
    """By default (``probe_patience`` 1) the side share is spent only while probes pay: on code-2, 9 of 10
    runs promoted no child in either probe generation and the pick ended 13 steps deep against 16. The
    tiny model's children tie their control (no answer is ever correct), so the exploit phase starts
    after generation 1, 2 children tried, and the pick trains every step the side share did not."""
    import json

    from evotrainer.fitness.engine_metrics import engine_alerts
    from evotrainer.loop.stages.exploit import probing_spent

    exp = Experiment(cfg(tmp_path, "run", 24, steps_per_generation=2, population_size=4, generations=30))
    state = exp.run()
    assert state.exploit_from == 1, state.events
    assert any("promoted no child" in e and "probe_patience" in e for e in state.events), state.events
    metas = [exp.vdir(v).meta() for v in exp.versions()]
    tried = [m for m in metas if m.operator is not None and exp.vdir(m.id).steps()]
    assert len(tried) == 2 and all(m.generation == 1 for m in tried)
    assert lineage_steps(exp, state.final["version"]) >= 22, state.final   # 24 less the two probes
    # What would have kept it probing: a promoted child, or an elite whose training moves nothing.
    survivors = [m.id for m in metas if m.generation == 1 and m.operator is None]
    cands = exp.candidates([m.id for m in metas if m.generation == 1])
    assert probing_spent(exp, 1, cands, survivors)
    child = exp.vdir(tried[0].id)
    meta = child.meta()
    meta.decision = {**(meta.decision or {}), "promote": True}
    child.save_meta(meta)
    assert probing_spent(exp, 1, cands, survivors) == ""
    meta.decision["promote"] = False
    child.save_meta(meta)
    health = exp.vdir(survivors[0]).path / "health.json"
    report = json.loads(health.read_text())
    seen = {"heldout_changed_rate": 0.0, "dead_group_ratio": 0.5}   # groups with a gradient, answers unmoved
    report["alerts"] = engine_alerts(seen)
    report.setdefault("engine", {}).update(seen)
    report.setdefault("metrics", {}).update(seen)
    health.write_text(json.dumps(report))
    assert probing_spent(exp, 1, exp.candidates([m.id for m in metas if m.generation == 1]), survivors) == ""
    exp.close()


def test_a_promotion_counts_for_patience_unless_a_person_held_it_back():
    from evotrainer.loop.stages.exploit import promoted
    from evotrainer.records.version import BranchVersion, Status

    def meta(status, **decision):
        return BranchVersion(id="v0002", base_model="tiny-random", genome_hash="h", parents=["v0000"], status=status,
                             decision=decision)
    assert promoted(meta(Status.PROMOTED, promote=True))
    assert promoted(meta(Status.PRUNED, promote=True))          # selection dropped it since: it still counts
    assert not promoted(meta(Status.PRUNED, promote=False)) and not promoted(meta(Status.KEPT, promote=False))
    held = {"promote": True, "human": [{"outcome": {"from": "promoted", "to": "kept"}}]}
    assert not promoted(meta(Status.KEPT, **held)) and not promoted(meta(Status.PRUNED, **held))
