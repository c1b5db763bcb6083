"""What the command line does with inputs it cannot use and the files it writes: a garbled or mistyped
--evidence file, config defaults the math generator can satisfy (and how many tasks fit when not),
run --resume with a config that is not the run's own, plots written atomically, and the lineage
command's link to the genealogy table."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from evotrainer.cli.loop import first_difference
from evotrainer.config import parse_config
from evotrainer.domains.math.tasks import level_capacity, make_splits
from tests.cli_process import REFERENCE, cli
from tests.loop_runs import build_run, tiny_cfg


def test_mutate_names_a_garbled_evidence_file(tmp_path):
    bad = tmp_path / "report.json"
    bad.write_text('{"health_report": {"metrics": {"dead_group_ratio": 0.5,}}}')
    r = cli(["mutate", REFERENCE, "--operator", "knobs", "--evidence", bad], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and str(bad) in line and "not valid JSON" in line and "line 1 column" in line
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    r = cli(["mutate", REFERENCE, "--operator", "knobs", "--evidence", listed], tmp_path)
    assert r.returncode == 2 and str(listed) in r.stderr and "JSON object" in r.stderr and "list" in r.stderr


@pytest.mark.parametrize("content, needle", [
    ('{"metrics": "x"}', "field 'metrics' must be an object of numbers"),
    ('{"metrics": {"dead_group_ratio": "high"}}', "field 'metrics' must be an object of numbers"),
    ('{"alerts": 5}', "field 'alerts' must be a list"),
    ('{"health_report": {}, "skills": 5}', "field 'skills' must be a list of objects"),
    ('{"health_report": {}, "history": "x"}', "field 'history' must be a list of objects"),
    ('{"health_report": {}, "known_hashes": 5}', "field 'known_hashes' must be a list"),
    ('{"health_report": 5}', "field 'health_report' must be an object"),
])
def test_mutate_names_an_evidence_field_of_the_wrong_type(tmp_path, content, needle):
    bad = tmp_path / "ev.json"
    bad.write_text(content)
    r = cli(["mutate", REFERENCE, "--operator", "library", "--evidence", bad], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-1500:]
    assert str(bad) in r.stderr and needle in r.stderr, r.stderr


def test_empty_config_defaults_fit_the_generator():
    from evotrainer.loop.tools.validate import validate_resources

    validate_resources(parse_config({}), loop=True)        # what `run` checks before any compute
    d = parse_config({}).domain
    splits = make_splits(d.n_train, d.n_heldout, d.n_test, d.difficulty, d.seed)
    assert [len(splits[s]) for s in ("train", "heldout", "test")] == [d.n_train, d.n_heldout, d.n_test]
    assert sum(t.difficulty == 1 for s in splits.values() for t in s) <= level_capacity(1) == 100


def test_too_many_level_1_tasks_say_how_many_fit():
    with pytest.raises(ValueError) as e:
        make_splits(201, 0, 0, [1, 2], 0)
    msg = str(e.value)
    assert "only 100 distinct problems" in msg and "201 tasks" in msg and "101 of them" in msg
    assert "at most 200 tasks" in msg
    assert len(make_splits(200, 0, 0, [1, 2], 0)["train"]) == 200          # the bound it names is exact
    with pytest.raises(ValueError, match="at most 201 tasks"):               # level 2 first: one more fits
        make_splits(202, 0, 0, [2, 1], 0)
    assert len(make_splits(201, 0, 0, [2, 1], 0)["train"]) == 201


def test_first_difference_names_the_dotted_field():
    a = parse_config(tiny_cfg("runs/x")).model_dump(mode="json")
    b = parse_config({**tiny_cfg("runs/x"), "evolution": {**tiny_cfg("x")["evolution"], "generations": 9}})
    assert first_difference(a, b.model_dump(mode="json")) == "evolution.generations"
    assert first_difference(a, a) is None


def test_run_resume_refuses_a_different_config(tmp_path):
    """A finished tiny run; `run --resume` with its own config shows it, with another one is refused."""
    run_dir = tmp_path / "run"
    cfg = tiny_cfg(run_dir, generations=1, operators={"knobs": 1.0})
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli(["run", path], tmp_path).returncode == 0
    assert cli(["run", path, "--resume"], tmp_path).returncode == 0
    # status (which writes nothing) prints the URL that opens the genealogy table of this run's store
    from evotrainer.tracking.lineage import LineageTracker

    status = cli(["status", run_dir], tmp_path)
    eid = LineageTracker(run_dir).experiment_id
    assert f"/#/experiments/{eid}/runs?viewStateShareKey=evotrainer&workflowType=machine_learning" in status.stdout
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({**cfg, "grpo": {**cfg["grpo"], "num_generations": 4}}))
    r = cli(["run", other, "--resume"], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1
    assert "grpo.num_generations" in line and "(4 here, 2 in the run)" in line and str(other) in line
    assert f"evotrainer resume {run_dir}" in line
    # another location of the same config is not a difference: --run-dir points at the run itself
    moved = tmp_path / "moved.yaml"
    moved.write_text(yaml.safe_dump({**cfg, "run_dir": "elsewhere"}))
    assert cli(["run", moved, "--run-dir", run_dir, "--resume"], tmp_path).returncode == 0


def test_plots_are_written_atomically(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from evotrainer.tracking.plots import fitness_plot, genealogy_plot

    build_run(tmp_path)
    png, _ = genealogy_plot(tmp_path)
    fit = fitness_plot(tmp_path)
    before = {p: p.read_bytes() for p in (png, fit)}
    assert all(b.startswith(b"\x89PNG") for b in before.values())
    assert png.stat().st_mode & 0o777 == 0o644

    def half_then_fail(self, fname, *a, **k):       # a writer that dies mid-file
        fname.write(b"\x89PNG half")
        raise OSError("disk full")

    monkeypatch.setattr(Figure, "savefig", half_then_fail)
    for draw in (genealogy_plot, fitness_plot):
        with pytest.raises(OSError, match="disk full"):
            draw(tmp_path)
    assert {p: p.read_bytes() for p in (png, fit)} == before            # the old plots are whole
    assert sorted(x.name for x in Path(tmp_path, "plots").iterdir()) == [
        "fitness.png", "genealogy.html", "genealogy.png"]               # no temp file left behind



def test_lineage_prints_the_url_of_the_genealogy_table(tmp_path):
    from evotrainer.tracking.lineage import LineageTracker

    build_run(tmp_path)
    r = cli(["lineage", tmp_path], tmp_path)
    assert r.returncode == 0 and "viewStateShareKey" not in r.stdout        # nothing recorded yet
    eid = LineageTracker(tmp_path).experiment_id
    r = cli(["lineage", tmp_path], tmp_path)
    assert f"/#/experiments/{eid}/runs?viewStateShareKey=evotrainer&workflowType=machine_learning" in r.stdout
