"""Behaviour cloning on guided calls (``guided_imitation``, policy/imitation.py): real SWE episodes of a
tiny random model, half of each group guided under the call grammar; the imitated tokens are exactly
the guided turns whose call the environment accepted; a step whose groups are all dead still trains
on them and raises their log-likelihood; the knob, its config check and its library entry."""

import pytest
import torch

from evotrainer.policy.grpo import GRPOTrainer
from evotrainer.policy.grpo_config import GRPOConfig
from evotrainer.policy.imitation import imitation_mask, to_imitate


@pytest.fixture(scope="module")
def episodes(tiny):
    """A tiny-model policy and one step of level-1 SWE episodes: 2 issues x 2, one of each pair guided."""
    from evotrainer.domains.code.executor import ExecLimits
    from evotrainer.domains.swe.domain import SWEDomain
    from evotrainer.domains.swe.environment import EnvLimits
    from evotrainer.policy.collect import collect_groups
    from evotrainer.policy.lora import LoraSettings, Policy
    from evotrainer.policy.rollout_engine import SamplingParams, TransformersEngine

    model, tok = tiny
    pol = Policy(model, tok, LoraSettings(r=4, lora_alpha=8))
    pol.create("im")
    limits = EnvLimits(max_turns=2, max_turn_tokens=60, max_context_tokens=4000)
    domain = SWEDomain(n_train=2, n_heldout=1, n_test=1, difficulty=1, seed=0, workers=1,
                       limits=ExecLimits(timeout_s=2.0), episode_limits=limits)
    try:
        params = SamplingParams(max_new_tokens=60, seed=5, guided_call_share=0.5)
        rollouts = collect_groups(TransformersEngine(pol), domain, domain.tasks("train"), 2, params, "im", step=0)
    finally:
        domain.close()
    return pol, domain, rollouts


def _accepted(call):
    return bool(call and call.get("name") and call.get("error") is None)


def test_the_imitated_tokens_are_the_guided_turns_whose_call_was_accepted(episodes):
    _, _, rollouts = episodes
    guided = [r for r in rollouts if r.episode["guided"]]
    assert guided and len(guided) < len(rollouts)
    for r in rollouts:
        mask = imitation_mask(r)
        assert len(mask) == len(r.completion_ids)
        if not r.episode["guided"]:
            assert not any(mask)   # a free member's own calls are never imitated
            continue
        want = [0] * len(mask)
        for turn in r.turn_log:
            if _accepted(turn["tool_call"]):
                a, b = turn["span"]
                want[a:b] = [1] * (b - a)
        assert mask == want
        assert all(r.sampled_mask()[i] for i, m in enumerate(mask) if m)   # tool results are not imitated
    assert sum(map(sum, (imitation_mask(r) for r in guided))) > 0, [r.tool_calls for r in guided]
    assert to_imitate(rollouts) == [r for r in guided if any(imitation_mask(r))]


def test_a_guided_edit_is_imitated_only_when_its_patch_broke_no_passing_test(episodes):
    """The grammar makes a guided edit apply, not keep the module working: an accepted edit turn of an
    episode whose graded patch broke a PASS_TO_PASS test is left out, its other accepted turns stay."""
    _, _, rollouts = episodes
    r = next(r for r in rollouts if r.episode["guided"] and sum(imitation_mask(r)))
    turns = [t for t in r.turn_log if _accepted(t["tool_call"])]

    def variant(passed):
        c = type(r).from_dict(r.to_dict())
        c.turn_log[r.turn_log.index(turns[0])]["tool_call"]["name"] = "edit"   # the first accepted call, an edit
        c.visible = {"patch_applied": True, "pass_to_pass": {"t::a": {"passed": True}, "t::b": {"passed": passed}}}
        return c

    kept, broke = imitation_mask(variant(True)), imitation_mask(variant(False))
    a, b = turns[0]["span"]
    assert kept == imitation_mask(r) and any(kept[a:b])        # a harmless edit is imitated like any accepted call
    assert not any(broke[a:b])                                  # the breaking one is not
    assert broke[:a] + broke[b:] == kept[:a] + kept[b:]         # the episode's other accepted turns still are
    hidden_only = variant(False)
    hidden_only.hidden, hidden_only.visible = hidden_only.visible, {}
    assert imitation_mask(hidden_only) == kept                  # training reads only the visible grade


def _imitated_logp(pol, branch, rollouts):
    """The imitated tokens' summed log-probability under ``branch``, as the trainer computes it."""
    trainer = GRPOTrainer(pol, branch, GRPOConfig(guided_imitation=1.0))
    total = 0.0
    with torch.no_grad(), pol.adapter(branch) as m:
        for r in rollouts:
            b = trainer._batch([r])
            total += float((trainer._logps(m, b) * b["imitation_mask"]).sum())
    return total


def test_a_step_with_every_group_dead_still_imitates_the_accepted_calls(episodes):
    """With no advantage anywhere, imitation alone trains the branch and the imitated calls become
    likelier; with guided_imitation 0 the same call has nothing to train on."""
    pol, _, rollouts = episodes
    pol.create("clone")
    imitate = to_imitate(rollouts)
    before = _imitated_logp(pol, "clone", imitate)
    trainer = GRPOTrainer(pol, "clone", GRPOConfig(guided_imitation=1.0, learning_rate=5e-3))
    first = trainer.step([], [], imitate=imitate)
    for _ in range(2):
        last = trainer.step([], [], imitate=imitate)
    assert first["imitated_tokens"] == sum(sum(imitation_mask(r)) for r in imitate)
    assert first["grad_norm"] > 0 and last["imitation_nll"] < first["imitation_nll"]
    assert _imitated_logp(pol, "clone", imitate) > before
    with pytest.raises(ValueError, match="nothing to train on"):
        GRPOTrainer(pol, "clone", GRPOConfig()).step([], [], imitate=imitate)


def test_imitation_adds_to_the_policy_gradient_and_leaves_it_alone_at_zero(episodes):
    """Rows with advantages plus imitation: the loss is the policy loss plus coef x the imitated NLL,
    and at coef 0 the step is the policy gradient's own."""
    pol, _, rollouts = episodes
    advs = [1.0 if r.episode["guided"] else -1.0 for r in rollouts]
    losses = {}
    for coef in (0.0, 2.0):
        pol.create(f"mix{int(coef)}")
        stats = GRPOTrainer(pol, f"mix{int(coef)}", GRPOConfig(guided_imitation=coef)).step(rollouts, advs,
                                                                                       imitate=to_imitate(rollouts))
        losses[coef] = stats
    assert "imitation_nll" not in losses[0.0]
    assert losses[2.0]["loss"] == pytest.approx(losses[0.0]["loss"] + 2.0 * losses[2.0]["imitation_nll"], rel=1e-4)


def test_train_step_imitates_when_every_group_is_dead_and_skips_without_it(episodes):
    from evotrainer.policy.train_step import train_step

    pol, domain, rollouts = episodes

    class DeadHarness:   # a reward the policy cannot earn: every group dead
        knob_values: dict = {}

        def reward(self, rs, tasks):
            return [0.0] * len(rs)

        def keep_groups(self, groups):
            return [True] * len(groups)

        def advantages(self, groups, rewards):
            return [[0.0] * len(r) for r in rewards]

        def metrics(self, rs, groups):
            return {}

    for coef, skipped in ((1.0, False), (0.0, True)):
        pol.create(f"ts{int(coef)}")
        trainer = GRPOTrainer(pol, f"ts{int(coef)}", GRPOConfig(num_generations=2, guided_imitation=coef))
        copies = [type(r).from_dict(r.to_dict()) for r in rollouts]
        _, m = train_step(pol, None, trainer, DeadHarness(), domain, domain.tasks("train"), f"ts{int(coef)}", step=0,
                          seed=0, sampled=(copies, 0.0))
        assert bool(m.get("skipped")) is skipped, m
        assert (m.get("imitated_tokens", 0) > 0) is not skipped


def test_the_knob_its_config_check_and_its_library_entry():
    from evotrainer.config import parse_config
    from evotrainer.genome.edits import acts_only_in_a_step, factors_changed
    from evotrainer.genome.program import HarnessProgram
    from evotrainer.loop.seed import DOMAIN_HARNESSES
    from evotrainer.loop.tools.validate import config_problems
    from evotrainer.operators import get_operator
    from evotrainer.operators.base import Evidence
    from evotrainer.operators.knobs import inert_knobs, skipped_every_step
    from evotrainer.operators.library import default_entries, propose_entry

    with pytest.raises(ValueError, match="guided_imitation must be >= 0"):
        GRPOConfig(guided_imitation=-1.0)
    swe = {"model": "tiny-random", "domain": {"name": "swe", "difficulty": 1}}
    alone = parse_config({**swe, "grpo": {"guided_imitation": 1.0}})
    assert any("guided_imitation" in p and "guided_call_share" in p for p in config_problems(alone, loop=False))
    ok = parse_config({**swe, "grpo": {"guided_imitation": 1.0, "guided_call_share": 0.5}})
    assert not any("guided_imitation" in p for p in config_problems(ok, loop=False))
    # The SWE harness imitates by default: inert while nothing is guided, so the seed config is fine.
    assert not any("guided_imitation" in p for p in config_problems(parse_config(swe), loop=False))

    # It trains with no advantage, so a parent whose steps were all skipped does not make it inert.
    seed = HarnessProgram.from_file(DOMAIN_HARNESSES["swe"])
    assert seed.knobs["guided_imitation"]["value"] == 1.0   # on by default, inert until a child guides
    assert not acts_only_in_a_step(seed, "guided_imitation")
    assert "guided_imitation" in inert_knobs({"guided_call_share": 0.0})
    assert "guided_imitation" not in inert_knobs({"guided_call_share": 0.5})
    dead = Evidence(health_report={"engine": {"dead_group_ratio": 1.0}})
    assert skipped_every_step(dead, {"guided_call_share": 0.5})
    assert not skipped_every_step(dead, {"guided_call_share": 0.5, "guided_imitation": 1.0})

    op = get_operator("library")
    def entry_unavailable(program):
        return {e.id: e for e in default_entries()}["swe_imitate_guided_calls"].unavailable(program)

    free = {"metrics": {"turns_mean": 4.0, "malformed_call_rate": 1.0, "dead_group_ratio": 1.0,
                        "guided_episode_rate": 0.0}}
    assert "swe_imitate_guided_calls" not in {a.entry.id for a in op.applicable(seed, Evidence(health_report=free))[0]}
    guided = {"metrics": {**free["metrics"], "guided_episode_rate": 0.5}}
    assert entry_unavailable(seed.with_knobs(guided_call_share=0.5))   # already imitating at its largest weight
    parent = seed.with_knobs(guided_call_share=0.5, guided_imitation=0.0)
    found, skipped = op.applicable(parent, Evidence(health_report=guided))
    assert "swe_imitate_guided_calls" in {a.entry.id for a in found}, skipped
    entry = {e.id: e for e in default_entries()}["swe_imitate_guided_calls"]
    assert [c["value"] for c in entry.combinations(parent)] == [0.5, 1.0]
    child = HarnessProgram(propose_entry("library", parent, entry, {"value": 1.0},
                                         Evidence(health_report=guided)).child_source)
    assert factors_changed(parent, child) == ["knob:guided_imitation"]
    assert child.knobs["guided_imitation"]["value"] == 1.0


def test_selection_counts_a_group_that_imitated_as_one_with_a_gradient(episodes):
    """train_live_groups (selection's last tie-break) is the share of groups that gave the update a
    gradient: with every reward equal, the groups holding calls to imitate count only at a step that
    imitated them; a reward difference counts either way."""
    from evotrainer.loop.stages.selection import groups_with_gradient

    _, _, rollouts = episodes
    dead = [type(r).from_dict(r.to_dict()) for r in rollouts]
    for r in dead:
        r.reward = 0.0
    n_groups = len({(r.step, r.group) for r in dead})
    with_calls = len({(r.step, r.group) for r in dead if any(imitation_mask(r))})
    assert 0 < with_calls <= n_groups
    imitated = [{"step": 0, "imitated_tokens": 12, "skipped": 0.0}]
    assert groups_with_gradient(dead, imitated) == with_calls / n_groups
    assert groups_with_gradient(dead, [{"step": 0, "skipped": 1.0}]) == 0.0     # no step imitated: all dead
    assert groups_with_gradient(dead, [{"step": 0, "imitated_tokens": 12, "skipped": 1.0}]) == 0.0
    dead[0].reward = 1.0                                                           # one group with a difference
    assert groups_with_gradient(dead, []) == 1 / n_groups
    assert groups_with_gradient([], imitated) is None
