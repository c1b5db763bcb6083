"""The reference code harness: a contract-valid genome, the default for `domain.name: code`, and
`evotrainer train` running on code with the tiny model."""

from __future__ import annotations

import yaml

from evotrainer.cli.app import main
from evotrainer.config import load_config
from evotrainer.domains import build_domain
from evotrainer.genome.contract import check_contract
from evotrainer.genome.harness import Harness
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.seed import DOMAIN_HARNESSES, seed_program
from evotrainer.records.version import VersionDir


def _rollout(correct, verdicts, fmt=True, truncated=False, tamper=()):
    return {"task_id": "t", "messages": [], "completion": "", "completion_ids": [1] * 8, "logprobs": [-0.5] * 8,
            "truncated": truncated, "stop_reason": "eos", "turns": 1, "tool_calls": [], "gen_seconds": 0.0,
            "seed": 0, "group": 0, "step": 0, "split": "train", "prompt_ids": [], "reward": None, "advantage": None,
            "visible": {"correct": correct, "format_ok": fmt, "verdicts": verdicts, "tamper": list(tamper),
                        "pass_rate": verdicts.count("pass") / len(verdicts)}}


def test_code_harness_metrics_and_alerts_in_the_sandbox():
    program = HarnessProgram.from_file(DOMAIN_HARNESSES["code"])
    check_contract(program)
    rollouts = [_rollout(True, ["pass", "pass"]), _rollout(False, ["pass", "syntax_error"], fmt=False, truncated=True),
                _rollout(False, ["syntax_error", "syntax_error"], fmt=False, truncated=True, tamper=["exit: x"]),
                _rollout(False, ["timeout", "not_run"], fmt=False, truncated=True)]
    with Harness(program) as h:
        assert h.reward(rollouts, [{"id": "t"}] * 4) == [1.0, 0.0, 0.0, 0.0]
        m = h.metrics(rollouts, [rollouts])
        assert m["test_pass_rate"] == (1.0 + 0.5 + 0.0 + 0.0) / 4 and m["correct_rate"] == 0.25
        assert m["verdict_share_syntax_error"] == 3 / 8 and m["verdict_share_pass"] == 3 / 8
        assert m["format_violation_rate"] == 0.75 and m["truncation_rate"] == 0.75 and m["tamper_rate"] == 0.25
        names = {f["name"] for f in h.alerts(m, [])}
    assert {"overlong", "format_failures", "syntax_errors", "tampering"} <= names


def test_code_configs_default_to_the_code_harness():
    for path in ("examples/train_code.yaml", "examples/evolve_code.yaml"):
        cfg = load_config(path)
        assert cfg.domain.name == "code" and cfg.harness is None
        assert seed_program(cfg).source.startswith('"""Reference code harness')
        domain = build_domain(cfg.domain)   # the sizes fit the levels' capacity
        assert len(domain.tasks("train")) == cfg.domain.n_train
    math_cfg = load_config("examples/train_math.yaml")
    assert not seed_program(math_cfg).source.startswith('"""Reference code harness')


def test_train_runs_one_step_on_code_with_the_tiny_model(tmp_path, capsys):
    run_dir = tmp_path / "run"
    cfg = {"model": "tiny-random", "run_dir": str(run_dir),
           "domain": {"name": "code", "difficulty": 1, "n_train": 4, "n_heldout": 2, "n_test": 2},
           "grpo": {"max_completion_length": 32, "num_generations": 2},
           "train": {"steps": 1, "prompts_per_step": 2, "eval_max_new_tokens": 8}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path)]) == 0
    assert "held-out accuracy" in capsys.readouterr().out
    v = VersionDir(run_dir)
    train, heldout = v.rollouts("train"), v.rollouts("heldout")
    assert len(train) == 4 and all("verdicts" in r.visible and not r.hidden and r.reward is not None for r in train)
    # held-out: the hidden tests' outcome, kept from any harness
    assert len(heldout) == 2 and all("visible_correct" in r.hidden and "verdicts" not in r.visible for r in heldout)
    assert v.meta().metrics["heldout_accuracy"] == 0.0   # random weights write no passing function
    assert "verdict_share_syntax_error" in v.steps()[0]
