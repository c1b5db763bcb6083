"""The human gate at its four points (diagnosis, design, backtest, completion), through the CLI on a
tiny-random run: the run pauses there with the decision material in ``status`` and in
awaiting_decision.md, approve goes on, revise changes what waits (a broken revision is refused with
nothing changed), abort drops it with its reason, and resume continues there with no version trained
twice and one MLflow run per version."""

import json
from pathlib import Path

import pytest
import yaml

from evotrainer.cli.app import main
from evotrainer.config import ConfigError, parse_config
from evotrainer.genome.program import HarnessProgram
from evotrainer.records.history import human_records, proposals
from evotrainer.records.run_state import load_state
from evotrainer.records.version import VersionDir
from tests.loop_runs import check_invariants, mlflow_runs, tiny_cfg


def start(tmp_path, **evolution):
    run_dir = tmp_path / "run"
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(tiny_cfg(run_dir, **evolution)))
    assert main(["run", str(path)]) == 0
    return run_dir


def vdir(run_dir, vid):
    return VersionDir(run_dir / "versions" / vid)


def waiting(run_dir):
    state = load_state(run_dir)
    return [v for v, x in state.approvals.items() if x == "pending"], state


def status_text(run_dir, capsys):
    capsys.readouterr()
    assert main(["status", str(run_dir)]) == 0
    return capsys.readouterr().out


def snapshot(run_dir, vid):
    """Every file of a version directory, to show that a refused decision changed nothing."""
    root = vdir(run_dir, vid).path
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def trained_once(run_dir, metas):
    """No version trained twice: each trained one has exactly the steps of one generation."""
    for vid, m in metas.items():
        steps = vdir(run_dir, vid).steps()
        assert len(steps) in (0, 1), (vid, len(steps))
        assert (len(steps) == 1) == (m.metrics.get("heldout_accuracy") is not None), vid


def human(run_dir, vid):
    return (vdir(run_dir, vid).meta().decision or {}).get("human") or []


def revised_genome(run_dir, parent, children, tmp_path, name="revised.py"):
    """The parent's harness with one knob no child touched set to a new value: a valid single-factor child."""
    program = HarnessProgram(vdir(run_dir, parent).genome_source())
    touched = {vdir(run_dir, c).meta().factor for c in children}
    knob = next(k for k in ("epsilon", "beta", "epsilon_high") if f"knob:{k}" not in touched)
    path = tmp_path / name
    path.write_text(program.with_knobs(**{knob: 0.123}).source)
    return path, knob


def test_the_points_are_validated_and_true_is_the_old_gate():
    ev = lambda v: parse_config({"evolution": {"human_gate": v}}).evolution.human_gate
    assert ev(True) == ["backtest"] and ev(False) == [] and ev([]) == []
    assert ev(["completion", "diagnosis", "design"]) == ["diagnosis", "design", "completion"]
    with pytest.raises(ConfigError, match=r"evolution.human_gate.*'diagnose'.*diagnosis, design, backtest, completion"):
        ev(["diagnose"])


def test_diagnosis_pauses_before_proposing_takes_a_note_and_abort_stops_the_run(tmp_path, capsys):
    run_dir = start(tmp_path, human_gate=["diagnosis"], generations=3, operators={"knobs": 1.0})
    ids, state = waiting(run_dir)
    assert state.status == "paused" and state.stage == "propose" and state.generation == 0
    assert ids == state.survivors and all(state.gates[v].point == "diagnosis" for v in ids)
    before = state.next_id                       # no child proposed yet
    out = status_text(run_dir, capsys)
    assert "diagnosis" in out and "Health report" in out and "evotrainer approve" in out
    assert "Health report" in (run_dir / "awaiting_decision.md").read_text()
    assert main(["resume", str(run_dir)]) == 0   # still waiting: nothing is done
    assert load_state(run_dir).next_id == before and load_state(run_dir).status == "paused"
    assert main(["revise", str(run_dir), ids[0], "--genome", "x.py"]) == 2   # not what diagnosis takes
    assert human(run_dir, ids[0]) == []
    note = "the learning rate looks too low; try raising it"
    noted = ids[0]
    assert main(["revise", str(run_dir), ids[0], "--note", note, "--by", "ada"]) == 0
    rec = human(run_dir, ids[0])[-1]
    assert rec["point"] == "diagnosis" and rec["action"] == "revise" and rec["note"] == note and rec["by"] == "ada"
    assert load_state(run_dir).status == "running"
    assert main(["resume", str(run_dir)]) == 0   # the children of gen 1, then the diagnosis of gen 1
    ids, state = waiting(run_dir)
    assert state.status == "paused" and state.stage == "propose" and state.generation == 1
    children = [v for v in (f"v{i:04d}" for i in range(state.next_id)) if vdir(run_dir, v).meta().operator]
    assert children, "the note's generation proposed children"
    for c in children:   # the operators saw the person's note among the parent's alerts
        assert "person's note" in json.loads((vdir(run_dir, c).path / "intervention.json").read_text())["evidence"]["alerts"]
    assert main(["abort", str(run_dir), "--reason", "enough for today"]) == 0   # all survivors: the run stops
    state, metas = check_invariants(run_dir)
    assert state.status == "stopped" and "enough for today" in state.stop_reason and state.generation == 1
    assert state.final is not None                # stopped cleanly: the final pick was made
    assert all(h["action"] == "abort" for v in ids for h in human(run_dir, v)[-1:])
    trained_once(run_dir, metas)
    n = state.next_id
    assert main(["resume", str(run_dir)]) == 0 and load_state(run_dir).next_id == n   # nothing more
    # The decisions reach MLflow with the version's meta.json.
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{run_dir}/mlflow.db")
    runs = {r.data.tags["evotrainer.version_id"]: r.info.run_id for r in mlflow_runs(run_dir)}
    for vid, actions in ((noted, ["revise"]), (ids[0], ["abort"])):
        local = client.download_artifacts(runs[vid], "meta.json", str(tmp_path / vid))
        assert [h["action"] for h in json.loads(Path(local).read_text())["decision"]["human"]][-1:] == actions[-1:]


def test_design_pauses_before_the_backtest_and_revise_replaces_the_genome(tmp_path, capsys):
    run_dir = start(tmp_path, human_gate=["design", "backtest"], generations=2, operators={"knobs": 1.0})
    ids, state = waiting(run_dir)
    assert state.status == "paused" and state.stage == "train" and state.generation == 1 and len(ids) == 2
    for c in ids:
        assert vdir(run_dir, c).meta().status == "awaiting_approval" and state.gates[c].point == "design"
        assert not (vdir(run_dir, c).path / "backtest.json").exists()   # not backtested yet
    out = status_text(run_dir, capsys)
    assert "design" in out and "hypothesis:" in out and "```diff" in out and "expected effect" in out
    a, b = ids
    parent = vdir(run_dir, a).meta().parents[0]
    broken = tmp_path / "broken.py"
    broken.write_text(vdir(run_dir, parent).genome_source() + "\nimport socket\n")
    before = snapshot(run_dir, a)
    assert main(["revise", str(run_dir), a, "--genome", str(broken)]) == 2
    assert snapshot(run_dir, a) == before and load_state(run_dir).approvals[a] == "pending"
    path, knob = revised_genome(run_dir, parent, ids, tmp_path)
    assert main(["revise", str(run_dir), a, "--genome", str(path), "--hypothesis", "If epsilon moves, X, because Y."]) == 0
    meta = vdir(run_dir, a).meta()
    assert meta.factor == f"knob:{knob}" and meta.knobs[knob] == 0.123
    assert meta.intervention["hypothesis"] == "If epsilon moves, X, because Y."
    assert vdir(run_dir, a).genome_source() == path.read_text()
    assert (vdir(run_dir, a).path / "revisions" / "r1" / "genome.py").read_bytes() == before["genome.py"]
    assert load_state(run_dir).approvals[a] == "pending"      # revised: it waits for approve or abort
    assert main(["abort", str(run_dir), b, "--reason", "not this knob"]) == 0
    assert main(["approve", str(run_dir), a]) == 0
    n = load_state(run_dir).next_id
    assert main(["resume", str(run_dir)]) == 0   # backtested now, then it waits at the backtest point
    ids, state = waiting(run_dir)
    assert ids == [a] and state.gates[a].point == "backtest" and state.status == "paused"
    assert (vdir(run_dir, a).path / "backtest.json").is_file() and not vdir(run_dir, a).steps()
    assert main(["resume", str(run_dir)]) == 0 and load_state(run_dir).status == "paused"   # still waiting
    assert "backtest: ACCEPT" in status_text(run_dir, capsys)
    assert main(["approve", str(run_dir)]) == 0
    assert main(["resume", str(run_dir)]) == 0
    state, metas = check_invariants(run_dir)
    assert state.status == "finished" and state.next_id == n
    assert metas[b].status == "rejected" and "not this knob" in metas[b].decision["reasons"][0]
    assert metas[b].metrics.get("heldout_accuracy") is None
    assert (vdir(run_dir, a).path / "backtest.json").is_file()   # backtested once approved
    assert metas[a].metrics.get("heldout_accuracy") is not None
    assert [(h["point"], h["action"]) for h in metas[a].decision["human"]] == [
        ("design", "revise"), ("design", "approve"), ("backtest", "approve")]   # kept through the gate
    trained_once(run_dir, metas)


def test_backtest_pauses_before_training_and_a_revision_is_backtested_again(tmp_path, capsys):
    run_dir = start(tmp_path, human_gate=["backtest"], generations=2, operators={"knobs": 1.0})
    ids, state = waiting(run_dir)
    assert state.status == "paused" and len(ids) == 2 and all(state.gates[c].point == "backtest" for c in ids)
    out = status_text(run_dir, capsys)
    assert "backtest: ACCEPT" in out and "hypothesis:" in out
    a, b = ids
    parent = vdir(run_dir, a).meta().parents[0]
    before = snapshot(run_dir, a)
    assert main(["revise", str(run_dir), a, "--genome", vdir(run_dir, b).path.as_posix() + "/genome.py"]) == 2
    assert snapshot(run_dir, a) == before                       # a known genome: refused, nothing changed
    path, knob = revised_genome(run_dir, parent, ids, tmp_path)
    bt_before = json.loads(before["backtest.json"])
    assert main(["revise", str(run_dir), a, "--genome", str(path), "--reason", "a smaller step"]) == 0
    bt_after = json.loads((vdir(run_dir, a).path / "backtest.json").read_text())
    assert bt_after["candidate"] != bt_before["candidate"]       # backtested again, on the new genome
    assert vdir(run_dir, a).meta().factor == f"knob:{knob}"
    assert main(["approve", str(run_dir)]) == 0                 # both
    assert main(["resume", str(run_dir)]) == 0
    state, metas = check_invariants(run_dir)
    assert state.status == "finished"
    assert all(metas[c].metrics.get("heldout_accuracy") is not None for c in ids)
    assert [h["action"] for h in metas[a].decision["human"]] == ["revise", "approve"]
    assert any(h.point == "backtest" and h.version == a and h.reason == "a smaller step"
               for h in human_records(state.history))
    trained_once(run_dir, metas)


def test_completion_pauses_after_the_gate_and_a_person_can_hold_a_verdict_back(tmp_path, capsys):
    run_dir = tmp_path / "run"
    cfg = tiny_cfg(run_dir, human_gate=["completion"], generations=2, operators={"knobs": 1.0},
                   children_per_generation=3, population_size=3)
    cfg["domain"]["n_heldout"] = 12                 # a gate draw the paired test can judge (ties are kept)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["run", str(path)]) == 0
    ids, state = waiting(run_dir)
    assert state.status == "paused" and state.stage == "select" and state.generation == 1 and len(ids) == 3
    assert all(state.gates[c].point == "completion" for c in ids)
    assert not any(h.child in ids and h.outcome != "accepted" for h in proposals(state.history))   # not counted yet
    out = status_text(run_dir, capsys)
    assert "completion" in out and "the gate's outcome" in out and "hypothesis verdict" in out
    statuses = {c: vdir(run_dir, c).meta().status for c in ids}
    assert main(["resume", str(run_dir)]) == 0   # still waiting: nothing selected, nothing counted
    assert load_state(run_dir).stage == "select" and load_state(run_dir).status == "paused"
    kept = [c for c in ids if statuses[c] in ("kept", "promoted")]
    assert kept, statuses
    rejected = [c for c in ids if statuses[c] == "rejected"]
    if rejected:   # a person may hold back, never promote: refused, nothing changed
        before = snapshot(run_dir, rejected[0])
        assert main(["revise", str(run_dir), rejected[0], "--outcome", "kept"]) == 2
        assert snapshot(run_dir, rejected[0]) == before
    a = kept[0]
    assert main(["revise", str(run_dir), a, "--outcome", "rejected", "--reason", "it only games the format"]) == 0
    assert vdir(run_dir, a).meta().status == "rejected"
    others = [c for c in ids if c != a]
    assert main(["abort", str(run_dir), others[0], "--reason", "too costly"]) == 0
    n = load_state(run_dir).next_id
    assert main(["approve", str(run_dir), others[1]]) == 0
    assert main(["resume", str(run_dir)]) == 0
    state, metas = check_invariants(run_dir)
    assert state.status == "finished" and state.next_id == n     # nothing trained again
    assert metas[a].status == "rejected" and "it only games the format" in metas[a].decision["reasons"][-1]
    assert metas[a].decision["human"][-1]["outcome"] == {"from": statuses[a], "to": "rejected"}
    assert metas[others[0]].status == "rejected" and "too costly" in metas[others[0]].decision["reasons"][0]
    assert a not in state.survivors and others[0] not in state.survivors
    outcome = {h.child: h.outcome for h in proposals(state.history) if h.child in ids}
    assert outcome[a] == "rejected" and outcome[others[1]] == metas[others[1]].status   # counted after the decision
    trained_once(run_dir, metas)


def test_a_run_from_before_the_four_points_is_migrated_once_on_load(tmp_path, capsys):
    """An older CLI kept no point per decision (backtest was the only one) and left a child it approved
    awaiting approval. Loading the run migrates it once: the decision is at backtest, the approved child
    is pending and trains on resume; a reader (status) migrates in memory only."""
    run_dir = start(tmp_path, human_gate=True, generations=2, operators={"knobs": 1.0})
    ids, state = waiting(run_dir)
    assert len(ids) >= 2 and all(state.gates[c].point == "backtest" for c in ids)   # 2 children by default
    raw = json.loads((run_dir / "state.json").read_text())
    old = ids[0]
    raw["gates"], raw["approvals"][old] = {}, "approved"     # as the older CLI wrote it
    raw["status"] = "paused"                                      # the others still await a decision
    (run_dir / "state.json").write_text(json.dumps(raw))
    assert vdir(run_dir, old).meta().status == "awaiting_approval"
    status_text(run_dir, capsys)                                   # a reader: nothing written
    assert json.loads((run_dir / "state.json").read_text())["gates"] == {}
    assert vdir(run_dir, old).meta().status == "awaiting_approval"
    assert main(["approve", str(run_dir)] + ids[1:]) == 0          # opens the run for writing: migrated, saved
    migrated = load_state(run_dir)
    assert {c: migrated.gates[c].point for c in ids} == dict.fromkeys(ids, "backtest")
    assert vdir(run_dir, old).meta().status == "pending"
    assert main(["resume", str(run_dir)]) == 0
    state, metas = check_invariants(run_dir)
    assert state.status == "finished" and metas[old].metrics.get("heldout_accuracy") is not None   # it trained


class Crashed(BaseException):
    """Stands in for os._exit(137) in-process: nothing after the crash point runs or saves."""


def test_a_kill_inside_selection_after_completion_decisions_counts_each_child_once(tmp_path, monkeypatch):
    """Decided at completion, the run resumes, plans its selection and prunes, and is killed before
    the state moves on. Resumed again, the completion checkpoint is behind it: a child the plan pruned
    keeps the outcome the gate and the person gave it (the history is not rewritten to "pruned", the
    operators are not told twice)."""
    from evotrainer.loop import crash

    run_dir = tmp_path / "run"
    cfg = tiny_cfg(run_dir, human_gate=["completion"], generations=2, operators={"knobs": 1.0},
                   children_per_generation=2, population_size=1)
    cfg["domain"]["n_heldout"] = 12
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["run", str(path)]) == 0
    ids, state = waiting(run_dir)
    assert len(ids) == 2 and state.stage == "select"
    assert main(["approve", str(run_dir)]) == 0
    gated = {c: vdir(run_dir, c).meta().status for c in ids}

    def die():
        raise Crashed
    monkeypatch.setattr(crash, "_die", die)
    monkeypatch.setenv(crash.ENV, "select:pruned")
    with pytest.raises(Crashed):
        main(["resume", str(run_dir)])
    monkeypatch.delenv(crash.ENV)
    assert load_state(run_dir).stage == "select"
    assert main(["resume", str(run_dir)]) == 0
    state, metas = check_invariants(run_dir)
    assert any(metas[c].status == "pruned" for c in ids) or any(metas[v].status == "pruned" for v in metas)
    outcomes = [(h.child, h.outcome) for h in proposals(state.history) if h.child in ids]
    assert sorted(outcomes) == sorted(gated.items())      # once each, as gated and approved
