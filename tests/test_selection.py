"""Selection (DEAP): survivors and parents on hand-built candidates, so each rule is seen alone."""

import json

import pytest

from evotrainer.loop.stages.selection import Candidate, parents, survivors


def cands():
    return [Candidate("a", 0.9, 50.0), Candidate("b", 0.7, 10.0), Candidate("c", 0.6, 40.0),
            Candidate("d", 0.5, 5.0), Candidate("e", 0.95, 80.0, valid=False)]


def test_an_invalid_version_never_survives_whatever_its_score():
    for method in ("nsga2", "tournament"):
        for k in range(1, 6):
            got = survivors(cands(), k, method, elitism=1, seed=k)
            assert "e" not in got and len(got) == min(k, 4)


def test_elitism_keeps_the_best_valid_scores_first():
    assert survivors(cands(), 1, "nsga2", elitism=1) == ["a"]
    assert survivors(cands(), 2, "tournament", elitism=2, seed=3)[:2] == ["a", "b"]


def test_nsga2_keeps_the_pareto_front_of_score_and_cost():
    # After the elite a, the front of (score up, cost down) among b, c, d is b and d; c is dominated by b.
    got = survivors(cands(), 3, "nsga2", elitism=1)
    assert got[0] == "a" and set(got[1:]) == {"b", "d"}


def test_tournament_survivors_are_distinct_and_seeded():
    runs = [survivors(cands(), 3, "tournament", elitism=1, tournament_size=2, seed=s) for s in range(20)]
    assert all(len(set(r)) == 3 for r in runs)
    assert survivors(cands(), 3, "tournament", elitism=1, seed=7) == survivors(cands(), 3, "tournament", elitism=1,
                                                                                  seed=7)
    assert len({tuple(r) for r in runs}) > 1   # the seed decides, and different seeds choose differently


def test_parents_are_valid_seeded_and_favour_the_front():
    draws = parents(cands(), 400, tournament_size=2, seed=0)
    assert len(draws) == 400 and "e" not in draws
    assert parents(cands(), 5, seed=1) == parents(cands(), 5, seed=1)
    # a, b and d are on the first front, c is not: a tournament of two picks c only against c itself.
    share_c = draws.count("c") / len(draws)
    assert share_c < 0.15 and all(draws.count(x) > draws.count("c") for x in "abd"), share_c
    assert parents([Candidate("x", 0.1, 1.0, valid=False)], 3) == [] and parents(cands(), 0) == []


def test_a_stuck_version_loses_the_elite_to_one_that_moves():
    """The misfit setting's exploit: the stuck control and a learning-rate child tied at 0.333 on the
    selection draw, and the control (cheaper, earlier id) took the exploit budget it could not use. A
    stuck lineage repeats itself under any continuation, so a moving one comes first whatever it drew."""
    from evotrainer.fitness.engine_metrics import engine_alerts
    from evotrainer.loop.stages.selection import reported_stuck

    stuck_report = {"alerts": engine_alerts({"heldout_changed_rate": 0.0, "dead_group_ratio": 0.875})}
    moving_report = {"alerts": engine_alerts({"heldout_changed_rate": 0.67, "dead_group_ratio": 0.875})}
    assert reported_stuck(stuck_report) and not reported_stuck(moving_report) and not reported_stuck({})
    control = Candidate("v0004", 0.333, 10.0, stuck=reported_stuck(stuck_report))
    child = Candidate("v0006", 0.333, 12.0, stuck=reported_stuck(moving_report))
    other = Candidate("v0007", 0.25, 11.0)
    assert survivors([control, child, other], 1) == ["v0006"]
    assert survivors([Candidate("v0004", 0.333, 10.0), Candidate("v0006", 0.333, 12.0), other], 1) == ["v0004"]
    assert survivors([control, Candidate("v0006", 0.30, 12.0), other], 1) == ["v0006"]
    assert survivors([control, Candidate("v0006", 0.30, 12.0, stuck=True)], 1) == ["v0004"]   # all stuck: score


def test_a_stuck_lineage_yields_the_elite_even_to_a_moving_one_below_the_untrained_model(tmp_path):
    """Draw 54, math-misfit-lr seed 2: the recipe (lr 1e-6) was stuck at the untrained model's bar, and
    a learning-rate child that moved held-out answers drew one task below it. A stuck lineage can only
    end at the untrained score, so the moving one takes the exploit; the final pick still keeps the bar
    first and falls back to the stuck recipe's version at the bar when the moving one stays below."""
    from evotrainer.loop.run_versions import RunVersions
    from evotrainer.loop.stages.final_pick import final_pick
    from evotrainer.loop.stages.selection import elite_key
    from evotrainer.records.version import BranchVersion, VersionDir

    stuck = Candidate("v0004", 0.208, 10.0, stuck=True, evidence=1)
    moving_below = Candidate("v0006", 0.188, 12.0, evidence=2, below_start=True)
    assert survivors([stuck, moving_below], 1) == ["v0006"]
    assert survivors([stuck, moving_below, Candidate("v0007", 0.208, 11.0, evidence=2)], 1) == ["v0007"]
    # among moving versions the bar still comes before the gate's evidence and the score
    assert survivors([moving_below, Candidate("v0007", 0.2, 11.0, evidence=2)], 1) == ["v0007"]
    # among stuck versions too
    assert sorted([Candidate("v0008", 0.3, 1.0, stuck=True, below_start=True), stuck], key=elite_key)[0] is stuck

    # the final pick: the same two versions on disk, the moving one below the bar on both draws pooled
    versions = RunVersions(tmp_path / "versions")
    start = {"selection_accuracy": 0.208, "both_draws_accuracy": 0.208}
    for vid, acc, op, report in (("v0004", 0.208, None, {"alerts": [{"name": "adapter_stuck"}]}),
                                 ("v0006", 0.188, "knobs", {"metrics": {"dead_group_ratio": 0.5,
                                                                        "heldout_changed_rate": 0.71}})):
        vd = VersionDir(versions.root / vid)
        vd.save_meta(BranchVersion(id=vid, base_model="m", genome_hash=vid, parents=[], operator=op,
                                   metrics={"selection_accuracy": acc, "both_draws_accuracy": acc, "cost": 1.0},
                                   status="kept"))
        (vd.path / "health.json").write_text(json.dumps(report))
    assert final_pick(versions, ["v0004", "v0006"], start) == "v0004"


def _lineage():
    """A run's versions as draw 51's math-learns seed 2 held them, plus a promoted branch."""
    from evotrainer.records.version import BranchVersion

    def v(vid, parent=None, operator=None, promote=None):
        return BranchVersion(id=vid, base_model="m", genome_hash=vid, parents=[parent] if parent else [],
                             operator=operator, decision=None if promote is None else {"promote": promote},
                             status="promoted" if promote else "kept")

    return {m.id: m for m in (
        v("v0000"), v("v0001", "v0000"), v("v0004", "v0001"),                           # the recipe, continued
        v("v0002", "v0000", "knobs", promote=False), v("v0005", "v0002"),              # mask_truncated: refused
        v("v0007", "v0005", "library", promote=False), v("v0008", "v0007"),            # a 256-token cap: a tie
        v("v0003", "v0000", "library", promote=True), v("v0009", "v0003"),             # promoted, continued
        v("v0010", "v0009", "knobs", promote=True), v("v0011", "v0005", "knobs", promote=True))}


def test_harness_evidence_reads_every_change_on_the_lineage():
    from evotrainer.loop.stages.selection import harness_evidence

    metas = _lineage()
    evidence = {vid: harness_evidence(vid, metas.__getitem__) for vid in metas}
    assert [evidence[v] for v in ("v0000", "v0001", "v0004")] == [1, 1, 1]      # the recipe's own harness
    assert [evidence[v] for v in ("v0002", "v0005", "v0007", "v0008")] == [2, 2, 2, 2]
    assert [evidence[v] for v in ("v0003", "v0009", "v0010")] == [0, 0, 0]      # every change promoted
    assert evidence["v0011"] == 2     # promoted against a control whose own harness was never promoted
    # a person held the promoted v0003 back at the completion gate: its status says kept, and so the walk
    metas["v0003"].status = "kept"
    assert [harness_evidence(v, metas.__getitem__) for v in ("v0003", "v0009", "v0010")] == [2, 2, 2]
    # an ancestor without a record vouches for nothing, and a cycle ends the walk
    assert harness_evidence("v0009", lambda u: None if u == "v0003" else metas[u]) == 2
    metas["v0000"].parents = ["v0004"]
    assert harness_evidence("v0004", metas.__getitem__) == 2


def test_the_elite_is_the_harness_the_gate_vouches_for_before_the_selection_score():
    """Draw 51, math-learns, seed 2: a 256-token cap (a child that tied its control, on a parent the gate
    refused) drew 0.542 on the selection draw against the recipe's continuation's 0.458 and took the
    exploit; its lineage fell on held-out. Seeds 0 and 1: an overlong penalty that tied its control took
    it at a tie on cost. The recipe's lineage keeps the elite's place until a promoted change beats it."""
    from evotrainer.loop.stages.selection import harness_evidence

    metas = _lineage()

    def cand(vid, score, cost=25.0):
        return Candidate(vid, score, cost, evidence=harness_evidence(vid, metas.__getitem__))

    assert survivors([cand("v0008", 0.542, 63.0), cand("v0004", 0.458), cand("v0005", 0.458)], 1) == ["v0004"]
    assert survivors([cand("v0008", 0.542), cand("v0004", 0.458), cand("v0009", 0.417)], 1) == ["v0009"]
    assert survivors([cand("v0008", 0.542), cand("v0005", 0.5)], 1) == ["v0008"]       # no better evidence: score
    # below the untrained model, the promoted lineage yields to the recipe's continuation above it
    below = Candidate("v0009", 0.3, 25.0, evidence=0, below_start=True)
    assert survivors([cand("v0008", 0.542), cand("v0004", 0.458), below], 1) == ["v0004"]
    assert survivors([Candidate("v0004", 0.2, 25.0, evidence=1, below_start=True), below], 1) == ["v0009"]


def test_the_final_pick_is_first_in_the_elites_order_among_versions_above_the_untrained_model(tmp_path):
    from evotrainer.loop.run_versions import RunVersions
    from evotrainer.loop.stages.final_pick import final_pick
    from evotrainer.loop.stages.start import START
    from evotrainer.records.version import VersionDir

    versions = RunVersions(tmp_path / "versions")
    scores = {"v0000": 0.40, "v0001": 0.45, "v0004": 0.458, "v0002": 0.40, "v0005": 0.40, "v0007": 0.5,
              "v0008": 0.542, "v0003": 0.40, "v0009": 0.417, "v0010": 0.30, "v0011": 0.60}
    for vid, meta in _lineage().items():
        meta.metrics = {"selection_accuracy": scores[vid], "cost": 25.0}
        VersionDir(versions.root / vid).save_meta(meta)
    # a promoted lineage first, the recipe's next, whatever a refused change drew
    assert final_pick(versions, ["v0008", "v0004", "v0009"], start={"selection_accuracy": 0.40}) == "v0009"
    assert final_pick(versions, ["v0008", "v0004"], start={"selection_accuracy": 0.40}) == "v0004"
    # the promoted lineage below the untrained model is passed over, not a reason to pick the start
    assert final_pick(versions, ["v0008", "v0004", "v0010"], start={"selection_accuracy": 0.40}) == "v0004"
    assert final_pick(versions, ["v0008", "v0004", "v0010"], start={"selection_accuracy": 0.55}) == START
    assert final_pick(versions, ["v0008", "v0004", "v0010"], start=None) == "v0010"


def test_the_untrained_models_bar_pools_both_held_out_draws(tmp_path):
    """Draw 52, math-misfit-lr, seed 0: the last version drew 0.167 on the selection draw against the
    untrained model's 0.208, but 0.417 on the gate draw against 0.292. On both draws pooled it is above
    the bar and is the pick; under the selection-draw rule (``start_bar: selection``) the start is."""
    from evotrainer.loop.run_versions import RunVersions
    from evotrainer.loop.stages.final_pick import final_pick
    from evotrainer.loop.stages.selection import below_start
    from evotrainer.loop.stages.start import START
    from evotrainer.records.version import VersionDir

    start = {"heldout_accuracy": 0.292, "selection_accuracy": 0.208, "both_draws_accuracy": 0.25}
    last = {"heldout_accuracy": 0.417, "selection_accuracy": 0.167, "both_draws_accuracy": 0.292}
    assert not below_start(last, start) and below_start(last, start, "selection")
    assert below_start({**last, "both_draws_accuracy": 0.229}, start)
    # a record from before the pooled score falls back to the selection draw, for both sides alike
    assert below_start({k: v for k, v in last.items() if k != "both_draws_accuracy"}, start)
    assert below_start(last, {k: v for k, v in start.items() if k != "both_draws_accuracy"})
    assert not below_start({}, start) and not below_start(last, None)
    with pytest.raises(ValueError, match="start_bar 'both'"):
        below_start(last, start, "both")

    versions = RunVersions(tmp_path / "versions")
    for vid, meta in _lineage().items():
        meta.metrics = dict(last, cost=25.0)
        VersionDir(versions.root / vid).save_meta(meta)
    assert final_pick(versions, ["v0004"], start) == "v0004"
    assert final_pick(versions, ["v0004"], start, bar="selection") == START


def test_the_offline_bar_check_finds_the_runs_whose_pick_the_pooled_bar_changes(tmp_path):
    """benchmarks/start_bar_flips.py on a finished run written as draw 52's misfit seed 0 held it: the
    last version below the start on the selection draw, above it on both draws. Held-out files only."""
    import importlib.util
    import json
    from pathlib import Path

    from evotrainer.records.version import VersionDir

    script = Path(__file__).parents[1] / "benchmarks" / "start_bar_flips.py"
    spec = importlib.util.spec_from_file_location("start_bar_flips", script)
    flips = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(flips)

    def draws(folder, gate, selection):
        (folder / "rollouts").mkdir(parents=True)
        (folder / "rollouts" / "heldout.jsonl").write_text("{}\n" * gate)
        (folder / "rollouts" / "selection.jsonl").write_text("{}\n" * selection)

    run = tmp_path / "evolve-s0"
    metas = _lineage()
    for vid in ("v0000", "v0001", "v0004"):
        meta = metas[vid]
        meta.metrics = {"heldout_accuracy": 0.417, "selection_accuracy": 0.167, "cost": 25.0}
        VersionDir(run / "versions" / vid).save_meta(meta)
        draws(run / "versions" / vid, 24, 24)
    draws(run / "start", 24, 24)
    state = {"status": "finished", "survivors": ["v0004"], "final": {"version": "start"},
             "start": {"heldout_accuracy": 0.292, "selection_accuracy": 0.208}}
    (run / "state.json").write_text(json.dumps(state))
    got = flips.picks(run)
    assert (got["recorded"], got["selection"], got["both_draws"]) == ("start", "start", "v0004")
    assert abs(got["start"]["both_draws_accuracy"] - 0.25) < 1e-9
    state["status"] = "running"
    (run / "state.json").write_text(json.dumps(state))
    assert flips.picks(run) is None      # an unfinished run is not judged


def test_the_bar_check_verifies_the_other_rule_s_pick_on_test_as_the_run_verified_its_own(tmp_path):
    """`start_bar_flips.py --verify` on a finished tiny loop: the other rule's pick is verified through
    the run's own test path, so naming the run's own pick (or the untrained model) reproduces the test
    score its final record holds, and the run directory is only read."""
    import hashlib
    import importlib.util
    from pathlib import Path

    from evotrainer.config import parse_config
    from evotrainer.loop.experiment import Experiment
    from tests.loop_runs import tiny_cfg

    script = Path(__file__).parents[1] / "benchmarks" / "start_bar_flips.py"
    spec = importlib.util.spec_from_file_location("start_bar_flips", script)
    flips = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(flips)

    run = tmp_path / "run"
    exp = Experiment(parse_config(tiny_cfg(run, generations=2)))
    exp.run()
    exp.close()
    final = exp.state.final
    assert final["bar"] == "both held-out draws" and final["version"] != "start"

    def listing():
        return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(run.rglob("*")) if p.is_file() and p.name != ".evotrainer.lock"}

    before = listing()
    p = flips.picks(run)
    assert p["applied"] == "both_draws" and p["recorded"] == final["version"] == p["both_draws"]
    own = flips.verify_other(run, dict(p, selection=final["version"]))
    assert (own["other_rule"], own["other_pick"]) == ("selection", final["version"])
    assert own["other_test"] == own["pick_test"] == final["test_accuracy"]
    _, again = flips.test_rollouts(run, final["version"])       # the same greedy answers, not only the same score
    stored = exp.vdir(final["version"]).rollouts("test")
    assert [(r.task_id, r.completion) for r in again] == [(r.task_id, r.completion) for r in stored]
    untrained = flips.verify_other(run, dict(p, selection="start"))
    assert untrained["other_test"] == final["start_test_accuracy"]
    assert listing() == before


def test_a_continuation_whose_report_cannot_judge_keeps_its_harness_s_stuck_word(tmp_path):
    """Draw 53's math-misfit-lr seed 0: the recipe (lr 1e-6) raised adapter_stuck at generation 0; its
    continuations' groups were then all dead, so their reports raised nothing, and the recipe's
    continuation took the exploit phase from the 1e-3 child it tied. A report with no gradient leaves
    the word to the last report of the same harness up the lineage; a changed harness starts unjudged,
    and a judged report (live groups, answers moving) ends the inheritance."""
    import json

    from evotrainer.fitness.engine_metrics import engine_alerts
    from evotrainer.loop.run_versions import RunVersions
    from evotrainer.loop.stages.final_pick import final_pick
    from evotrainer.loop.stages.selection import lineage_stuck
    from evotrainer.records.version import BranchVersion, VersionDir

    def version(vid, parent, genome, changed, dead, score=0.25):
        vd = VersionDir(tmp_path / "versions" / vid)
        vd.save_meta(BranchVersion(id=vid, base_model="m", genome_hash=genome, parents=[parent] if parent else [],
                                   operator="knobs" if genome != "recipe" and parent == "v0000" else None,
                                   decision={"promote": False} if genome != "recipe" and parent == "v0000" else None,
                                   status="kept", metrics={"heldout_accuracy": 0.167, "selection_accuracy": score,
                                                           "cost": 20.0}))
        metrics = {"heldout_changed_rate": changed, "dead_group_ratio": dead}
        (vd.path / "health.json").write_text(json.dumps({"metrics": metrics, "alerts": engine_alerts(metrics)}))

    version("v0000", None, "recipe", 0.0, 0.75)        # stuck: live groups, nothing moved
    version("v0001", "v0000", "recipe", 0.0, 1.0)      # continued, every group dead: no word of its own
    version("v0004", "v0001", "recipe", 0.0, 1.0)
    version("v0002", "v0000", "lr1e-3", 0.0, 1.0)      # the learning-rate child, its groups dead too
    version("v0005", "v0002", "lr1e-3", 0.0, 1.0)
    version("v0009", "v0004", "recipe", 0.4, 0.5)      # the recipe judged moving later: that word stands
    versions = RunVersions(tmp_path / "versions")
    stuck = {v: lineage_stuck(v, versions.vdir, versions.meta_or_none) for v in versions.ids()}
    assert stuck == {"v0000": True, "v0001": True, "v0004": True, "v0002": False, "v0005": False, "v0009": False}
    start = {"heldout_accuracy": 0.167, "selection_accuracy": 0.25}
    # tied on both draws, the recipe's own harness would rank first on the gate's evidence; stuck, it does not
    assert final_pick(versions, ["v0004", "v0005"], start) == "v0005"
    assert final_pick(versions, ["v0009", "v0005"], start) == "v0009"
