"""Multi-turn episodes through the rollout engine and GRPO over them, on the tiny random model.

The environment here is a small one of the SWE episode's shape (``step(text) -> (result, call)``):
it answers every turn with a fixed tool result, so that the tests can tell the policy's tokens from
the environment's: masks cover exactly the assistant turns, the trainer's logprobs on them equal
the sampler's on the first pass, tool tokens get no gradient, and GRPO learns a first-turn
behaviour that the reward favours.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from evotrainer.domains.base import Domain
from evotrainer.domains.swe.environment import EnvLimits
from evotrainer.domains.task import Task
from evotrainer.policy.base_model import load_base_model
from evotrainer.policy.collect import collect_groups, verify
from evotrainer.policy.episodes import turn_separator
from evotrainer.policy.grpo import GRPOConfig, GRPOTrainer, group_advantages, grpo_loss
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.policy.rollout_engine import SamplingParams, TransformersEngine
from evotrainer.records.rollout import Rollout

RESULT = "tool output: 3 files, 2 tests failed"


class NotesEnv:
    """Answers every turn with RESULT; never submits (the turn limit ends the episode)."""

    def __init__(self, limits: EnvLimits) -> None:
        self.limits, self.done, self.submitted, self.history_calls = limits, False, None, 0

    def step(self, text: str) -> tuple[str, dict[str, Any]]:
        return f"{RESULT}{' ok' * (len(text) % 5)}", {"name": "note", "args": {}, "error": None, "seconds": 0.0}

    def close(self) -> None:
        pass


class NotesDomain(Domain):
    name = "notes"

    def __init__(self, limits: EnvLimits, n: int = 4) -> None:
        self.limits = limits
        self._tasks = [Task(id=f"n{i}", prompt=f"Take notes{' again' * i}.", answer="", split="train", domain="notes")
                       for i in range(n)] + [Task(id="h0", prompt="Take notes.", answer="", split="heldout",
                                                  domain="notes")]

    def tasks(self, split: str) -> list[Task]:
        return [t for t in self._tasks if t.split == split]

    def environment(self, task: Task, limits: EnvLimits | None = None) -> NotesEnv:
        return NotesEnv(limits or self.limits)

    def verify(self, task: Task, completion: str) -> dict[str, Any]:
        return {"correct": False, "format_ok": True, "patch": completion}


@pytest.fixture()
def policy():
    model, tok = load_base_model("tiny-random", seed=0, initializer_range=0.5)
    pol = Policy(model, tok, LoraSettings(r=8, lora_alpha=16))
    pol.create("b0")
    return pol


def _collect(policy, limits, group=2, temperature=0.8, seed=1, max_new_tokens=64):
    domain = NotesDomain(limits)
    eng = TransformersEngine(policy)
    params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    return collect_groups(eng, domain, domain.tasks("train"), group, params, "b0", step=0), domain, eng


def test_masks_are_exactly_the_assistant_turns_and_the_record_round_trips(policy):
    limits = EnvLimits(max_turns=3, max_turn_tokens=7, max_context_tokens=1024)
    rollouts, _, eng = _collect(policy, limits)
    tok = policy.tokenizer
    assert len(rollouts) == 8 and [r.group for r in rollouts] == [0, 0, 1, 1, 2, 2, 3, 3]
    for r in rollouts:
        assert r.turns == 3 and len(r.turn_log) == 3 and r.stop_reason == "max_turns" and r.truncated
        assert r.prompt_ids == eng.encode([r.messages[:2]])[0]
        assert [m["role"] for m in r.messages] == ["system", "user"] + ["assistant", "user"] * 3
        assert len(r.completion_mask) == len(r.completion_ids) and sum(r.completion_mask) == len(r.logprobs)
        assert r.num_tokens == sum(t["tokens"] for t in r.turn_log) <= 3 * 7
        spans = [t["span"] for t in r.turn_log]
        inside = {i for a, b in spans for i in range(a, b)}
        assert [int(i in inside) for i in range(len(r.completion_ids))] == r.completion_mask
        assert spans[0][0] == 0 and spans[-1][1] == len(r.completion_ids)   # ends on the policy's last turn
        for turn, (a, b) in zip(r.turn_log, spans):
            assert turn["text"] == tok.decode(r.completion_ids[a:b], skip_special_tokens=True)
        for prev, (a, _), (_, end) in zip(r.turn_log, spans[1:], spans):
            gap = r.completion_ids[end:a]      # what the environment inserted: exactly the template's separator
            assert gap == turn_separator(tok, prev["result"], prev["stop_reason"] == "eos")
            assert prev["result"] in tok.decode(gap) and tok.decode(gap).rstrip().endswith("assistant")
        assert [c["name"] for c in r.tool_calls] == ["note"] * 3 and r.episode["stop_reason"] == "max_turns"
        assert r.visible["format_ok"] and not r.hidden
        back = Rollout.from_dict(json.loads(json.dumps(r.to_dict())))
        assert back == r


def test_limits_of_tokens_and_context_are_exact(policy):
    limits = EnvLimits(max_turns=10, max_turn_tokens=5, max_context_tokens=360)   # the opening is ~290
    rollouts, _, _ = _collect(policy, limits, group=1)
    for r in rollouts:
        assert r.stop_reason == "context" and 1 <= r.turns < 10 and not r.episode["submitted"]
        assert all(t["tokens"] <= 5 for t in r.turn_log)
        assert len(r.prompt_ids) + len(r.completion_ids) <= 360


@pytest.mark.parametrize("shared_prompts", [True, False])
def test_the_trainer_sees_the_samplers_logprobs_on_assistant_tokens_first_pass(policy, shared_prompts):
    """Ratio 1 on the first pass across a padded batch of trajectories of different lengths, and no
    gradient reaches a tool token: the loss is over the assistant's tokens alone. Both ways the
    trainer runs prompts (each distinct one once, or every row whole)."""
    limits = EnvLimits(max_turns=3, max_turn_tokens=9, max_context_tokens=1024)
    rollouts, _, _ = _collect(policy, limits, temperature=0.8)
    assert len({len(r.completion_ids) for r in rollouts}) > 1 and len({len(r.prompt_ids) for r in rollouts}) > 1
    cfg = GRPOConfig(temperature=0.8, num_generations=2, loss_type="grpo")
    tr = GRPOTrainer(policy, "b0", cfg, shared_prompts=shared_prompts)
    batch = tr._batch(rollouts)
    mask = batch["completion_mask"]
    assert int(mask.sum()) == sum(len(r.logprobs) for r in rollouts)
    for r in rollouts:   # each trajectory alone, unpadded: the sampler's numbers to float precision
        one = tr._batch([r])
        with torch.no_grad(), policy.adapter("b0") as m:
            lp = tr._logps(m, one)
        assert float(((lp - one["old_logps"]).abs() * one["completion_mask"]).max()) < 1e-4
    with policy.adapter("b0") as m:
        logps = tr._logps(m, batch)
    # padded into one batch (left and right), attention numerics move by a few 1e-4 at this init's large logits
    ratio = torch.exp(logps.detach() - batch["old_logps"])
    assert float(((ratio - 1).abs() * mask).max()) < 1e-3
    # at masked positions the trainer's logprobs are not the sampler's (those were not sampled): the mask matters
    gap = (logps.detach() - batch["old_logps"]).abs() * (1 - mask) * batch["completion_attention"]
    assert float(gap.max()) > 0.1

    leaf = logps.detach().requires_grad_(True)
    advantages = torch.tensor([1.0, -1.0] * (len(rollouts) // 2))
    loss, stats = grpo_loss(leaf, batch["old_logps"], advantages, mask, cfg)
    loss.backward()
    assert stats["clip_ratio/low"] == stats["clip_ratio/high"] == 0.0
    assert float(leaf.grad[mask == 0].abs().max()) == 0.0
    assert bool((leaf.grad[mask == 1] != 0).all())


def test_grpo_over_episodes_learns_a_first_turn_behaviour(policy):
    """Reward 1 when the first turn holds a target token (second turns are free): it must rise.
    A harness-style ``prompt`` keeps the opening short (and is what the episode starts from)."""
    G, limits = 8, EnvLimits(max_turns=2, max_turn_tokens=8, max_context_tokens=1024)
    domain = NotesDomain(limits)
    eng = TransformersEngine(policy)
    tasks = domain.tasks("train")
    short = lambda t: [{"role": "system", "content": "Notes."}, {"role": "user", "content": t.prompt}]  # noqa: E731

    def collect(seed, step=0):
        return collect_groups(eng, domain, tasks, G, SamplingParams(max_new_tokens=8, seed=seed), "b0", step, short)

    def first_turn(r):
        a, b = r.turn_log[0]["span"]
        return r.completion_ids[a:b]

    first = [r for seed in (100, 200, 300) for r in collect(seed)]   # seeds the steps below do not use
    assert all(r.messages[0]["content"] == "Notes." and r.turns == 2 for r in first)
    counts: dict[int, int] = {}
    for r in first:
        for t in set(first_turn(r)):
            counts[t] = counts.get(t, 0) + 1
    targets = set(sorted(counts, key=counts.get)[-3:])   # the behaviour: one of the 3 commonest tokens, first turn
    # lr 1e-2 over 16 steps: at 3e-2 one large update can push the first turn away from every target
    # for good, and whether it does depends on float noise (sampler and trainer paths that agree to
    # 1e-5 took different trajectories), so that setting tested luck, not learning
    tr = GRPOTrainer(policy, "b0", GRPOConfig(learning_rate=1e-2, num_generations=G, max_completion_length=8))
    means = []
    for step in range(16):
        rollouts = collect(step + 1, step)
        rewards = torch.tensor([float(bool(targets & set(first_turn(r)))) for r in rollouts]).view(-1, G)
        means.append(rewards.mean().item())
        tr.step(rollouts, group_advantages(rewards, "group").flatten().tolist())
    # measured with four other seed offsets: 0.06-0.09 at the first step; the last four 0.22-0.75, at
    # least +0.14 over the first four (a group whose task always or never shows a target is dead, so
    # some runs plateau near 0.25)
    assert means[0] < 0.4, means
    assert max(means[-4:]) >= 0.25 and sum(means[-4:]) / 4 >= sum(means[:4]) / 4 + 0.1, means


def test_heldout_verification_runs_episodes_and_hides_the_verdict(policy):
    domain = NotesDomain(EnvLimits(max_turns=2, max_turn_tokens=4, max_context_tokens=1024))
    out = verify(TransformersEngine(policy), domain, domain.tasks("heldout"), "b0", max_new_tokens=4, seeds=(0, 1))
    assert len(out) == 2 and all(r.turns == 2 and r.step == -1 and r.split == "heldout" for r in out)
    assert all(r.hidden["correct"] is False and set(r.visible) == {"format_ok"} for r in out)


def test_single_turn_records_stay_as_they_were():
    """A rollout written before episodes existed loads, counts and trains as before; an
    inconsistent multi-turn record is refused with what disagrees."""
    old = {"task_id": "t", "messages": [], "completion": "x", "prompt_ids": [1, 2], "completion_ids": [5, 6, 2],
           "logprobs": [-1.0, -2.0, -0.5], "turns": 1, "tool_calls": [], "visible": {"correct": True}}
    r = Rollout.from_dict(old)
    assert r.completion_mask == [] and r.sampled_mask() == [1, 1, 1] and r.num_tokens == 3
    r.completion_mask = [1, 0, 1]
    with pytest.raises(ValueError, match="3 completion tokens, a mask of 3 with 2 sampled, and 3 logprobs"):
        r.sampled_mask()
