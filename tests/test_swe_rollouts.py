"""SWE episodes end to end with the tiny random model: the rollout engine drives the domain's tool
environment under its limits, the rollouts record turns, tool calls, masks and the grade, and the
GRPO trainer takes a step on them. A random model fixes nothing: every episode is unresolved."""

from __future__ import annotations

import json
import math

import pytest

from evotrainer.domains.code.executor import ExecLimits
from evotrainer.domains.swe.domain import SWEDomain
from evotrainer.domains.swe.environment import EnvLimits
from evotrainer.genome.harness import Harness
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.seed import DOMAIN_HARNESSES
from evotrainer.policy.collect import collect_groups, verify
from evotrainer.policy.episodes import turn_separator
from evotrainer.policy.grpo import GRPOConfig, GRPOTrainer
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.policy.rollout_engine import SamplingParams, TransformersEngine
from evotrainer.records.rollout import Rollout

LIMITS = EnvLimits(max_turns=3, max_turn_tokens=16, max_context_tokens=1000)


@pytest.fixture(scope="module")
def domain():
    d = SWEDomain(n_train=2, n_heldout=1, n_test=1, difficulty=1, seed=0, workers=1,
                  limits=ExecLimits(timeout_s=2.0), episode_limits=LIMITS)
    yield d
    d.close()


@pytest.fixture(scope="module")
def policy(tiny):
    model, tok = tiny
    pol = Policy(model, tok, LoraSettings(r=4, lora_alpha=8))
    pol.create("swe0")
    return pol


def test_swe_rollouts_record_turns_tool_calls_masks_and_the_grade(domain, policy):
    engine = TransformersEngine(policy)
    tasks = domain.tasks("train")
    rollouts = collect_groups(engine, domain, tasks, 2, SamplingParams(max_new_tokens=64, seed=3), "swe0", step=0)
    assert len(rollouts) == 4 and [r.task_id for r in rollouts] == [t.id for t in tasks for _ in range(2)]
    tok = policy.tokenizer
    for r, task in zip(rollouts, [t for t in tasks for _ in range(2)]):
        assert 1 <= r.turns <= LIMITS.max_turns and r.turns == len(r.turn_log) == len(r.tool_calls)
        assert r.stop_reason in ("max_turns", "context") and r.truncated and not r.episode["submitted"]
        assert r.messages[0]["role"] == "system" and "```tool" in r.messages[0]["content"]
        assert r.messages[1] == {"role": "user", "content": task.prompt}
        assert len(r.prompt_ids) + len(r.completion_ids) <= LIMITS.max_context_tokens
        mask = r.sampled_mask()   # consistent: one logprob per sampled token
        assert sum(mask) == r.num_tokens == sum(t["tokens"] for t in r.turn_log)
        assert all(t["tokens"] <= LIMITS.max_turn_tokens for t in r.turn_log)
        for turn in r.turn_log:   # random text holds no tool block: the environment says so, it does not crash
            assert turn["tool_call"]["error"] and turn["result"].startswith("error: ")
            a, b = turn["span"]
            assert all(mask[a:b]) and turn["text"] == tok.decode(r.completion_ids[a:b], skip_special_tokens=True)
        for prev, nxt in zip(r.turn_log, r.turn_log[1:]):
            gap = r.completion_ids[prev["span"][1]:nxt["span"][0]]
            assert not any(mask[prev["span"][1]:nxt["span"][0]])
            assert gap == turn_separator(tok, prev["result"], prev["stop_reason"] == "eos")
        # the grade of the (empty) submission, in the visible outcome of a train rollout
        g = r.visible
        assert g["resolved"] is False and g["correct"] is False and g["patch_applied"] is False
        assert set(g["fail_to_pass"]) == set(task.hidden["FAIL_TO_PASS"]) and not r.hidden
        assert r.episode["patch"] == "" and r.episode["history_calls"] == 0
        assert Rollout.from_dict(json.loads(json.dumps(r.to_dict()))) == r

    # The SWE reference harness reads the engine's episodes (turns a count, the turns in turn_log).
    with Harness(HarnessProgram.from_file(DOMAIN_HARNESSES["swe"])) as harness:
        m = harness.metrics(rollouts, [rollouts[:2], rollouts[2:]])
    assert m["turns_mean"] == pytest.approx(sum(r.turns for r in rollouts) / len(rollouts))
    assert m["tool_failure_rate"] == m["malformed_call_rate"] == 1.0   # no parseable call in random text
    assert m["edit_rate"] == m["submit_rate"] == m["correct_rate"] == 0.0

    trainer = GRPOTrainer(policy, "swe0", GRPOConfig(num_generations=2, max_completion_length=16, learning_rate=1e-3))
    stats = trainer.step(rollouts, [1.0, -1.0, 0.5, -0.5])
    assert math.isfinite(stats["loss"]) and stats["grad_norm"] > 0


def test_swe_heldout_verification_runs_episodes_with_the_grade_hidden(domain, policy):
    heldout = domain.tasks("heldout")
    out = verify(TransformersEngine(policy), domain, heldout, "swe0", max_new_tokens=8)
    (r,) = out
    assert r.split == "heldout" and 1 <= r.turns <= LIMITS.max_turns and r.step == -1
    assert r.hidden["resolved"] is False and "fail_to_pass" in r.hidden and set(r.visible) == {"format_ok"}
    assert all(t["tokens"] <= 8 for t in r.turn_log)


def test_train_command_runs_swe_episodes_end_to_end(tmp_path, capsys):
    """`evotrainer train` with `domain.name: swe`: episodes under the config's limits, the reference
    harness's reward and advantages, a GRPO update, held-out episodes before and after."""
    import yaml

    from evotrainer.cli.app import main
    from evotrainer.records.version import VersionDir

    run_dir = tmp_path / "run"
    cfg = {
        "model": "tiny-random", "run_dir": str(run_dir),
        "domain": {"name": "swe", "difficulty": 1, "n_train": 2, "n_heldout": 1, "n_test": 1,
                   "episode": {"max_turns": 2, "max_turn_tokens": 8, "max_context_tokens": 1000}},
        # (the SWE harness's per-turn length knob starts at 128; the episode's max_turn_tokens caps a turn)
        "grpo": {"max_completion_length": 128, "num_generations": 2, "learning_rate": 1e-3},
        "train": {"steps": 1, "prompts_per_step": 1, "eval_max_new_tokens": 4},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path)]) == 0, capsys.readouterr()
    v = VersionDir(run_dir)
    train = v.rollouts("train")
    assert len(train) == 2 and all(r.turns == 2 and r.reward is not None and r.visible["resolved"] is False
                                   for r in train)
    assert all(t["tokens"] <= 8 for r in train for t in r.turn_log)
    heldout = v.rollouts("heldout")
    assert len(heldout) == 1 and heldout[0].hidden["resolved"] is False and heldout[0].turns == 2
    assert all(t["tokens"] <= 4 for t in heldout[0].turn_log)
    assert v.meta().metrics["heldout_accuracy"] == 0.0


def test_episode_limits_are_refused_off_the_swe_domain():
    from evotrainer.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match="episode limits are for the swe domain"):
        parse_config({"domain": {"name": "math", "episode": {"max_turns": 2}}})


def test_dr_grpo_normalises_an_episode_by_its_whole_token_budget(domain):
    """Dr. GRPO divides by a constant: the most tokens a rollout may sample. For an episode that is
    every turn's budget (max_turns × per-turn tokens), not one turn's, or a long episode would weigh
    max_turns times more than the single-turn loss the trainer was tuned on."""
    import torch

    from evotrainer.domains import get_domain
    from evotrainer.policy.episodes import sampled_token_budget
    from evotrainer.policy.grpo import grpo_loss

    assert sampled_token_budget(domain, 64) == LIMITS.max_turns * LIMITS.max_turn_tokens   # the per-turn cap binds
    assert sampled_token_budget(domain, 8) == LIMITS.max_turns * 8
    assert sampled_token_budget(get_domain("math", n_train=2, n_heldout=1, n_test=1), 64) == 64
    cfg = GRPOConfig(loss_type="dr_grpo", max_completion_length=16)
    logps, mask, adv = torch.randn(2, 5), torch.ones(2, 5), torch.tensor([1.0, 0.5])
    one_turn, _ = grpo_loss(logps, logps.detach(), adv, mask, cfg)
    episode, _ = grpo_loss(logps, logps.detach(), adv, mask, cfg, max_tokens=48)
    assert one_turn.abs() > 0
    assert torch.allclose(episode * 3, one_turn)
