"""Policy substrate on a tiny random model: rollout engine, LoRA branches, the GRPO trainer learning."""

import contextlib

import pytest
import torch

from evotrainer.policy.base_model import load_base_model
from evotrainer.policy.grpo import GRPOConfig, GRPOTrainer, group_advantages, per_token_logps
from evotrainer.policy.lora import AdapterNotAppliedError, LoraSettings, Policy
from evotrainer.policy.rollout_engine import SamplingParams, TransformersEngine
from evotrainer.records.rollout import Rollout

PROMPTS = [[{"role": "user", "content": f"Count to {i}."}] for i in range(1, 6)]


@pytest.fixture(params=["kv", "generate"])
def decoder(request):
    """The engine tests hold for both ways TransformersEngine samples."""
    return request.param


@pytest.fixture()
def policy():
    model, tok = load_base_model("tiny-random", seed=0, initializer_range=0.5)
    pol = Policy(model, tok, LoraSettings(r=8, lora_alpha=16))
    pol.create("b0")
    return pol


def _rollouts(outs, group_size):
    return [Rollout(task_id=str(i // group_size), messages=[], completion=o.text, prompt_ids=o.prompt_ids,
                    completion_ids=o.completion_ids, logprobs=o.logprobs, truncated=o.truncated)
            for i, o in enumerate(outs)]


def test_same_seed_same_tokens_and_other_seed_differs(policy, decoder):
    eng = TransformersEngine(policy, decoder=decoder)
    a = eng.generate(PROMPTS, SamplingParams(max_new_tokens=12, seed=7), adapter="b0")
    b = eng.generate(PROMPTS, SamplingParams(max_new_tokens=12, seed=7), adapter="b0")
    c = eng.generate(PROMPTS, SamplingParams(max_new_tokens=12, seed=8), adapter="b0")
    assert [x.completion_ids for x in a] == [x.completion_ids for x in b]
    assert [x.completion_ids for x in a] != [x.completion_ids for x in c]


def test_sampler_logprobs_equal_a_training_forward_pass(policy, decoder):
    """The stored sampler logprobs are what the trainer's ratio divides by: they must agree."""
    eng = TransformersEngine(policy, decoder=decoder)
    outs = eng.generate(PROMPTS, SamplingParams(temperature=0.8, max_new_tokens=10, seed=1), adapter="b0")
    for o in outs:
        ids = torch.tensor([o.prompt_ids + o.completion_ids])
        with policy.adapter("b0") as m:
            lp = per_token_logps(m, ids, torch.ones_like(ids), len(o.completion_ids), 0.8)[0]
        assert torch.allclose(lp, torch.tensor(o.logprobs), atol=1e-4)
        assert len(o.logprobs) == len(o.completion_ids)


def test_with_top_p_the_ratio_is_one_on_the_first_pass(policy, decoder):
    """The sampler records logprobs after its top-p filter; the trainer must take them under the same
    filter, or the importance ratio is biased below 1 whenever top_p < 1."""
    eng = TransformersEngine(policy, decoder=decoder)
    outs = eng.generate(PROMPTS, SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=10, seed=3), adapter="b0")
    worst_filtered = worst_plain = 0.0
    for o in outs:
        ids = torch.tensor([o.prompt_ids + o.completion_ids])
        with policy.adapter("b0") as m:
            filtered = per_token_logps(m, ids, torch.ones_like(ids), len(o.completion_ids), 1.0, top_p=0.9)[0]
            plain = per_token_logps(m, ids, torch.ones_like(ids), len(o.completion_ids), 1.0)[0]
        sampler = torch.tensor(o.logprobs)
        worst_filtered = max(worst_filtered, float((filtered - sampler).abs().max()))
        worst_plain = max(worst_plain, float((plain - sampler).abs().max()))
    assert worst_filtered < 1e-4                 # ratio exp(new - old) == 1 on the first pass
    assert worst_plain > 1e-3                    # without the filter it is not: the bias this fixes


def test_a_kl_step_trains_even_when_every_advantage_is_zero(policy):
    from evotrainer.genome.harness import Harness
    from evotrainer.domains import get_domain
    from evotrainer.policy.train_step import train_step

    domain = get_domain("math", difficulty=1, n_train=4, n_heldout=2, n_test=2)
    tasks = domain.tasks("train")[:2]
    eng = TransformersEngine(policy)
    zero = "def reward(rollouts, tasks):\n    return [0.0 for r in rollouts]\n"
    from evotrainer.genome.edits import rewrite_hook
    from evotrainer.genome.program import reference_program

    with Harness(rewrite_hook(reference_program(), "reward", zero)) as h:
        for beta, skipped in ((0.0, True), (0.1, False)):
            trainer = GRPOTrainer(policy, "b0", GRPOConfig(num_generations=2, max_completion_length=6, beta=beta))
            _, m = train_step(policy, eng, trainer, h, domain, tasks, "b0", 1, 0)
            assert bool(m.get("skipped")) is skipped, (beta, m)


def test_left_padded_batch_matches_single_prompt_greedy(policy, decoder):
    eng = TransformersEngine(policy, decoder=decoder)
    batched = eng.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=8), adapter="b0")
    alone = [eng.generate([p], SamplingParams(temperature=0, max_new_tokens=8), adapter="b0")[0] for p in PROMPTS]
    assert [b.completion_ids for b in batched] == [a.completion_ids for a in alone]


def test_truncation_and_stop_strings(policy, decoder):
    eng = TransformersEngine(policy, decoder=decoder)
    outs = eng.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=6), adapter="b0")
    for o in outs:
        assert o.truncated == (o.stop_reason == "length")
        assert o.truncated or o.completion_ids[-1] == policy.tokenizer.eos_token_id
    # Stop on the text of the first generated token: generation must cut right there.
    first = policy.tokenizer.decode(outs[0].completion_ids[:2], skip_special_tokens=True).strip()
    if first:
        stopped = eng.generate(PROMPTS[:1], SamplingParams(temperature=0, max_new_tokens=6, stop=(first,)),
                               adapter="b0")[0]
        assert stopped.stop_reason == "stop_string" and not stopped.truncated
        assert first in stopped.text and len(stopped.completion_ids) <= 2


def test_fork_copies_and_training_child_leaves_parent(policy):
    policy.fork("b0", "b1")
    before = policy.probe_logprobs("b0").clone()
    tr = GRPOTrainer(policy, "b1", GRPOConfig(learning_rate=5e-2, num_generations=2, max_completion_length=8))
    outs = TransformersEngine(policy).generate(PROMPTS[:2] * 2, SamplingParams(max_new_tokens=8, seed=0), "b1")
    tr.step(_rollouts(outs, 2), [1.0, -1.0, -1.0, 1.0])
    assert torch.equal(policy.probe_logprobs("b0"), before)          # parent untouched
    assert not torch.equal(policy.probe_logprobs("b1"), before)      # child moved
    policy.check_adapter_applied("b1")


def test_save_load_round_trip(policy, tmp_path):
    tr = GRPOTrainer(policy, "b0", GRPOConfig(learning_rate=5e-2, num_generations=2, max_completion_length=8))
    outs = TransformersEngine(policy).generate(PROMPTS[:2] * 2, SamplingParams(max_new_tokens=8, seed=0), "b0")
    tr.step(_rollouts(outs, 2), [1.0, -1.0, -1.0, 1.0])
    policy.save("b0", tmp_path / "adapter")
    policy.load("b0copy", tmp_path / "adapter")
    assert torch.allclose(policy.probe_logprobs("b0"), policy.probe_logprobs("b0copy"), atol=1e-6)
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        policy.load("nope", tmp_path / "missing")


def test_adapter_applied_check_catches_rollouts_from_the_base_model(policy, monkeypatch):
    with torch.no_grad():
        for p in policy.parameters("b0"):
            p.add_(torch.randn_like(p) * 0.5)
    policy.check_adapter_applied("b0")  # applied: passes

    real = policy.adapter

    @contextlib.contextmanager
    def buggy(name):  # the bug peers shipped: the adapter is selected but not applied
        with real(None) as m:
            yield m

    monkeypatch.setattr(policy, "adapter", buggy)
    with pytest.raises(AdapterNotAppliedError, match="not applied"):
        policy.check_adapter_applied("b0")


def test_trainer_learns_to_emit_a_target_token(policy):
    """Sign and plumbing: reward = 1 when the completion contains a target token; it must rise."""
    G = 8
    eng = TransformersEngine(policy)
    prompts = [[{"role": "user", "content": f"Say something {i}"}] for i in range(4)]
    first = eng.generate([p for p in prompts for _ in range(G)], SamplingParams(max_new_tokens=8, seed=0), "b0")
    counts: dict[int, int] = {}
    for o in first:
        for t in set(o.completion_ids):
            counts[t] = counts.get(t, 0) + 1
    target = max(counts, key=counts.get)
    tr = GRPOTrainer(policy, "b0", GRPOConfig(learning_rate=1e-2, num_generations=G, max_completion_length=8))
    means = []
    for step in range(12):
        outs = eng.generate([p for p in prompts for _ in range(G)], SamplingParams(max_new_tokens=8, seed=step + 1),
                            "b0")
        rewards = torch.tensor([float(target in o.completion_ids) for o in outs]).view(-1, G)
        means.append(rewards.mean().item())
        tr.step(_rollouts(outs, G), group_advantages(rewards, "group").flatten().tolist())
    assert means[0] < 0.4, means
    assert max(means[-4:]) >= 0.8, means


def test_engine_runs_the_bare_base_model_before_any_branch_exists():
    model, tok = load_base_model("tiny-random", seed=0)
    outs = TransformersEngine(Policy(model, tok)).generate(PROMPTS[:2], SamplingParams(max_new_tokens=4), None)
    assert len(outs) == 2 and all(1 <= len(o.completion_ids) <= 4 for o in outs)


def test_converted_embedded_model_carries_no_stale_gguf_quantization_mark():
    import json

    from evotrainer.policy.base_model import embedded_model_dir

    cfg = json.loads((embedded_model_dir() / "config.json").read_text())
    assert "quantization_config" not in cfg  # else trainers refuse to train the dequantised weights


def test_a_child_trainer_continues_its_parents_adamw_moments_with_its_own_hyperparameters(policy, tmp_path):
    eng = TransformersEngine(policy)
    outs = eng.generate([p for p in PROMPTS[:2] for _ in range(4)], SamplingParams(max_new_tokens=6, seed=0), "b0")
    advantages = [1.0, -1.0, 0.5, -0.5] * 2
    parent = GRPOTrainer(policy, "b0", GRPOConfig(learning_rate=1e-3, num_generations=4, max_completion_length=6))
    for _ in range(2):
        parent.step(_rollouts(outs, 4), advantages)
    torch.save(parent.optimizer_state(), tmp_path / "optimizer.pt")   # what a version dir keeps

    policy.fork("b0", "b1")
    child = GRPOTrainer(policy, "b1", GRPOConfig(learning_rate=5e-4, num_generations=4, max_completion_length=6))
    child.load_optimizer_state(torch.load(tmp_path / "optimizer.pt", weights_only=True))
    state = child.optimizer.state_dict()
    assert len(state["state"]) == len(child.params) and float(state["state"][0]["step"]) == 2.0
    assert torch.equal(state["state"][0]["exp_avg_sq"], parent.optimizer_state()[0]["exp_avg_sq"])
    assert all(g["lr"] == 5e-4 for g in child.optimizer.param_groups)   # the child's own recipe
    child.step(_rollouts(outs, 4), advantages)
    assert float(child.optimizer_state()[0]["step"]) == 3.0
    # The moments live on the child's own parameters: the parent's are untouched by the child's step.
    assert child.params[0] is not parent.params[0]

    model, tok = load_base_model("tiny-random", seed=0)
    other = Policy(model, tok, LoraSettings(r=4))   # another LoRA rank: the moments cannot fit
    other.create("r4")
    with pytest.raises(ValueError, match="another LoRA shape"):
        GRPOTrainer(other, "r4", GRPOConfig()).load_optimizer_state(parent.optimizer_state())


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_a_step_over_several_micro_batches_equals_one_over_the_whole_batch(policy, loss_type):
    """GRPOTrainer.step's micro-batching (per_device_train_batch_size below the batch) accumulates the
    gradient TRL's accumulation gives (tests/test_grpo_vs_trl.py, micro-batches): for these loss types,
    with equal-sized micro-batches, that is the one-micro-batch gradient, whatever the token counts."""
    policy.fork("b0", "one")
    policy.fork("b0", "two")
    outs = TransformersEngine(policy).generate(PROMPTS[:2] * 2, SamplingParams(max_new_tokens=8, seed=0), "b0")
    rollouts, advs = _rollouts(outs, 2), [1.0, -1.0, -0.5, 0.5]
    for r, n in zip(rollouts, (8, 3, 8, 5)):   # unequal token counts across and within micro-batches
        r.completion_ids, r.logprobs = r.completion_ids[:n], r.logprobs[:n]
    assert sorted(len(r.completion_ids) for r in rollouts) == [3, 5, 8, 8]
    grads = {}
    for branch, mb in (("one", 4), ("two", 2)):
        cfg = GRPOConfig(learning_rate=1e-2, num_generations=2, max_completion_length=8, loss_type=loss_type,
                         per_device_train_batch_size=mb, max_grad_norm=1e9)
        tr = GRPOTrainer(policy, branch, cfg)
        tr.step(rollouts, advs)
        grads[branch] = [p.grad.clone() for p in tr.params]
    assert any(g.abs().sum() > 0 for g in grads["one"])
    for a, b in zip(grads["one"], grads["two"]):
        assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()
    # The exact check is the gradient's, above. AdamW's first step is about lr * sign(g), so an entry
    # whose gradient is at float-noise level may move by up to lr either way: the policies after the
    # step agree to ~1e-4 on these ~25-nat log-probs, not to the last bit.
    assert torch.allclose(policy.probe_logprobs("one"), policy.probe_logprobs("two"), atol=1e-3)


def test_a_model_folder_without_a_chat_template_is_said_to_get_chatml(tmp_path, caplog):
    """A user's base-model folder with no chat template used to get SmolLM2's ChatML silently."""
    import logging

    from evotrainer.policy.base_model import CHATML_TEMPLATE, load_tokenizer

    model, tok = load_base_model("tiny-random", seed=0)
    model.save_pretrained(tmp_path / "bare")
    tok.chat_template = None
    tok.save_pretrained(tmp_path / "bare")
    (tmp_path / "bare" / "chat_template.jinja").unlink(missing_ok=True)
    with caplog.at_level(logging.WARNING, logger="evotrainer.policy.base_model"):
        bare = load_tokenizer(str(tmp_path / "bare"))
    assert bare.chat_template == CHATML_TEMPLATE
    assert any("has no chat template" in r.getMessage() and "bare" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="evotrainer.policy.base_model"):
        load_tokenizer("tiny-random")
    assert not any("chat template" in r.getMessage() for r in caplog.records)


def test_a_fresh_adapter_is_drawn_from_the_policy_seed_alone():
    """What a process drew before (another model loaded, sampling) does not change a fresh adapter: one
    seed, the same LoRA A matrices; another seed, others. The global random stream is left as it was."""
    def lora_a(seed, draws_before):
        model, tok = load_base_model("tiny-random", seed=0)
        pol = Policy(model, tok, LoraSettings(r=8, lora_alpha=16), seed=seed)
        torch.rand(draws_before)
        pol.create(f"b{draws_before}")
        name = f"b{draws_before}"
        return {k.replace(name, "x"): v.detach().clone() for k, v in pol.model.named_parameters() if "lora_A" in k}

    first, second, other = lora_a(3, 1), lora_a(3, 1000), lora_a(4, 1)
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    model, tok = load_base_model("tiny-random", seed=0)
    torch.manual_seed(11)
    Policy(model, tok, LoraSettings(r=8, lora_alpha=16), seed=5).create("c")
    assert torch.equal(torch.rand(3), expected)


def test_long_rows_train_in_smaller_micro_batches_with_the_same_gradient(policy, monkeypatch):
    """A child that raised code's completion cap to 512 tokens took a suite process past 19 GB (16 rows
    of 730 tokens, each keeping its attention scores for the backward pass). The step now splits rows
    whose attention would pass ATTENTION_BUDGET into smaller equal micro-batches: the defaults keep
    their 16 rows, and the gradient is the one-micro-batch gradient."""
    from evotrainer.policy import grpo

    budget = grpo.ATTENTION_BUDGET
    assert grpo.micro_batch_rows(16, 346, 16, budget) == 16   # code-2's longest prompt, a 128-token completion
    assert grpo.micro_batch_rows(16, 730, 16, budget) == 2    # the same prompt and a 512-token completion
    assert grpo.micro_batch_rows(13, 730, 16, budget) == 3    # no divisor near the limit: uneven, at the limit
    assert grpo.micro_batch_rows(16, 100, 4, budget) == 4 and grpo.micro_batch_rows(3, 10_000, 16, budget) == 1
    assert grpo.micro_batch_rows(16, 730, 16, None) == 16     # on a GPU: per_device_train_batch_size alone
    policy.fork("b0", "whole")
    policy.fork("b0", "split")
    outs = TransformersEngine(policy).generate(PROMPTS[:2] * 2, SamplingParams(max_new_tokens=8, seed=0), "b0")
    rollouts, advs = _rollouts(outs, 2), [1.0, -1.0, -0.5, 0.5]
    longest = max(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts)
    grads, passes = {}, {}
    for branch, budget in (("whole", 10**9), ("split", 2 * longest ** 2)):
        monkeypatch.setattr(grpo, "ATTENTION_BUDGET", budget)
        tr = GRPOTrainer(policy, branch, GRPOConfig(learning_rate=1e-2, num_generations=2, max_completion_length=8,
                                                    max_grad_norm=1e9))
        calls = []
        forward = tr._logps
        tr._logps = lambda model, b: calls.append(b["completion_ids"].shape[0]) or forward(model, b)
        tr.step(rollouts, advs)
        grads[branch], passes[branch] = [p.grad.clone() for p in tr.params], calls
    assert passes == {"whole": [4], "split": [2, 2]}
    assert any(g.abs().sum() > 0 for g in grads["whole"])
    for a, b in zip(grads["whole"], grads["split"]):
        assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()
