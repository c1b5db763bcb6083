"""`evotrainer run` on the code domain: examples/evolve_code.yaml, shrunk to the tiny model, runs the
co-evolution loop to the end (real sandbox, real executor, real MLflow) with every version settled."""

from __future__ import annotations

import json

import yaml

from evotrainer.cli.app import main
from evotrainer.domains.code.domain import CodeDomain
from evotrainer.fitness.cache import CachedVersion
from evotrainer.fitness.gate_config import GateConfig
from evotrainer.fitness.health import HealthReport
from evotrainer.fitness.validity import engine_checks
from evotrainer.records.version import VersionDir
from tests.loop_runs import check_invariants, mlflow_runs


def _code_cfg(run_dir):
    cfg = yaml.safe_load(open("examples/evolve_code.yaml"))
    cfg.update(model="tiny-random", run_dir=str(run_dir))
    cfg["domain"].update(difficulty=1, n_train=8, n_heldout=4, n_test=2)
    cfg["grpo"].update(num_generations=2, max_completion_length=32)
    cfg["train"].update(prompts_per_step=2, eval_max_new_tokens=24)
    cfg["evolution"].update(population_size=2, children_per_generation=2, generations=2, steps_per_generation=1,
                            user_skills=False, llm={"model": "tiny-random", "max_tokens": 16},
                            operators={"llm_diff": 1.0, "knobs": 1.0, "crossover": 0.5})
    return cfg


def test_evolve_code_runs_the_loop_to_the_end(tmp_path, capsys):
    run_dir = tmp_path / "run"
    path = tmp_path / "evolve_code.yaml"
    path.write_text(yaml.safe_dump(_code_cfg(run_dir)))
    assert main(["run", str(path)]) == 0
    state, metas = check_invariants(run_dir)
    assert state.status == "finished" and state.generation == 2
    assert len(metas) >= 2 and any(m.operator for m in metas.values()), "operators proposed children"
    seed = metas["v0000"]
    vdir = VersionDir(run_dir / "versions" / "v0000")
    assert vdir.genome_source().startswith('"""Reference code harness'), "the seed is the code reference harness"
    # The engine graded the held-out completions on hidden tests, with the executor's verdicts.
    held = vdir.rollouts("heldout")
    assert held and all("verdicts" in r.hidden and "tamper" in r.hidden for r in held)
    assert seed.metrics.get("heldout_accuracy") is not None
    # The health report and the gate's checks ran on code: the code harness's metrics, and every engine check.
    report = json.loads((vdir.path / "health.json").read_text())
    assert "test_pass_rate" in json.dumps(report)
    # Every version's report reads against where it started (generation 0: the untrained model's record),
    # so the held-out delta and changed rate that the learning-rate entries read are there.
    for vid in metas:
        m = json.loads((run_dir / "versions" / vid / "health.json").read_text())["metrics"]
        assert m["heldout_delta"] is not None and 0.0 <= m["heldout_changed_rate"] <= 1.0, vid
    children = [m for m in metas.values() if m.operator and m.decision]
    assert children
    for c in children:
        names = {ch["name"] for ch in c.decision["checks"]}
        assert {"tamper", "grader_gaming", "heldout_verified"} <= names, names
        tamper = next(ch for ch in c.decision["checks"] if ch["name"] == "tamper")
        assert tamper["passed"] and tamper["numbers"]["mismatches"] == 0 and tamper["numbers"]["reverified"] > 0
    runs = mlflow_runs(run_dir)
    assert {r.data.tags["evotrainer.version_id"] for r in runs} == set(metas)
    assert all("heldout_accuracy" in r.data.metrics for r in runs if metas[r.data.tags["evotrainer.version_id"]]
               .metrics.get("heldout_accuracy") is not None)
    # The cached version of the seed rebuilds the code domain and re-verifies its cache.
    cached = CachedVersion.load(vdir.path)
    assert isinstance(cached.domain, CodeDomain)
    checks = {c.name: c for c in engine_checks(cached, HealthReport.from_dict(report), GateConfig())}
    assert checks["tamper"].passed and checks["tamper"].numbers["reverified"] == len(cached.train) + len(held) \
        + len(cached.heldout_base)
