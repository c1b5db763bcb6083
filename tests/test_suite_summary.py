"""The benchmark suite: it runs end to end on the tiny model and resumes, its summary follows from the
raw results alone, and the README's headline table is the committed summary's (this test fails when
either differs from what the raw files give)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import suite_summary  # noqa: E402
from suite_summary import readme_table, summarize, verdict  # noqa: E402


def test_the_readme_table_is_the_committed_summary_of_the_committed_raw_results():
    committed = json.loads(suite_summary.SUMMARY.read_text())
    fresh = summarize(planned=committed["runs"].get("planned") and {"all": committed["runs"]["planned"]})
    assert fresh == committed, "benchmarks/results/suite_summary.json is stale: run `python benchmarks/suite.py summary`"
    readme = suite_summary.README.read_text()
    block = readme.split(suite_summary.START)[1].split(suite_summary.END)[0].strip()
    assert block == readme_table(committed), "README's suite table is stale: run `python benchmarks/suite.py summary`"


def row(seed, scores, wall=60.0):
    return {"seed": seed, "test_scores": {t: [v] for t, v in scores.items()},
            "test": sum(scores.values()) / len(scores), "wall_s": wall, "lineage_steps": 8, "children": []}


def setting(path: Path, name: str, untrained: float, runs: dict) -> None:
    path.write_text(json.dumps({"setting": name, "why": "w", "steps": 8, "protocol": "equal total training steps",
                                "untrained": {"test": untrained, "n_test": 40}, "runs": runs,
                                "scored_on_test": [{"variant": m} for m in runs]}))


def tasks(n_right, n=40):
    return {f"t{i}": float(i < n_right) for i in range(n)}


def test_summary_schema_deltas_and_the_verdict(tmp_path):
    # evolve gains 8 tasks of 40 on every seed over both baselines in one setting, ties in the other.
    setting(tmp_path / "a.json", "a", 0.25, {
        "reference": [row(s, tasks(10)) for s in range(4)],
        "evolve": [row(s, tasks(18)) for s in range(4)],
        "random-library": [row(s, tasks(10 - (s == 0) * 3)) for s in range(4)]})
    setting(tmp_path / "b.json", "b", 0.5, {
        "reference": [row(s, tasks(20)) for s in range(3)], "evolve": [row(s, tasks(20)) for s in range(3)]})
    s = summarize(tmp_path, planned={"a": 12, "b": 9})
    a = s["settings"]["a"]
    assert a["modes"]["evolve"]["mean"] == 0.45 and a["modes"]["reference"]["below_untrained"] == 0.0
    assert a["modes"]["random-library"]["below_untrained"] == 0.25          # seed 0 picked 7 of 40 < 0.25
    d = a["delta"]["evolve-reference"]
    assert d["mean"] == 0.2 and d["ci90"][0] > 0 and list(d["per_seed"].values()) == [0.2] * 4
    assert s["settings"]["b"]["delta"]["evolve-reference"]["ci90"] == [0.0, 0.0]
    assert "evolve-random-library" not in s["settings"]["b"]["delta"]
    pooled = s["pooled"]["delta"]
    assert pooled["evolve-reference"]["n_seeds"] == 7 and pooled["evolve-random-library"]["n_seeds"] == 4
    assert s["runs"] == {"done": 4 * 3 + 3 * 2, "planned": 21}
    assert "does not beat" not in verdict(s) and "beats both" in verdict(s)
    table = readme_table(s)
    assert table.count("\n| a |") == 1 and "**pooled**" in table and "25%" in table
    # A loss on the other setting's seeds pulls the pooled lower bound below 0: the verdict says so first.
    setting(tmp_path / "b.json", "b", 0.5, {
        "reference": [row(s, tasks(20)) for s in range(3)], "evolve": [row(s, tasks(12)) for s in range(3)],
        "random-library": [row(s, tasks(20)) for s in range(3)]})
    lost = summarize(tmp_path)
    assert lost["pooled"]["delta"]["evolve-reference"]["ci90"][0] < 0
    assert readme_table(lost).startswith("**`evolve` as shipped does not beat both")


def test_too_few_runs_says_so(tmp_path):
    setting(tmp_path / "a.json", "a", 0.25, {"reference": [row(0, tasks(10))]})
    assert "too few runs" in verdict(summarize(tmp_path))


def test_the_suite_runs_on_the_tiny_model_and_resumes(tmp_path):
    """One setting, one seed, every mode, as `suite.py run` does it (the tiny model, 2 steps): the raw
    file holds each mode's row with its commit and config hash, the untrained model's score on a test
    split of distinct tasks, and every variant scored on it; a second invocation runs nothing."""
    args = [sys.executable, str(ROOT / "benchmarks" / "suite.py"), "run", "--settings", "math-learns", "--seeds", "0",
            "--model", "tiny-random", "--steps", "2", "--set", "evolution.llm.model=tiny-random",
            "--set", "evolution.steps_per_generation=1", "--set", "domain.n_test=6", "--set", "domain.n_heldout=8",
            "--set", "grpo.max_completion_length=32", "--set", "train.eval_max_new_tokens=6",
            "--results", str(tmp_path / "raw"), "--out", str(tmp_path / "runs")]
    out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads((tmp_path / "raw" / "math-learns.json").read_text())
    assert set(data["runs"]) == {"reference", "evolve", "random-library"}
    assert data["untrained"]["n_test"] == data["untrained"]["distinct_prompts"] == 6
    for mode, (r,) in data["runs"].items():
        assert r["seed"] == 0 and len(r["commit"]) >= 40 and len(r["config_hash"]) == 16
        assert len(r["test_scores"]) == 6 and r["train_steps"] >= 2
    assert {v["variant"] for v in data["scored_on_test"]} == {"reference", "evolve", "random-library"}
    assert "model=tiny-random" in data["overrides"]
    again = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0 and "seed 0: test" not in again.stdout
    s = summarize(tmp_path / "raw")
    assert set(s["settings"]["math-learns"]["delta"]) == {"evolve-reference", "evolve-random-library"}
