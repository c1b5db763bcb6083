"""`evotrainer strategies`: per domain, which interventions were proposed, promoted, confirmed as
validated skills and retained in the final pick, read from run records alone and never written.

Two kinds of runs: records written with the project's own record classes (RunState, BranchVersion,
VersionDir, SkillLibrary, the run-directory marker) where every count is known in advance, and two
real tiny runs (math and code, the tiny random model, real sandbox and MLflow) whose records the
command must read as the loop wrote them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from evotrainer.cli.app import main
from evotrainer.config import parse_config
from evotrainer.loop.knowledge.skills import SkillLibrary
from evotrainer.records import history
from evotrainer.records.history import from_dict
from evotrainer.records.run_dir import RunDirError, claim
from evotrainer.records.run_state import RunState, load_state, save_state
from evotrainer.records.version import BranchVersion, VersionDir, write_atomic
from evotrainer.tracking.strategies import read_runs, strategy_table, tabulate
from tests.loop_runs import tiny_cfg

DAPO = "-    return [float(r.visible['correct']) for r in rollouts]\n+    return [overlong(r) for r in rollouts]\n"
PROMOTE = {"promote": True, "valid": True, "paired": {"mean_delta": 0.1, "ci_low": 0.02, "ci_high": 0.2}}
REFUSE = {"promote": False, "valid": True, "paired": {"mean_delta": -0.1, "ci_low": -0.2, "ci_high": -0.01}}
TIE = {"promote": False, "valid": True, "paired": {"mean_delta": 0.0, "ci_low": -0.1, "ci_high": 0.1}}


class RunWriter:
    """A run directory written with the loop's record classes: marker, config, versions, state, skills."""

    def __init__(self, path: Path, domain: str):
        claim(path, "run")
        cfg = tiny_cfg(path)
        cfg["domain"].update(name=domain, **({"difficulty": 1, "n_train": 8, "n_heldout": 4, "n_test": 2}
                                             if domain == "code" else {}))
        write_atomic(path / "config.json", parse_config(cfg).model_dump_json(indent=2))
        self.path, self.domain = path, domain
        self.state = RunState()
        self.skills = SkillLibrary(path / "skills.json", validate_after=2)
        self.version(None)                                      # the seed

    def version(self, parent: str | None, operator: str | None = None, factor: str | None = None,
                entry: str | None = None, decision: dict | None = None, status: str = "kept",
                extra_parent: str | None = None, skill: bool = False, generation: int = 0) -> str:
        vid = self.state.new_id()
        parents = ([parent] if parent else []) + ([extra_parent] if extra_parent else [])
        intervention = None
        if operator:
            intervention = {"factor": factor, "factors": [factor], "operator": operator,
                            "diff": DAPO if entry == "dapo_overlong_shaping" else f"-old {vid}\n+new {vid}\n",
                            "details": {"entry": entry} if entry else {}}
        VersionDir(self.path / "versions" / vid).save_meta(BranchVersion(
            id=vid, base_model="tiny-random", genome_hash=f"h{vid}", parents=parents, intervention=intervention,
            status=status, generation=generation, operator=operator, factor=factor,
            decision={**decision, "child": vid} if decision else None))
        if operator:
            record = {"generation": generation, "parent": parent, "operator": operator, "factor": factor,
                      "outcome": status if status != "pruned" else "promoted", "child": vid}
            if entry:
                record["entry"] = entry
            if operator == "crossover":
                record["compound"] = factor
            self.state.history.append(from_dict(record))
        if skill:
            self.skills.record_confirmed(intervention, decision, self.domain, {}, version=vid, parent=parent)
        return vid

    def record(self, **record) -> None:
        self.state.history.append(from_dict(record))

    def finish(self, final: str | None) -> Path:
        self.state.final = {"version": final, "test_accuracy": 0.5} if final else None
        save_state(self.path, self.state)
        return self.path


def math_run(path: Path) -> Path:
    """dapo promoted twice and validated as a skill, kept on the final lineage; learning_rate moved three
    times, and only the last move (on the final pick) is in the final harness."""
    w = RunWriter(path, "math")
    dapo = w.version("v0000", "library", "hook:reward", "dapo_overlong_shaping", PROMOTE, "promoted", skill=True,
                     generation=1)                                                             # v0001
    w.version("v0000", "knobs", "knob:learning_rate", decision=REFUSE, status="rejected", generation=1)  # v0002
    w.record(generation=1, parent="v0000", operator="library", factor="hook:reward", entry="format_partial_credit",
             outcome="backtest_rejected", reasons=["predicted no change"])
    w.record(generation=1, parent="v0000", outcome="operator_rejected", kind="parse", reason="no JSON")
    lr = w.version(dapo, "knobs", "knob:learning_rate", decision=PROMOTE, status="promoted", generation=2)  # v0003
    w.record(generation=2, parent="v0002", operator="revert", factor="revert", outcome="reverted", to="v0000",
             reason="regressed")
    groups = w.version(lr, "llm_diff", "hook:keep_groups", decision=TIE, status="kept", generation=3)  # v0004
    final = w.version(groups, "knobs", "knob:learning_rate", decision=TIE, status="kept", generation=4)  # v0005
    # the same dapo change confirmed again on another branch, which selection pruned afterwards
    w.version("v0000", "library", "hook:reward", "dapo_overlong_shaping", PROMOTE, "pruned", skill=True,
              generation=2)                                                                     # v0006
    return w.finish(final)


def code_run(path: Path) -> Path:
    """A crossover child compounds lower_temperature into the prompt branch: the final pick retains both;
    the prompt change is a skill with one confirmation, not validated."""
    w = RunWriter(path, "code")
    prompt = w.version("v0000", "llm_diff", "hook:prompt", decision=PROMOTE, status="promoted", skill=True,
                       generation=1)                                                            # v0001
    temp = w.version("v0000", "library", "knob:temperature", "lower_temperature", PROMOTE, "promoted",
                     generation=1)                                                              # v0002
    final = w.version(prompt, "crossover", "knob:temperature", decision=PROMOTE, status="promoted",
                      extra_parent=temp, generation=2)                                          # v0003
    return w.finish(final)


def unfinished_math_run(path: Path) -> Path:
    w = RunWriter(path, "math")
    w.version("v0000", "library", "hook:reward", "dapo_overlong_shaping", PROMOTE, "promoted", generation=1)
    return w.finish(None)


def snapshot(*dirs: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under the runs with its mtime and bytes: a reader must change neither."""
    return {str(p): (p.stat().st_mtime_ns, p.read_bytes()) for d in dirs for p in sorted(d.rglob("*"))
            if p.is_file()}


def counts(rows, domain: str) -> dict[str, tuple[int, ...]]:
    return {r.intervention: (r.runs, r.proposed, r.children, r.promoted, r.confirmed, r.retained)
            for r in rows if r.domain == domain}


@pytest.fixture
def runs(tmp_path):
    return math_run(tmp_path / "math"), code_run(tmp_path / "code"), unfinished_math_run(tmp_path / "math2")


def test_counts_per_domain_from_the_records(runs):
    rows = strategy_table(runs)
    #                          runs, proposed, children, promoted, confirmed, retained
    assert counts(rows, "math") == {
        "dapo_overlong_shaping": (2, 3, 3, 3, 2, 1),      # v0001 retained; v0006 pruned after its promotion
        "knob:learning_rate": (1, 3, 3, 1, 0, 1),         # v0003 promoted but v0005 moved the knob again
        "keep_groups": (1, 1, 1, 0, 0, 1),
        "format_partial_credit": (1, 1, 0, 0, 0, 0),      # rejected by the backtest: proposed only
    }
    # The crossover child counts for the entry that made the change it took (lower_temperature), and a
    # skill confirmed once is not validated.
    assert counts(rows, "code") == {"lower_temperature": (1, 2, 2, 2, 0, 1), "prompt": (1, 1, 1, 1, 0, 1)}
    assert [r.domain for r in rows] == ["math"] * 4 + ["code"] * 2
    assert rows[0].intervention == "dapo_overlong_shaping" and rows[0].factor == "reward"

    by_factor = tabulate(read_runs(runs), by="factor")
    assert counts(by_factor, "math")["reward"] == (2, 4, 3, 3, 2, 1)
    assert counts(by_factor, "code")["knob:temperature"] == (1, 2, 2, 2, 0, 1)

    math, code, unfinished = read_runs(runs)
    assert math.lineage == ["v0005", "v0004", "v0003", "v0001", "v0000"] and code.final == "v0003"
    assert unfinished.final is None and any("no final pick" in n for n in unfinished.notes)


def test_the_command_prints_writes_plot_and_json_and_never_touches_the_runs(runs, tmp_path, capsys):
    before = snapshot(*runs)
    png, out = tmp_path / "out" / "strategies.png", tmp_path / "out" / "strategies.json"
    assert main(["strategies", *map(str, runs), "--plot", str(png), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "dapo_overlong_shaping" in text and "lower_temperature" in text
    assert "math: 2 run(s), 1 with a final pick" in text and "no final pick" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    data = json.loads(out.read_text())
    code_rows = {r["intervention"]: r for r in data["rows"] if r["domain"] == "code"}
    assert code_rows["prompt"]["retained"] == 1 and [r["domain"] for r in data["runs"]] == ["math", "code", "math"]
    assert snapshot(*runs) == before, "the command wrote into a run"


def test_refuses_what_is_not_a_run_and_writes_nothing(runs, tmp_path, capsys):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "state.json").write_text("{}")
    before = snapshot(*runs, plain)
    version = runs[0] / "versions" / "v0001"
    cases = [
        ([str(plain)], "not a directory evotrainer wrote"),
        ([str(version)], "not a directory evotrainer wrote"),
        ([str(tmp_path / "missing")], "does not exist"),
        ([str(runs[0]), str(runs[0]) + "/"], "same run"),
        ([str(runs[0]), "--plot", str(runs[1] / "plots" / "s.png")], "inside the run"),
        ([str(runs[0]), str(runs[1]), "--json", str(runs[1] / "s.json")], "inside the run"),
    ]
    for argv, needle in cases:
        assert main(["strategies", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and needle in err and "Traceback" not in err, (argv, err)
    assert snapshot(*runs, plain) == before
    assert not (runs[1] / "plots").exists() and not (tmp_path / "missing").exists()

    # A run whose state is not a run state is refused by the record class, naming the file.
    damaged = tmp_path / "damaged"
    RunWriter(damaged, "math").finish(None)
    write_atomic(damaged / "state.json", json.dumps({"history": "lost"}))
    with pytest.raises(RunDirError, match="state.json"):
        strategy_table([damaged])


def _tiny_run(path: Path, domain: str) -> Path:
    from evotrainer.loop.experiment import Experiment

    cfg = tiny_cfg(path, generations=2, operators={"library": 1.0, "knobs": 1.0})
    cfg["domain"]["name"] = domain
    if domain == "code":
        cfg["domain"].update(difficulty=1, n_train=8, n_heldout=4, n_test=2)
        cfg["train"]["eval_max_new_tokens"] = 24
    assert Experiment(parse_config(cfg)).run().status == "finished"
    return path


def test_real_tiny_runs_of_two_domains(tmp_path, capsys):
    runs = [_tiny_run(tmp_path / "math", "math"), _tiny_run(tmp_path / "code", "code")]
    before = snapshot(*runs)
    out = tmp_path / "report.json"
    assert main(["strategies", *map(str, runs), "--json", str(out), "--plot", str(tmp_path / "s.png")]) == 0
    capsys.readouterr()
    assert snapshot(*runs) == before and (tmp_path / "s.png").is_file()
    data = json.loads(out.read_text())
    for run in runs:
        state = load_state(run)
        domain = json.loads((run / "config.json").read_text())["domain"]["name"]
        rows = [r for r in data["rows"] if r["domain"] == domain]
        metas = [BranchVersion.load(p) for p in (run / "versions").iterdir()]
        proposals = [h for h in history.proposals(state.history) if h.factor]
        assert proposals, "the library and knob operators proposed"
        assert sum(r["proposed"] for r in rows) == len(proposals)
        assert sum(r["children"] for r in rows) == sum(m.operator is not None for m in metas)
        assert sum(r["promoted"] for r in rows) == sum(bool((m.decision or {}).get("promote")) for m in metas
                                                        if m.operator)
        final = state.final["version"]
        on_lineage = set()
        while final and final != "start":
            meta = BranchVersion.load(run / "versions" / final)
            on_lineage |= {final} if meta.operator else set()
            final = meta.parents[0] if meta.parents else None
        assert sum(r["retained"] for r in rows) <= len(on_lineage)
        assert bool(on_lineage) == any(r["retained"] for r in rows)
    assert {r["domain"] for r in data["runs"]} == {"math", "code"}
    assert os.access(out, os.R_OK)
