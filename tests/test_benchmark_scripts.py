"""The benchmarks that measure this project's claims run end to end on the tiny model, so they cannot
break unseen between the sittings that run them at full size."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(args, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_step_speed_measures_both_paths_and_the_logprob_gap(tmp_path):
    # --random-init: what a lent GPU with no weights runs (here the tiny shape, on the CPU)
    out = _run([str(ROOT / "benchmarks" / "step_speed.py"), "--random-init", "tiny", "--device", "cpu",
                "--repeats", "1", "--json", "speed.json"], tmp_path)
    data = json.loads((tmp_path / "speed.json").read_text())
    assert "model tiny float32 on cpu" in out and data["args"]["random_init"] == "tiny"
    names = [r["name"] for r in data["rows"]]
    assert any(n.startswith("sampling") for n in names) and "GRPO step (16 rollouts)" in names
    for row in data["rows"]:
        assert row["old"]["median_s"] > 0 and row["new"]["median_s"] > 0 and row["speedup"] > 0
    assert data["logprob_gap"]["new"] < 1e-3 and data["machine"]["matmul_fp32_gflops"] > 0
    assert "sampler-vs-trainer log-prob gap" in out


def test_headroom_trains_variants_and_pairs_them_with_the_reference(tmp_path):
    args = [str(ROOT / "benchmarks" / "headroom.py"), "--config", str(ROOT / "examples" / "quickstart.yaml"),
            "--model", "tiny-random", "--steps", "1", "--seeds", "0", "--n-test", "6",
            "--variants", "reference,rloo_advantages", "--out", "runs", "--json", "h.json"]
    out = _run(args, tmp_path)
    data = json.loads((tmp_path / "h.json").read_text())
    assert [(r["variant"], r["seed"]) for r in data["runs"]] == [("reference", 0), ("rloo_advantages", 0)]
    for r in data["runs"]:
        assert len(r["test_scores"]) == 6 and len(r["answer_logprob"]) == 6 and r["sampled_scores"]
    assert "rloo_advantages" in out and "Δ vs reference" in out
    again = _run(args, tmp_path)            # resumes: nothing left to run
    assert "seed 0 ..." not in again and len(json.loads((tmp_path / "h.json").read_text())["runs"]) == 2
    assert "nothing to set the signals against" in _run([args[0], "--json", "h.json", "--signals"], tmp_path)
    fired = _run([args[0], "--json", "h.json", "--fires"], tmp_path)   # the reference run's own health report
    assert "reference seed 0: alerts" in fired
    assert "fires rloo_advantages" in fired or "fired on no reference report: rloo_advantages" in fired
    # The next rung: every run (and the start row) from a trained adapter, never mixed with runs from the base.
    adapter = tmp_path / "runs" / "reference" / "seed0" / "adapter"
    rung = [args[0], "--config", args[2], "--model", "tiny-random", "--steps", "1", "--seeds", "0", "--n-test", "6",
            "--variants", "reference", "--out", "runs2", "--init-adapter", str(adapter)]
    _run(rung + ["--json", "h2.json"], tmp_path)
    assert json.loads((tmp_path / "h2.json").read_text())["init_adapter"] == str(adapter)
    started = json.loads((tmp_path / "runs2" / "reference" / "seed0" / "init_adapter.json").read_text())
    assert started["from"] == str(adapter.resolve())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"}
    mixed = subprocess.run([sys.executable, *rung, "--json", "h.json"], env=env, capture_output=True, text=True,
                           timeout=900, cwd=tmp_path)
    assert mixed.returncode != 0 and "holds runs that started from the base model" in mixed.stderr


def test_headroom_killed_mid_seed_resumes_at_its_checkpoint(tmp_path):
    """A seed killed after its first step (kill -9 at the checkpoint) continues at step 1 on the rerun."""
    args = [str(ROOT / "benchmarks" / "headroom.py"), "--config", str(ROOT / "examples" / "quickstart.yaml"),
            "--model", "tiny-random", "--steps", "2", "--seeds", "0", "--n-test", "4",
            "--variants", "reference", "--out", "runs", "--json", "h.json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2", "EVOTRAINER_CRASH_AT": "train:checkpoint-saved:1"}
    died = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert died.returncode == 137, died.stdout[-2000:] + died.stderr[-3000:]
    assert json.loads((tmp_path / "h.json").read_text())["runs"] == []
    _run(args, tmp_path)
    [row] = json.loads((tmp_path / "h.json").read_text())["runs"]
    assert row["resumed_from_step"] == 1 and row["steps"] == 2 and len(row["test_scores"]) == 4
    steps = (tmp_path / "runs" / "reference" / "seed0" / "steps.jsonl").read_text().splitlines()
    assert [json.loads(s)["step"] for s in steps] == [0, 1]


def test_headroom_on_swe_reports_what_each_episode_did(tmp_path):
    """On SWE the screen scores episodes: per test task resolved, calls accepted, edits, test runs,
    progress, paired with the reference; and how far up the call-form ladder training got."""
    args = [str(ROOT / "benchmarks" / "headroom.py"), "--config", str(ROOT / "examples" / "evolve_swe.yaml"),
            "--model", "tiny-random", "--steps", "1", "--seeds", "0", "--n-test", "2",
            "--variants", "reference,swe_call_form_credit,swe_guided_tool_calls", "--out", "runs", "--json", "h.json"]
    out = _run(args, tmp_path)
    data = json.loads((tmp_path / "h.json").read_text())
    for r in data["runs"]:
        assert set(r["episode_scores"]) == {"resolved", "valid_call_rate", "working_calls", "edited", "ran_tests", "progress",
                                            "broke_tests"}
        assert all(len(v) == 2 for v in r["episode_scores"].values())
    assert "episode rates on the test split" in out and "swe_call_form_credit (1 seed(s)): resolved" in out
    assert "swe_call_form_credit seed 0:" in out and "->" in out   # the form ladder, read from the run dirs
    # guided episodes: how close the free policy's own log-probabilities came to the guided calls
    assert "swe_guided_tool_calls seed 0: guided" in out and "the policy's own log p of the guided calls" in out
    kept = tmp_path / "runs" / "reference" / "seed0" / "rollouts" / "test.jsonl"
    assert len(kept.read_text().splitlines()) == 2          # the test episodes, kept for a later reading
    # --rescore scores the kept adapters' test split again, into a new file, the first one untouched
    again = _run(args[:-4] + ["--out", "runs", "--json", "h.json", "--rescore", "--variants", "reference"], tmp_path)
    assert "reference seed 0 valid_call_rate:" in again and "->" in again
    assert "swe_call_form_credit seed 0 valid_call_rate" not in again       # not asked for
    rescored = json.loads((tmp_path / "h.json").read_text())
    assert [r.get("rescored") is not None for r in rescored["runs"]] == [True, False, False]
    assert len(kept.read_text().splitlines()) == 2 and len(list(kept.parent.glob("test.rescored-*.jsonl"))) == 1


def test_the_swe_report_counts_handed_in_patches_that_break_passing_tests(tmp_path):
    """The vandalism a credit for any applied edit paid for: patches that apply and fail a PASS_TO_PASS
    test, counted on the test split and in training, guided apart from free."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from headroom_report import patch_line

    from evotrainer.records.rollout import Rollout
    from evotrainer.records.version import VersionDir

    def ep(applied, broken, guided=False, split="test"):
        grade = {"patch_applied": applied, "pass_to_pass": {"t::a": {"passed": not broken}}}
        return Rollout(task_id="t", messages=[], completion="", prompt_ids=[1], completion_ids=[2], logprobs=[-1.0],
                       tool_calls=[{"name": "submit", "args": {}, "error": None}], split=split,
                       episode={"guided": guided, "patch": "diff" if applied else ""},
                       **({"hidden": grade} if split == "test" else {"visible": grade}))

    run = VersionDir(tmp_path / "seed0")
    assert patch_line("v", 0, run) == []                      # nothing handed in: no line
    run.save_rollouts("test", [ep(True, True), ep(True, False), ep(False, False)])
    run.save_rollouts("train", [ep(True, True, guided=True, split="train"), ep(False, False, split="train")])
    assert patch_line("v", 0, run) == ["  v seed 0: test 2 of 3 applied, 1 break tests; training guided 1 of 1 "
                                       "applied, 1 break tests / free 0 of 1 applied, 0 break tests"]
    run.save_rollouts("test.rescored-20261204-050000", [ep(True, False)])   # scored again: the newest scoring counts
    assert patch_line("v", 0, run)[0].startswith("  v seed 0: test 1 of 1 applied, 0 break tests;")


def test_a_report_versus_another_file_pairs_its_runs_and_reads_a_missing_rate_from_their_test_episodes(tmp_path):
    """``--report --versus``: another file's runs (same start, same test split) stand in for the reference,
    each read from its own directory; a rate added after they were scored (``broke_tests``) is read from
    their stored test episodes, not left out."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from headroom_report import report, versus

    from evotrainer.records.rollout import Rollout
    from evotrainer.records.version import VersionDir

    def ep(task, broken):
        grade = {"patch_applied": True, "pass_to_pass": {"t::a": {"passed": not broken}}}
        return Rollout(task_id=task, messages=[], completion="", prompt_ids=[1], completion_ids=[2], logprobs=[-1.0],
                       tool_calls=[{"name": "submit", "args": {}, "error": None}], split="test",
                       episode={"patch": "diff"}, hidden=grade)

    def data(out, variant, broken):
        VersionDir(tmp_path / out / variant / "seed0").save_rollouts("test", [ep("a", broken), ep("b", broken)])
        scores = {k: {"a": 0.0, "b": 0.0} for k in ("resolved", "valid_call_rate", "working_calls", "edited",
                                                       "ran_tests", "progress")}   # scored before broke_tests existed
        run = {"variant": variant, "seed": 0, "test_accuracy": 0.0, "test_scores": {"a": 0.0, "b": 0.0},
               "episode_scores": scores, "skipped_steps": 0, "truncation_last8": 0.0}
        return {"domain": "swe", "steps": 1, "n_test": 2, "init_adapter": "x", "out": str(tmp_path / out), "runs": [run]}

    old, new = data("old", "vandal", broken=True), data("new", "token", broken=False)
    text = report(versus(new, old))
    assert "reference: the runs of vandal (--versus)" in text
    assert "token (1 seed(s)): " in text and "broke_tests 0.000 (-1.000 [-1.000, -1.000])" in text
    assert "reference (1 seed(s)): " in text and "broke_tests 1.000" in text
    with pytest.raises(ValueError, match="same start"):
        versus(new, {**old, "init_adapter": "y"})


def test_signals_credit_a_signal_only_where_it_points_the_way_of_the_other_tasks():
    """Three models on 8 tasks, the first 4 scored by each signal: greedy and sampled agree with the
    greedy difference on the other 4; the answer log-probability ranks them the other way round."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import headroom

    tasks = [f"t{i}" for i in range(8)]

    def model(correct: int, ll: float, name=None, seed=None):
        greedy = {t: float(i % 4 < correct) for i, t in enumerate(tasks)}
        out = {"test_scores": greedy, "sampled_scores": {t: greedy[t] for t in tasks[:4]},
               "answer_logprob": {t: ll + 0.1 * i for i, t in enumerate(tasks)}}
        return {**out, "variant": name, "seed": seed} if name else out

    data = {"base": model(1, -1.0), "runs": [model(2, -5.0, "reference", 0), model(3, -9.0, "better", 0)]}
    text = headroom.signals(data)
    assert "greedy     points the way of the other tasks' greedy difference in 3 of 3 pairs" in text
    assert "answer LL  points the way of the other tasks' greedy difference in 0 of 3 pairs" in text
    assert "greedy gate MDE" in text and "128 tasks" in text


def test_headroom_builds_both_edit_forms_and_names_a_variant_that_does_not_apply():
    """`token` and `quoted` guided edits are two variants; a variant the config's seed cannot take is a
    named error, not a traceback."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import headroom
    from evotrainer.genome.program import HarnessProgram
    from evotrainer.loop.seed import DOMAIN_HARNESSES

    seed = HarnessProgram.from_file(DOMAIN_HARNESSES["swe"])
    assert headroom.build_variant("swe_guided_token_edits", seed).knobs["guided_edit"]["value"] == "token"
    assert headroom.build_variant("swe_guided_quoted_edits", seed).knobs["guided_edit"]["value"] == "quoted"
    with pytest.raises(SystemExit, match="unknown variant"):
        headroom.build_variant("swe_guided_nothing", seed)
    # a seed that already steps at 4e-4 (examples/evolve_swe.yaml), the value this variant reaches from 1e-4
    with pytest.raises(SystemExit, match="swe_raise_learning_rate does not apply to this config's seed"):
        headroom.build_variant("swe_raise_learning_rate", seed.with_knobs(learning_rate=4e-4))


def test_gpu_loop_runs_two_generations_on_both_engines_on_the_cpu(tmp_path):
    """The device script (benchmarks/gpu_loop.py) on the tiny architecture: every step learns (the random
    model answers nothing right), trained adapters reach vLLM's applied check and pass it."""
    import importlib.util

    engines = "vllm,transformers" if importlib.util.find_spec("vllm") else "transformers"
    out = _run([str(ROOT / "benchmarks" / "gpu_loop.py"), "--arch", "tiny", "--device", "cpu", "--dtype", "float32",
                "--engines", engines, "--prompts", "2", "--tokens", "32", "--rollout-batch", "4",
                "--out", "runs", "--json", "loop.json"], tmp_path)
    data = json.loads((tmp_path / "loop.json").read_text())
    assert [r["engine"] for r in data["rows"]] == engines.split(",")
    for r in data["rows"]:
        assert r["rollout_batch"] == 4   # --rollout-batch reached each run's config
        run_config = json.loads((tmp_path / "runs" / f"{r['engine']}-b4" / "config.json").read_text())
        assert run_config["train"]["rollout_batch_size"] == 4
        assert r["status"] == "finished" and r["train_steps"] > 0 and r["seconds"]["train"] > 0
        assert r["tokens_per_s"] > 0 and r["peak_gib"] > 0 and not r["adapter_refusals"]
        assert all(s in ("kept", "promoted", "pruned") for s in r["versions"].values()), r["versions"]
    assert "rollout tok/s" in out


def test_compare_modes_runs_both_protocols_and_trains_the_reference_once(tmp_path):
    """Every mode under both protocols on the tiny model: the tables of each protocol, the reference's
    one lineage standing for both (trained once), and a rerun with the same --json runs nothing."""
    args = [str(ROOT / "benchmarks" / "compare_modes.py"), "--config", str(ROOT / "examples" / "quickstart.yaml"),
            "--model", "tiny-random", "--steps", "2", "--steps-per-generation", "1", "--seeds", "0",
            "--eval-size", "4", "--set", "evolution.llm.model=tiny-random", "--set", "domain.n_test=4",
            "--out", "runs", "--json", "c.json"]
    out = _run(args, tmp_path)
    results = json.loads((tmp_path / "c.json").read_text())["results"]
    assert set(results) == {f"{m}@{p}" for m in ("reference", "evolve", "random-library") for p in ("total", "depth")}
    assert results["reference@depth"][0]["same_run_as"] == "total"
    assert results["reference@depth"][0]["test_scores"] == results["reference@total"][0]["test_scores"]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(
        f"{m}-{p}-s0" for m in ("reference", "evolve", "random-library") for p in ("total", "depth")
        if (m, p) != ("reference", "depth"))
    assert "equal total" in out.lower() and "depth" in out.lower()
    again = _run(args, tmp_path)
    assert "resuming from" in again and " seed 0: best" not in again


def test_compare_modes_on_swe_pairs_what_each_pick_s_test_episodes_did(tmp_path):
    """On SWE, where nothing may resolve, each pick's test episodes give the rates a comparison can
    still tell apart, paired with the reference; rows stored without them are filled from the kept runs."""
    args = [str(ROOT / "benchmarks" / "compare_modes.py"), "--config", str(ROOT / "examples" / "evolve_swe.yaml"),
            "--model", "tiny-random", "--steps", "2", "--steps-per-generation", "1", "--seeds", "0",
            "--modes", "reference,evolve", "--protocols", "total", "--set", "domain.n_test=2",
            "--set", "domain.episode.max_turns=2", "--out", "runs", "--json", "c.json"]
    out = _run(args, tmp_path)
    stored = json.loads((tmp_path / "c.json").read_text())
    for name in ("reference@total", "evolve@total"):
        (row,) = stored["results"][name]
        assert set(row["episode_scores"]) == {"resolved", "valid_call_rate", "working_calls", "edited", "ran_tests", "progress",
                                              "broke_tests"}
        assert sorted(row["episode_scores"]["resolved"]) == sorted(row["test_scores"])   # one per test task
    assert "episode rates on the test split" in out and "untrained: resolved" in out
    assert "evolve (1 seed(s)): resolved" in out and "[" in out.split("evolve (1 seed(s)): resolved")[1]
    for name, rows in stored["results"].items():   # as JSONs written before the rates (or one) were recorded
        for row in rows:
            if name == "evolve@total":
                del row["episode_scores"], row["run_dir"]
            else:
                del row["episode_scores"]["working_calls"]
    (tmp_path / "c.json").write_text(json.dumps(stored))
    again = _run(args, tmp_path)
    assert "resuming from" in again and " seed 0: best" not in again
    assert "evolve (1 seed(s)): resolved" in again and "working_calls" in again.split("evolve (1 seed(s))")[1]
    refilled = json.loads((tmp_path / "c.json").read_text())
    assert all("working_calls" in row["episode_scores"] for rows in refilled["results"].values() for row in rows)


def test_compare_modes_draws_reads_each_explored_parent_s_report(tmp_path):
    """--draws: the entries a parent's real health report (a SWE seed's: every call malformed, groups dead)
    fires, their share of the library's draw, and the children proposed from it."""
    from evotrainer.loop.seed import REFERENCE_PATH

    parent = tmp_path / "runs" / "evolve-total-s0" / "versions" / "v0000"
    parent.mkdir(parents=True)
    (parent / "genome.py").write_text(REFERENCE_PATH.with_name("reference_swe_harness.py").read_text())
    (parent / "health.json").write_text((ROOT / "tests" / "fixtures" / "health_report_swe_seed.json").read_text())
    child = {"id": "v0002", "parents": ["v0000"], "operator": "library", "entry": "swe_guided_tool_plan",
             "factor": "knob:guided_plan_share", "knob": None, "new": None}
    rows = {"evolve@total": [{"seed": 0, "children": [child]}],
            "evolve@depth": [{"seed": 0, "children": [{**child, "parents": ["v0009"]}]}]}
    (tmp_path / "c.json").write_text(json.dumps({"args": {}, "results": rows}))
    out = _run([str(ROOT / "benchmarks" / "compare_modes.py"), "--draws", "--json", "c.json", "--out", "runs"], tmp_path)
    (line,) = [s for s in out.splitlines() if s.startswith("  evolve@total seed 0 v0000:")]
    shares = dict(item.rsplit(" ", 1) for item in line.split("fires ")[1].split("; proposed")[0].split(", "))
    assert "swe_guided_tool_plan" in shares and "swe_call_form_credit" in shares
    assert "swe_progress_credit" not in shares          # nothing to pay for: no guided episode edits yet
    assert abs(sum(map(float, shares.values())) - 1.0) <= 0.005 * len(shares)   # each rounded to 2 places
    assert line.endswith("proposed library:swe_guided_tool_plan")
    assert "evolve@depth seed 0 v0009: no health report" in out   # a parent whose directory is gone is said
    missing = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compare_modes.py"), "--draws"], cwd=tmp_path,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert missing.returncode != 0 and "--draws reads a results file" in missing.stderr
