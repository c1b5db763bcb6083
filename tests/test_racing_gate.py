"""The racing gate in the loop (``evolution.race_cap``): a child the gate draw leaves undecided is verified
with its control on further held-out rounds (``loop/stages/racing.py``) and promoted by the
group-sequential test over everything read (``fitness/gates.py``).

First on version directories written by hand (the gate stage's protocol: when it asks for rounds, what
it decides on them), then a real loop on the tiny model, whose race verifies real rounds."""

from __future__ import annotations

import json

import pytest

from evotrainer.config import ConfigError, parse_config
from evotrainer.fitness.gate_config import GateConfig
from evotrainer.fitness.gates import RACE, gate, raced
from evotrainer.loop.experiment import Experiment
from evotrainer.loop.run_versions import RunVersions
from evotrainer.loop.stages.gating import GateInputs, gate_version
from evotrainer.loop.tools.validate import validate_resources
from evotrainer.records.rollout import Rollout
from evotrainer.records.version import VersionDir

from tests.loop_runs import tiny_cfg
from tests.test_gate_stage import write


def rollouts(prefix: str, correct: list[bool], split: str) -> list[Rollout]:
    return [Rollout(task_id=f"{prefix}{i}", messages=[{"role": "user", "content": "q"}], completion="c", seed=0,
                    step=-1, split=split, visible={"format_ok": True}, hidden={"correct": c, "format_ok": True})
            for i, c in enumerate(correct)]


def raced_generation(tmp_path, child_rounds: list[bool], control_rounds: list[bool], cap: int = 64):
    """v0000 -> control v0001 and child v0002, both 4/16 on the gate draw (a tie), and a race whose
    rounds (up to ``cap`` tasks) score the child ``child_rounds`` and the control ``control_rounds``."""
    versions = RunVersions(tmp_path / "versions")
    write(versions, "v0000", [], 0, 4, status="kept")
    write(versions, "v0001", ["v0000"], 1, 4)
    write(versions, "v0002", ["v0000"], 1, 4, operator="knobs")
    asked: list[str] = []

    def race(vid: str) -> None:   # what loop/stages/racing.py records: every round up to the cap at once
        asked.append(vid)
        versions.vdir(vid).save_rollouts(RACE, rollouts("r", child_rounds, "heldout"))
        versions.vdir("v0001").save_rollouts(RACE, rollouts("r", control_rounds, "heldout"))

    inputs = GateInputs(versions, GateConfig(race_cap=cap), keep_ties=True, domain="math", history=[],
                        race=race)
    return inputs, asked


def test_an_undecided_child_is_raced_and_promoted_on_the_rounds_it_wins(tmp_path):
    run, asked = raced_generation(tmp_path, [True] * 48, [False] * 48)
    gate_version(run, "v0002")
    meta = run.versions.vdir("v0002").meta()
    race = meta.decision["paired"]["race"]
    assert asked == ["v0002"] and meta.status == "promoted"
    assert race["schedule"] == [16, 32, 64] and race["stopped"] == "promote" and race["n_tasks"] == 32
    assert meta.decision["paired"]["n_tasks"] == 32          # the bootstrap's record reads the same tasks
    assert "racing gate: promoted at look 2 of 3" in meta.decision["paired"]["reason"]
    spend = meta.decision["spend"]
    assert spend["child"]["heldout_rollouts"] == 16 + 48     # the race's rollouts are counted in its spend


def test_a_raced_child_behind_its_control_is_refused_at_the_look_that_shows_it(tmp_path):
    run, _ = raced_generation(tmp_path, [False] * 48, [True] * 48)
    gate_version(run, "v0002")
    meta = run.versions.vdir("v0002").meta()
    assert meta.status == "rejected" and meta.decision["paired"]["race"]["stopped"] == "behind"


def test_a_race_that_never_separates_refuses_at_the_cap_and_drops_the_child(tmp_path):
    same = [i % 3 == 0 for i in range(48)]
    run, _ = raced_generation(tmp_path, same, same)
    gate_version(run, "v0002")
    meta = run.versions.vdir("v0002").meta()
    # a tie after 64 tasks is not kept as a branch (it would be without a race: keep_ties)
    assert meta.status == "rejected" and meta.decision["paired"]["race"]["stopped"] == "cap"
    assert meta.decision["paired"]["n_tasks"] == 64


def test_a_control_raced_further_beside_another_child_pairs_on_the_childs_tasks_only(tmp_path):
    run, _ = raced_generation(tmp_path, [True] * 8, [False] * 48)   # the child's race file holds 8 tasks
    run.race("v0002")
    child, control = (run.versions.vdir(v) for v in ("v0002", "v0001"))
    both = raced(child.rollouts("heldout"), control.rollouts("heldout"), child.rollouts(RACE), control.rollouts(RACE))
    assert [len(side) for side in both] == [24, 24] and [r.task_id for r in both[0]] == [r.task_id for r in both[1]]
    d = gate(child.path, control.path, GateConfig(race_cap=64))
    assert d.paired["race"]["n_tasks"] == 16 and d.paired["race"]["stopped"] == "continue"   # look 2 needs 32
    assert not d.promote and "before it decided" in d.paired["reason"]   # a race cut short refuses, and says so


def test_an_invalid_child_is_never_raced(tmp_path):
    from tests.test_gate_stage import FLAGS_EVERYTHING

    versions = RunVersions(tmp_path / "versions")
    write(versions, "v0000", [], 0, 4, status="kept")
    write(versions, "v0001", ["v0000"], 1, 4)
    write(versions, "v0002", ["v0000"], 1, 4, operator="knobs", genome=FLAGS_EVERYTHING)
    asked: list[str] = []
    run = GateInputs(versions, GateConfig(race_cap=64), keep_ties=True, domain="math", history=[], race=asked.append)
    gate_version(run, "v0002")
    assert asked == [] and versions.vdir("v0002").meta().status == "invalid"


def test_a_race_the_pool_cannot_hold_is_refused_before_any_compute(tmp_path):
    cfg = tiny_cfg(tmp_path / "run", race_cap=24)
    cfg["domain"]["n_heldout"] = 20
    cfg["train"]["eval_size"] = 12          # a gate draw of 6; 24 tasks need 18 beyond eval_size, 8 exist
    with pytest.raises(ConfigError, match=r"race_cap.*needs 18 held-out tasks beyond train.eval_size.*holds 8"):
        validate_resources(parse_config(cfg), loop=True)
    del cfg["train"]["eval_size"]
    with pytest.raises(ConfigError, match="set train.eval_size"):
        validate_resources(parse_config(cfg), loop=True)
    cfg["train"]["eval_size"], cfg["evolution"]["race_cap"] = 12, 6
    with pytest.raises(ConfigError, match="no second look after the gate draw's 6 tasks"):
        validate_resources(parse_config(cfg), loop=True)


@pytest.fixture(scope="module")
def raced_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("race") / "run"
    cfg = tiny_cfg(run_dir, generations=2, children_per_generation=2, race_cap=24)
    cfg["domain"]["n_heldout"] = 40
    cfg["train"]["eval_size"] = 12
    exp = Experiment(parse_config(cfg))
    validate_resources(exp.cfg, loop=True)
    exp.run()
    return exp


def test_the_loop_verifies_race_rounds_from_the_pool_beyond_both_draws(raced_run):
    exp = raced_run
    race_ids = [t.id for t in exp.runtime.race_tasks]
    assert len(race_ids) == 18
    assert not set(race_ids) & {t.id for t in exp.runtime.heldout_tasks}
    children = [v for v in exp.versions() if exp.vdir(v).meta().operator and exp.vdir(v).meta().decision
                and "paired" in exp.vdir(v).meta().decision]
    assert children
    for vid in children:
        meta = exp.vdir(vid).meta()
        race = meta.decision["paired"].get("race")
        assert race is not None and race["schedule"] == [6, 12, 24], meta.decision["paired"]
        raced = [r.task_id for r in exp.vdir(vid).rollouts(RACE)]
        assert raced == race_ids[: len(raced)] and len(raced) == race["n_tasks"] - 6
        if race["n_tasks"] > 6:   # raced: its control was verified on the same tasks with the same seeds
            control = exp.vdir(vid).meta().decision["parent"]
            assert {r.task_id for r in exp.vdir(control).rollouts(RACE)} >= set(raced)
            assert any(f"race {vid} vs" in e for e in exp.state.events)
    assert exp.state.budget_used.get("race_seconds", 0) > 0


def test_a_raced_run_records_its_decisions_on_disk(raced_run):
    exp = raced_run
    for vid in exp.versions():
        path = exp.vdir(vid).path / "decision.json"
        if path.is_file() and exp.vdir(vid).meta().operator:
            assert "race" in json.loads(path.read_text())["paired"]


def test_a_race_killed_between_its_two_sides_resumes_without_repeating_a_task(tmp_path):
    """Killed (kill -9) after one side's round was saved and before the other's: the resumed gate
    verifies only what each side lacks, and both pair on the same tasks."""
    import os
    import subprocess
    import sys

    import yaml

    from tests.loop_runs import check_invariants

    run_dir = tmp_path / "run"
    cfg = tiny_cfg(run_dir, generations=2, children_per_generation=2, race_cap=24)
    cfg["domain"]["n_heldout"], cfg["train"]["eval_size"] = 40, 12
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cli = [sys.executable, "-m", "evotrainer.cli.app"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "EVOTRAINER_CRASH_AT": "race:round-saved"}
    died = subprocess.run(cli + ["run", str(path)], capture_output=True, text=True, env=env, timeout=900)
    assert died.returncode == 137, died.stdout[-1500:] + died.stderr[-1500:]
    env.pop("EVOTRAINER_CRASH_AT")
    done = subprocess.run(cli + ["resume", str(run_dir)], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    state, metas = check_invariants(run_dir)
    assert state.status == "finished"
    raced = [m for m in metas.values() if m.operator and ((m.decision or {}).get("paired") or {}).get("race")]
    assert raced
    for m in raced:
        child = [r.task_id for r in VersionDir(run_dir / "versions" / m.id).rollouts(RACE)]
        control = [r.task_id for r in VersionDir(run_dir / "versions" / m.decision["parent"]).rollouts(RACE)]
        assert len(child) == len(set(child)) and len(control) == len(set(control))
        assert set(child) <= set(control) and len(child) == m.decision["paired"]["race"]["n_tasks"] - 6
        assert m.decision["paired"]["race"]["stopped"] != "continue"   # the resumed race went on to a decision


def test_a_child_judged_against_its_parent_is_not_raced(tmp_path):
    """Its sibling failed before verification, so the gate falls back to the parent, which trained k
    fewer steps: a race would measure those steps, so the fixed gate draw decides."""
    versions = RunVersions(tmp_path / "versions")
    write(versions, "v0000", [], 0, 4, status="kept")
    write(versions, "v0001", ["v0000"], 1, None, status="rejected")
    write(versions, "v0002", ["v0000"], 1, 12, operator="knobs")
    asked: list[str] = []
    run = GateInputs(versions, GateConfig(race_cap=64), keep_ties=True, domain="math", history=[], race=asked.append)
    gate_version(run, "v0002")
    meta = versions.vdir("v0002").meta()
    assert asked == [] and meta.decision["parent"] == "v0000" and "race" not in meta.decision["paired"]
    assert meta.status == "promoted"      # 12/16 against 4/16: the fixed gate's bootstrap decides
