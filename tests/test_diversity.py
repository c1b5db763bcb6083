"""Diversity at selection: harness descriptors read from real genomes against the seed, the MAP-Elites
rule on hand-built candidates (without it the survivors share one cell, with it they cover two and the
elite stays), and the same run's selection stage with and without it (real versions, real MLflow)."""

import mlflow
import pytest

from evotrainer.config import parse_config
from evotrainer.genome.edits import rewrite_hook
from evotrainer.genome.program import HarnessProgram, reference_program
from evotrainer.loop.stages.diversity import SEED_CELL, describe
from evotrainer.loop.experiment import Experiment
from evotrainer.loop.stages.selection import Candidate, parents, survivors
from evotrainer.loop.versions import new_version
from evotrainer.operators.library import default_entries

from tests.loop_runs import tiny_cfg

ENTRIES = {e.id: e for e in default_entries()}


def child(parent: HarnessProgram, entry: str, i: int = 0) -> HarnessProgram:
    """``parent`` with the library entry's ``i``-th parameter combination applied."""
    e = ENTRIES[entry]
    return e.apply(parent, e.combinations(parent)[i])


# ---- descriptors --------------------------------------------------------------------------------
def test_a_descriptor_names_the_hooks_and_knob_groups_that_differ_from_the_seed():
    seed = reference_program()
    assert describe(seed, seed).cell() == SEED_CELL
    filt, reward = child(seed, "std_group_filter", 0), child(seed, "format_partial_credit", 0)
    assert describe(seed, filt).cell().startswith("filter:")
    assert describe(seed, reward).cell().startswith("reward:")
    assert describe(seed, child(seed, "rloo_advantages")).cell().startswith("advantages:")
    assert describe(seed, child(seed, "pass_rate_curriculum")).cell().startswith("curriculum:")
    # Two other filter thresholds are two variants of the filter axis: two cells.
    assert describe(seed, child(seed, "std_group_filter", 1)).cell() != describe(seed, filt).cell()
    # Knobs count by group, not by value: every learning rate is one optimiser cell.
    lr = {describe(seed, child(seed, e, i)).cell() for e in ("raise_learning_rate", "lower_learning_rate")
          for i in range(2)}
    assert lr == {"knobs:optimiser"}
    assert describe(seed, child(seed, "lower_temperature")).cell() == "knobs:sampling"
    assert describe(seed, child(seed, "dr_grpo_advantages")).cell() == "knobs:loss"
    # Axes add up along a lineage: the filter child that then tunes its learning rate.
    both = describe(seed, child(filt, "raise_learning_rate"))
    assert both.cell() == describe(seed, filt).cell() + " knobs:optimiser"
    assert both.cell(["knobs"]) == "knobs:optimiser" and both.cell(["reward"]) == SEED_CELL


def test_a_diagnostics_only_change_is_no_new_harness():
    # A new metrics hook changes what is measured, not how the policy trains: the seed's cell.
    seed = reference_program()
    src = seed.hooks["metrics"].replace("def metrics(rollouts, groups):",
                                        "def metrics(rollouts, groups):\n    _unused = 1")
    diag = rewrite_hook(seed, "metrics", src)
    assert diag.hash != seed.hash and describe(seed, diag).cell() == SEED_CELL


def test_descriptor_metrics_are_numbers_zero_where_as_the_seed_and_equal_for_equal_variants():
    seed = reference_program()
    a = describe(seed, child(seed, "std_group_filter", 0)).metrics()
    b = describe(seed, child(child(seed, "std_group_filter", 0), "raise_learning_rate")).metrics()
    assert all(isinstance(x, float) for x in a.values())
    assert a["descriptor_reward"] == a["descriptor_knobs"] == 0.0 and a["descriptor_filter"] > 0
    assert a["descriptor_filter"] == b["descriptor_filter"] and b["descriptor_knobs"] > 0
    assert a["descriptor_cell"] != b["descriptor_cell"]
    assert describe(seed, seed).metrics()["descriptor_cell"] == 0.0


# ---- the rule on hand-built candidates ---------------------------------------------------------
def one_lineage():
    """Three optimiser-cell versions outscore a filter and a seed-cell version, all at one cost."""
    return [Candidate("a", 0.70, 10.0, cell="knobs:optimiser"), Candidate("b", 0.66, 10.0, cell="knobs:optimiser"),
            Candidate("c", 0.64, 10.0, cell="knobs:optimiser"), Candidate("d", 0.60, 10.0, cell="filter:9ab841"),
            Candidate("e", 0.50, 10.0, cell="seed"), Candidate("x", 0.99, 1.0, valid=False, cell="reward:1")]


def cells(ids, cands):
    by = {c.version_id: c.cell for c in cands}
    return {by[i] for i in ids}


def test_without_diversity_the_survivors_share_one_cell_with_it_they_cover_two_and_keep_the_elite():
    said = []
    plain = survivors(one_lineage(), 3, "nsga2", elitism=1, min_cells=1, say=said.append)
    assert plain == ["a", "b", "c"] and cells(plain, one_lineage()) == {"knobs:optimiser"} and not said
    got = survivors(one_lineage(), 3, "nsga2", elitism=1, min_cells=2, say=said.append)
    # The filter's best takes the place of the lowest-scoring optimiser version; the elite stays first.
    assert got == ["a", "b", "d"]
    assert len(said) == 1 and "d (filter:9ab841, score 0.600) in place of c (knobs:optimiser" in said[0]
    assert "2 cell(s) instead of 1" in said[0]
    three = survivors(one_lineage(), 3, "nsga2", elitism=1, min_cells=3)
    assert three[0] == "a" and cells(three, one_lineage()) == {"knobs:optimiser", "filter:9ab841", "seed"}
    assert "x" not in got + three   # an invalid version stays out, whatever its cell


def test_tournament_survivors_cover_two_cells_and_change_only_when_they_did_not():
    acted = 0
    for seed in range(30):
        said = []
        plain = survivors(one_lineage(), 3, "tournament", elitism=1, seed=seed)
        got = survivors(one_lineage(), 3, "tournament", elitism=1, seed=seed, min_cells=2, say=said.append)
        assert got[0] == "a" and len(cells(got, one_lineage())) >= 2
        if len(cells(plain, one_lineage())) >= 2:
            assert got == plain and not said
        else:
            acted += 1
            assert len(set(got) - set(plain)) == 1 and len(said) == 1
    assert acted > 0   # some draws kept one cell alone: the rule had something to do


def test_diversity_keeps_the_choice_and_says_nothing_when_there_is_nothing_to_cover():
    said = []
    mixed = [Candidate("a", 0.7, 10.0, cell="p"), Candidate("b", 0.6, 10.0, cell="q"), Candidate("c", 0.5, 10.0,
                                                                                                   cell="p")]
    assert survivors(mixed, 2, min_cells=2, say=said.append) == ["a", "b"]          # already two cells
    same = [Candidate(v, s, 10.0, cell="p") for v, s in (("a", 0.7), ("b", 0.6), ("c", 0.5))]
    assert survivors(same, 2, min_cells=2, say=said.append) == ["a", "b"]           # one cell is all there is
    assert said == []


def test_an_elite_that_fills_every_place_is_said_not_silently_kept():
    said = []
    got = survivors(one_lineage(), 2, "nsga2", elitism=2, min_cells=2, say=said.append)
    assert got == ["a", "b"]
    assert len(said) == 1 and "below min_cells 2" in said[0] and "lower elitism" in said[0]


def test_parent_draws_cover_two_cells_when_tournaments_would_pick_one():
    said = []
    plain = parents(one_lineage(), 4, tournament_size=4, seed=0)
    assert cells(plain, one_lineage()) == {"knobs:optimiser"}
    got = parents(one_lineage(), 4, tournament_size=4, seed=0, min_cells=2, say=said.append)
    assert len(got) == 4 and got[0] == plain[0] and "d" in got
    assert cells(got, one_lineage()) == {"knobs:optimiser", "filter:9ab841"} and len(said) == 1


# ---- a run's selection stage, with and without -------------------------------------------------
def settle(exp, vid, score, promoted=False):
    vd = exp.vdir(vid)
    meta = vd.meta()
    meta.status, meta.metrics = "kept", {"selection_accuracy": score, "cost": 10.0}
    if promoted:   # the gate's verdict: the elite ranks the harness the gate vouches for first
        meta.status, meta.decision = "promoted", {"promote": True}
    vd.save_meta(meta)


def selected(tmp_path, min_cells):
    """One generation of candidates (the seed's continuation, four learning-rate children that score
    best, one filter child), through the experiment's own selection stage."""
    cfg = tiny_cfg(tmp_path / f"run{min_cells}", population_size=3, revert=False, diversity={"min_cells": min_cells})
    exp = Experiment(parse_config(cfg))
    seed = exp.seed_program()
    v0 = new_version(exp, None, seed.source, 0)
    exp.vdir(v0).adapter_dir.mkdir(parents=True)
    settle(exp, v0, 0.5)
    parent = exp.vdir(v0).meta()
    programs = [(seed, 0.50, None), (child(seed, "raise_learning_rate", 0), 0.70, "knob:learning_rate"),
                (child(seed, "raise_learning_rate", 1), 0.66, "knob:learning_rate"),
                (child(seed, "lower_learning_rate", 0), 0.64, "knob:learning_rate"),
                (child(seed, "lower_learning_rate", 1), 0.62, "knob:learning_rate"),
                (child(seed, "std_group_filter", 0), 0.60, "hook:keep_groups")]
    for program, score, factor in programs:
        vid = new_version(exp, parent, program.source, 1, operator=factor and "library", factor=factor)
        settle(exp, vid, score, promoted=factor is not None)   # the children beat the seed at the gate
    exp.state.generation, exp.state.stage = 1, "select"
    exp.select_stage(1)
    return exp


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("diversity")
    return selected(tmp, 1), selected(tmp, 2)


def test_the_same_candidates_keep_more_distinct_harnesses_alive_with_diversity(both):
    off, on = both
    cell = {e: {v: e.vdir(v).meta().metrics["descriptor_cell"] for v in e.generation_versions(1)} for e in both}
    assert off.state.survivors == ["v0002", "v0003", "v0004"]            # the three best learning rates
    assert len({cell[off][v] for v in off.state.survivors}) == 1
    assert on.state.survivors == ["v0002", "v0003", "v0006"]             # the filter replaces the third
    assert len({cell[on][v] for v in on.state.survivors}) == 2
    assert not any("diversity" in e for e in off.state.events)
    assert any("gen 1: diversity: survivors v0006 (filter:" in e and "in place of v0004 (knobs:optimiser" in e
               for e in on.state.events)
    assert on.vdir("v0004").meta().status == "pruned" and on.vdir("v0006").meta().status == "promoted"


def test_every_version_records_its_descriptor_and_mlflow_has_it(both):
    _, on = both
    metas = {v: on.vdir(v).meta() for v in on.generation_versions(1)}   # the generation selection saw
    assert len(metas) == 6 and all("descriptor_cell" in m.metrics for m in metas.values())
    assert metas["v0001"].metrics["descriptor_cell"] == 0.0   # the seed's continuation: the seed's cell
    assert metas["v0006"].metrics["descriptor_filter"] > 0 and metas["v0006"].metrics["descriptor_knobs"] == 0
    # A pruned version's record went to MLflow when it was pruned, its descriptor with it.
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{on.run_dir}/mlflow.db")
    run = client.get_run(on.tracker.run_id("v0004"))
    assert run.data.metrics["descriptor_cell"] == metas["v0004"].metrics["descriptor_cell"] > 0
    assert run.data.metrics["descriptor_knobs"] > 0
