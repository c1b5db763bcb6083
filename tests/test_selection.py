"""Selection (DEAP): survivors and parents on hand-built candidates, so each rule is seen alone."""

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


def test_at_an_equal_score_a_stuck_version_loses_the_elite():
    """The misfit setting's exploit: the stuck control and a learning-rate child tied at 0.333 on the
    selection draw, and the control (cheaper, earlier id) took the exploit budget it could not use."""
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
    assert survivors([control, Candidate("v0006", 0.30, 12.0), other], 1) == ["v0004"]   # only a tie
