"""The shipped library-entry prior: its weights, its file (held to the script that writes it from the
committed headroom screens), its errors, and the draws of the library and ``llm_choice`` it steers."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from evotrainer.config import ConfigError, parse_config
from evotrainer.operators.entry_prior import FLOOR, SHIPPED, PriorError, deltas_for, load_prior, prior_weights, weight
from evotrainer.operators.evidence import Evidence
from evotrainer.operators.library import LibraryOperator
from evotrainer.operators.llm_choice import LLMChoiceOperator
from evotrainer.genome import reference_program as reference
from tests.loop_runs import tiny_cfg

ROOT = Path(__file__).resolve().parents[1]
# On it, dead groups with some reward fire more_generations and pass_rate_curriculum (and easy_first_curriculum).
REPORT = {"metrics": {"dead_group_ratio": 0.9, "train_correct_rate": 0.05, "train_reward_std": 0.1, "heldout_delta": 0.0,
                      "heldout_changed_rate": 0.3}}


def _script():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("entry_prior_script", ROOT / "benchmarks" / "entry_prior.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_weight_is_twice_the_chance_the_entry_helps_and_never_zero():
    assert weight([]) == 1.0                       # never screened: neutral
    assert weight([0.0]) == pytest.approx(1.0)
    assert weight([0.2, 0.25, 0.15]) == pytest.approx(2.0, abs=1e-3)
    assert weight([-0.4]) == FLOOR                 # a clear loss is still drawn, rarely
    assert weight([0.05]) < weight([0.05] * 5) < 2.0   # more seeds, more confidence
    assert weight([-0.05]) < 1.0 < weight([0.05])


def test_the_shipped_prior_is_what_the_script_builds_from_the_committed_screens():
    built = _script().build()
    assert json.loads(SHIPPED.read_text()) == json.loads(json.dumps(built, sort_keys=True))
    math = load_prior()["domains"]["math"]
    screens = json.loads((ROOT / "benchmarks/results/headroom_math.json").read_text())["runs"]
    ref = {r["seed"]: r["test_accuracy"] for r in screens if r["variant"] == "reference"}
    curriculum = [r["test_accuracy"] - ref[r["seed"]] for r in screens if r["variant"] == "pass_rate_curriculum"]
    assert math["pass_rate_curriculum"] == pytest.approx(curriculum, abs=1e-6)
    assert not any("+" in e for d in load_prior()["domains"].values() for e in d)   # single entries only


def test_an_unscreened_domain_reads_every_domains_screens_pooled(tmp_path):
    path = tmp_path / "prior.json"
    path.write_text(json.dumps({"domains": {"math": {"a": [0.1], "b": [-0.3]}, "code": {"a": [0.2, 0.0]}}}))
    prior = load_prior(path)
    assert deltas_for(prior, "math") == {"a": [0.1], "b": [-0.3]}
    assert deltas_for(prior, "swe") == {"a": [0.1, 0.2, 0.0], "b": [-0.3]}
    left_out = _script().build(leave_out="math")
    assert set(left_out["domains"]) == {"code"} and "--leave-out math" in left_out["generated_by"]


@pytest.mark.parametrize("content, says", [
    (None, "no prior file"), ("{not json", "not JSON"), ('{"domains": {"math": {"a": "x"}}}', "per-seed deltas")])
def test_a_broken_prior_file_says_what_is_wrong(tmp_path, content, says):
    path = tmp_path / "prior.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(PriorError, match=says):
        load_prior(path)


def test_the_prior_steers_the_library_draw_toward_what_helped(tmp_path):
    path = tmp_path / "prior.json"
    path.write_text(json.dumps({"domains": {"math": {"pass_rate_curriculum": [0.2, 0.2],
                                                     "more_generations": [-0.4]}}}))
    prior = prior_weights("math", path)
    firsts = Counter()
    for seed in range(60):
        ev = Evidence(health_report=REPORT)
        plain = LibraryOperator(seed=seed).propose([reference()], ev).details["entry"]
        steered = LibraryOperator(seed=seed, prior=prior).propose([reference()], ev).details["entry"]
        firsts[("plain", plain)] += 1
        firsts[("prior", steered)] += 1
    assert firsts[("prior", "more_generations")] < firsts[("plain", "more_generations")]
    assert firsts[("prior", "pass_rate_curriculum")] > firsts[("plain", "pass_rate_curriculum")]
    # llm_choice lists the entries by the same weights (a small model favours what it reads first).
    order = Counter(LLMChoiceOperator(seed=s, prior=prior).options(reference(), Evidence(health_report=REPORT))[0][0]
                    .entry.id for s in range(40))
    assert order["pass_rate_curriculum"] > order["more_generations"]


def test_the_run_config_chooses_the_prior(tmp_path):
    from evotrainer.loop.knowledge.operator_mix import operator_mix

    def library(prior):
        cfg = parse_config(tiny_cfg(tmp_path / "run", operators={"library": 1.0, "llm_choice": 1.0},
                                    entry_prior=prior))
        mix = operator_mix(cfg, tmp_path, None)
        return mix.kwargs_by_name.get("library", {}).get("prior"), mix.kwargs_by_name.get("llm_choice", {}).get("prior")

    shipped = prior_weights(parse_config(tiny_cfg(tmp_path / "run")).domain.name)
    assert library("shipped") == (shipped, shipped) and shipped
    assert library(None) == (None, None)
    with pytest.raises(ConfigError, match="entry_prior.*no prior file"):
        parse_config(tiny_cfg(tmp_path / "run", entry_prior=str(tmp_path / "missing.json")))


def test_the_docs_precision_table_is_the_scripts():
    text = (ROOT / "docs/concepts/one-generation.md").read_text()
    start = text.index("<!-- entry prior precision: generated by benchmarks/entry_prior.py -->")
    table = [line.strip() for line in text[start:text.index("<!-- end of entry prior precision -->")].splitlines()[1:-1]]
    assert table == _script().precision_table()


def test_a_broken_prior_is_refused_before_any_compute_and_a_good_one_named_absolutely(tmp_path, monkeypatch):
    from evotrainer.loop.tools.validate import config_problems

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    cfg = parse_config(tiny_cfg(tmp_path / "run", entry_prior=str(bad)))
    assert any("evolution.entry_prior" in p and "not JSON" in p for p in config_problems(cfg, loop=True))
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"domains": {"math": {"more_generations": [0.1]}}}))
    monkeypatch.chdir(tmp_path)
    cfg = parse_config(tiny_cfg(tmp_path / "run", entry_prior="good.json"))
    assert cfg.evolution.entry_prior == str(good.resolve())           # resume reads it from anywhere
    assert not any("entry_prior" in p for p in config_problems(cfg, loop=True))
