"""``evotrainer check CONFIG``: every refusal a run would meet, listed at once, without compute; the
real-scale GPU example is accepted on a CPU machine except for its device."""

import json
import logging
from pathlib import Path

import torch
import yaml

from evotrainer.cli.app import main

ROOT = Path(__file__).resolve().parents[1]
# Qwen2.5-1.5B-Instruct's architecture (its config.json): the check builds the model on the meta
# device, so no weights are needed to check LoRA targets.
QWEN_1_5B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1536,
             "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
             "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
             "tie_word_embeddings": True, "hidden_act": "silu", "sliding_window": 32768, "use_sliding_window": False,
             "max_window_layers": 21, "torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151645}


def _out(capsys) -> str:
    return " ".join(capsys.readouterr().out.split())


def test_the_gpu_example_is_refused_for_its_device_alone_on_a_cpu(tmp_path, monkeypatch, capsys, caplog):
    monkeypatch.chdir(tmp_path)   # the example names its data files relative to where it runs
    (tmp_path / "qwen").mkdir()
    (tmp_path / "qwen" / "config.json").write_text(json.dumps(QWEN_1_5B))
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    for split, lo, hi in (("train", 0, 1200), ("test", 1200, 1800)):
        rows = [{"question": f"What is {i} plus {i}?", "answer": f"#### {2 * i}"} for i in range(lo, hi)]
        (data / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = yaml.safe_load((ROOT / "examples" / "gsm8k_qwen_gpu.yaml").read_text())
    cfg["model"] = str(tmp_path / "qwen")
    (tmp_path / "gpu.yaml").write_text(yaml.safe_dump(cfg))
    with caplog.at_level(logging.WARNING, logger="evotrainer.loop.seed"):
        rc = main(["check", "gpu.yaml"])
    out = _out(capsys)
    # 1024 tokens is outside the built-in harness's 135M-sized choices: they scale with it, said once
    assert any("scale with it to [512, 1024, 2048, 4096]" in r.getMessage() for r in caplog.records)
    if torch.cuda.is_available():
        assert rc == 0 and "nothing `evotrainer run` would refuse" in out, out
    else:
        assert rc == 1 and out.count("refused:") == 1 and "field 'device': 'cuda' is not available here" in out, out


def test_every_refusal_is_listed_not_only_the_first(tmp_path, capsys):
    cfg = {"model": "tiny-random", "device": "tpu", "harness": str(tmp_path / "missing.py"),
           "evolution": {"operators": {"no_such_operator": 1.0}}}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["check", str(tmp_path / "bad.yaml")]) == 1
    out = _out(capsys)
    assert out.count("refused:") == 3, out
    assert "field 'harness'" in out and "'no_such_operator'" in out and "field 'device'" in out
    assert "3 thing(s) `evotrainer run` would refuse" in out
    assert main(["check", "--train", str(tmp_path / "bad.yaml")]) == 1   # no loop: the operators are not asked
    out = _out(capsys)
    assert out.count("refused:") == 2 and "no_such_operator" not in out, out


def test_a_config_a_run_accepts_is_said_to_pass(capsys):
    assert main(["check", str(ROOT / "examples" / "quickstart.yaml")]) == 0
    assert "nothing `evotrainer run` would refuse" in _out(capsys)


def test_idle_gpus_under_the_local_executor_are_said(tmp_path, monkeypatch, capsys):
    # This machine has no GPU: the device count is the only part faked, the check itself runs as a run would.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    cfg = {"model": "tiny-random", "device": "cuda", "engine": "transformers"}
    (tmp_path / "gpu.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["check", "--train", str(tmp_path / "gpu.yaml")]) == 0
    out = _out(capsys)
    assert "8 CUDA devices are visible and executor: local uses one of them (cuda)" in out, out
    assert "ray.num_gpus_per_branch: 1" in out
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)   # one GPU: nothing idles, nothing said
    assert main(["check", "--train", str(tmp_path / "gpu.yaml")]) == 0
    assert "CUDA devices are visible" not in _out(capsys)
