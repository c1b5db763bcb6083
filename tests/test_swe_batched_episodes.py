"""A population's SWE episodes in lockstep (issue 48): each turn of every branch's episodes goes to the
transformers engine in one call, each row under its own branch's adapter (and tool-call grammar, for
guided members), and every branch gets the episodes, tokens and grades it gets alone.

Real parts: the SWE domain's generated repositories and sandboxed tool environment, the tiny random
model with three LoRA branches that really differ, the KV decoder."""

from __future__ import annotations

import pytest
import torch

from evotrainer.domains.code.executor import ExecLimits
from evotrainer.domains.swe.domain import SWEDomain
from evotrainer.domains.swe.environment import EnvLimits
from evotrainer.policy.base_model import load_base_model
from evotrainer.policy.collect import CollectJob, collect_many, default_prompt, shares_batches, verify, verify_many
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.policy.rollout_engine import SamplingParams, TransformersEngine

LIMITS = EnvLimits(max_turns=3, max_turn_tokens=16, max_context_tokens=1500)
BRANCHES = ("b1", "b2", "b3")


@pytest.fixture(scope="module")
def domain():
    d = SWEDomain(n_train=2, n_heldout=2, n_test=1, difficulty=1, seed=0, workers=1,
                  limits=ExecLimits(timeout_s=2.0), episode_limits=LIMITS)
    yield d
    d.close()


@pytest.fixture(scope="module")
def engine():
    model, tok = load_base_model("tiny-random", seed=0, initializer_range=0.5)
    pol = Policy(model, tok, LoraSettings(r=4, lora_alpha=8))
    torch.manual_seed(5)
    for name in BRANCHES:
        pol.create(name)
        with torch.no_grad():
            for p in pol.parameters(name):
                p.add_(torch.randn_like(p) * 0.3)
    eng = TransformersEngine(pol, decoder="kv", batch_size=4)
    calls = []
    original = eng.generate_ids_many
    eng.generate_ids_many = lambda jobs: calls.append(len(jobs)) or original(jobs)
    eng.calls = calls
    return eng


def _shape(rollouts):
    return [(r.task_id, r.completion_ids, r.completion_mask, r.stop_reason, r.turns, r.episode["guide"],
             r.visible, r.hidden) for r in rollouts]


def test_the_transformers_engine_shares_episode_turns_across_branches(engine, domain):
    assert shares_batches(engine, domain, 2) and not shares_batches(engine, domain, 1)


def test_every_branch_samples_the_episodes_it_samples_alone_up_to_rounding(engine, domain):
    """Training rollouts of three branches, one of them with guided members (tool-call grammar rows
    beside free rows), another at another seed: in lockstep, then one branch after another. A row
    under the gathered adapters gets the logits it gets alone within float rounding (1e-5), so its
    tokens are the same until a sampled draw lands within that rounding of the boundary between two
    tokens: on the tiny random model, whose distributions are flat over 49k tokens, that happens now
    and then within an episode's ~50 sampled tokens; the tokens before it match, their log-probs too."""
    tasks = domain.tasks("train")
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=1)
    guided = SamplingParams(temperature=1.0, max_new_tokens=16, seed=1, guided_call_share=0.5)
    jobs = [CollectJob(tasks, 2, params, "b1", default_prompt, 0),
            CollectJob(tasks, 2, guided, "b2", default_prompt, 0),
            CollectJob(tasks, 2, SamplingParams(temperature=1.0, max_new_tokens=16, seed=7), "b3", default_prompt, 0)]
    engine.calls.clear()
    together = collect_many(engine, domain, jobs)
    assert engine.calls and max(engine.calls) == 3, "the branches' turns never shared a call"
    same = 0
    for job, got in zip(jobs, together):
        [alone] = collect_many(engine, domain, [job])     # one branch: no shared call
        for g, a in zip(got, alone):
            assert (g.task_id, g.episode["guide"]) == (a.task_id, a.episode["guide"])
            k = next((i for i, (x, y) in enumerate(zip(g.completion_ids, a.completion_ids)) if x != y), None)
            if k is None and len(g.completion_ids) == len(a.completion_ids):
                same += 1
                assert _shape([g]) == _shape([a])
                k = len(g.completion_ids)
            else:
                assert g.completion_mask[k] == 1, "only a sampled token may differ, never the environment's"
            sampled = sum(g.completion_mask[:k])
            assert torch.allclose(torch.tensor(g.logprobs[:sampled]), torch.tensor(a.logprobs[:sampled]), atol=1e-4)
    assert same >= len(jobs) * 4 * 2 // 3, f"only {same} of 12 episodes matched"
    assert any(r.episode["guide"] == "call" for r in together[1])       # the grammar rows were there
    assert _shape(together[0]) != _shape(together[2])                   # branches and seeds differ


def test_heldout_verification_of_a_population_is_each_versions_own(engine, domain):
    """Greedy verification: the same episodes, tokens and hidden verdicts in lockstep as alone."""
    tasks = domain.tasks("heldout")
    jobs = [(tasks, adapter, default_prompt) for adapter in (None, "b1", "b3")]
    engine.calls.clear()
    together = verify_many(engine, domain, jobs, max_new_tokens=16, temperature=0.0, seeds=(0, 1))
    assert engine.calls and max(engine.calls) == 3
    for (ts, adapter, prompt), got in zip(jobs, together):
        alone = verify(engine, domain, ts, adapter, 16, 0.0, (0, 1), prompt)
        assert _shape(got) == _shape(alone), adapter
        assert all(r.visible.keys() <= {"format_ok"} for r in got)      # held-out verdicts stay hidden


def test_an_episode_batch_continues_from_kept_rows_and_releases_them_when_it_ends(engine, domain):
    """Within a batch each turn continues from the rows the last turn kept; after it, nothing continues
    them, and a SWE batch's rows (thousands of positions per row) are dropped instead of held through
    the training step."""
    reused = engine._kv.reused_tokens if engine._kv is not None else 0
    verify_many(engine, domain, [(domain.tasks("heldout"), a, default_prompt) for a in ("b1", "b2")],
                max_new_tokens=16, temperature=0.0, seeds=(0,))
    assert engine._kv.reused_tokens > reused, "the episodes' turns never continued a kept row"
    assert engine._kv.kept == {}
