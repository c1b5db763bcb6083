"""The lent device's script runs end to end here, on CPU, on the tiny architecture.

A device session is 15 minutes with no network: a script that breaks there costs the whole
measurement. This runs the same code paths (rollouts with an adapter, a GRPO step, the sampler vs
trainer logprob check, and the population variant's paths: one adapter at a time, one batch decoded at the
growing prefix and at static shapes, merged, and vLLM where it is installed).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from evotrainer.policy.base_model import embedded_model_dir
from evotrainer.policy.vllm_engine import vllm_version

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_smoke_runs_on_cpu_and_reports_every_path(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_smoke.py"), "--tokenizer", str(embedded_model_dir()),
           "--device", "cpu", "--archs", "tiny", "--dtypes", "fp32", "--batches", "4", "--new-tokens", "4",
           "--population", "2", "--population-prompts", "2", "--out", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    *shapes, population = json.loads((tmp_path / "gpu_smoke.json").read_text())   # strict JSON: no NaN

    assert len(shapes) == 1 and "error" not in shapes[0], shapes
    shape = shapes[0]
    assert shape["tokens_per_s"] > 0 and shape["loss_finite"] and shape["grad_norm"] > 0
    # fp32, one model: the trainer recomputes the sampler's logprobs up to float noise.
    assert shape["sampler_vs_trainer_max_logp_gap"] < 1e-3, shape
    assert shape["peak_gib"] is None   # no CUDA here: no peak, rather than a made-up one

    [pop] = population["population"]
    assert "error" not in pop, pop
    want = ["transformers", "together-dynamic", "together-static", "merged"] + (["vllm"] if vllm_version() else [])
    assert list(pop["paths"]) == want
    assert pop["paths"]["transformers"]["ratio"] == 1.0
    assert all(p["tokens_per_s"] > 0 for p in pop["paths"].values())
    assert pop["goal_mib"] >= pop["base_mib"] + 2 * pop["adapter_mib"]
    assert "tiny" in done.stdout and "ERROR" not in done.stdout
