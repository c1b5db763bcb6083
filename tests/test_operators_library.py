"""The intervention library and the ``library`` operator: every entry makes an accepted child of the
reference harness, its hook runs in the real sandbox and does what the entry says, its expected effect
is met by the real backtest on constructed cached rollouts, triggers and weights decide what is
proposed, and the entries export as seed skills the skill library can read."""

import json
from pathlib import Path

import pytest

from evotrainer.fitness.backtest import backtest
from evotrainer.fitness.cache import write_version
from evotrainer.genome import reference_program as reference
from evotrainer.genome.edits import factors_changed
from evotrainer.genome.harness import Harness
from evotrainer.genome.program import HOOK_PARAMS, HarnessProgram
from evotrainer.loop.knowledge.skills import Skill
from evotrainer.operators import FITNESS_METRIC, Evidence, OperatorError, available_operators, get_operator
from evotrainer.operators.library import (
    LibraryOperator,
    default_entries,
    entries_text,
    propose_entry,
    seed_skills,
)
from evotrainer.operators.triggers import TRIGGER_OPS, report_metrics
from evotrainer.records.rollout import Rollout

REPORT = json.loads((Path(__file__).parent / "fixtures" / "health_report_demo.json").read_text())
ENTRIES = {e.id: e for e in default_entries()}
# Entries that apply to the (math) reference harness as it is; the episode-only SWE entries are
# tested on the SWE reference in test_swe_interventions.py.
READY = [e for e in ENTRIES.values() if e.requires_hook is None and not e.episodes_only]
CASES = [(e.id, p) for e in READY for p in e.combinations(reference())]
REPLAYED = ("dead_group_ratio", "kept_group_ratio")   # what the backtest's replay recomputes


def test_the_library_covers_the_known_interventions():
    required = {"format_partial_credit", "dapo_dynamic_sampling", "dapo_overlong_shaping", "std_group_filter",
                "rloo_advantages", "dr_grpo_advantages", "length_penalty", "pass_rate_curriculum",
                "easy_first_curriculum", "lower_temperature", "raise_temperature", "lower_learning_rate",
                "raise_learning_rate", "more_generations"}
    assert required <= set(ENTRIES) and len(ENTRIES) >= 12
    for e in ENTRIES.values():
        kind, _, target = e.factor.partition(":")
        assert kind in ("knob", "hook") and target and e.source and e.summary
        assert e.trigger and all(c["op"] in TRIGGER_OPS and isinstance(c["value"], float | int) for c in e.trigger)
        # A claim the replay can check, or the fitness judged after training: never an unmeasured metric.
        # A validity hook changes no training: its claim is the engine's train/held-out gap it guards
        # (measured after training); its credit is its score on labelled history (the backtest).
        guarded = ("train_heldout_gap",) if target == "validity" else ()
        # An episode entry may claim the call-form rate the SWE harness measures on the child's rollouts,
        # or the progress or guided-breaking rate the engine measures on them (all judged after training).
        episodes = ("malformed_call_rate", "train_progress_rate", "train_guided_breaking_rate") if e.episodes_only else ()
        assert e.expected_effect.metric in REPLAYED + (FITNESS_METRIC,) + guarded + episodes
        if kind == "hook":
            assert target in HOOK_PARAMS or target == e.requires_hook
        else:
            assert e.move is not None and e.move.knob == target


@pytest.mark.parametrize("entry_id,params", CASES, ids=[f"{i}-{'-'.join(map(str, p.values()))}" for i, p in CASES])
def test_every_entry_makes_an_accepted_single_factor_child_of_the_reference(entry_id, params):
    entry, parent = ENTRIES[entry_id], reference()
    iv = propose_entry("library", parent, entry, params, Evidence(health_report=REPORT))
    assert iv.factors == [entry.factor] == factors_changed(parent, iv.child())
    assert iv.details["entry"] == entry_id and iv.details["params"] == params
    assert iv.expected_effect == entry.expected_effect and iv.hypothesis
    if entry.move is not None:
        assert iv.child().knobs[entry.move.knob]["value"] == params["value"] != parent.knobs[entry.move.knob]["value"]


def _rollout(group, correct, fmt=False, n=8, truncated=False, step=0):
    return Rollout(task_id=f"t{step}-{group}", messages=[{"role": "user", "content": "q"}], completion="x",
                   completion_ids=list(range(n)), logprobs=[-1.0] * n, truncated=truncated, step=step, group=group,
                   visible={"correct": correct, "format_ok": fmt}, reward=float(correct))


def _tasks(rollouts):
    return [{"id": r.task_id, "prompt": "q", "split": "train", "domain": "math", "difficulty": 0, "visible": {}}
            for r in rollouts]


def _child(entry_id, **params):
    return ENTRIES[entry_id].apply(reference(), params)


def test_reward_templates_compute_what_they_say_in_the_sandbox():
    # max_completion_length is 64 in the reference: 64 tokens or truncated is at the limit.
    rs = [_rollout(0, True, True, n=10), _rollout(0, False, True, n=20), _rollout(0, False, False, n=60),
          _rollout(0, False, False, n=64, truncated=True)]
    with Harness(_child("format_partial_credit", credit=0.2)) as h:
        assert h.reward(rs, _tasks(rs)) == pytest.approx([1.0, 0.2, 0.0, 0.0])
    with Harness(_child("dapo_overlong_shaping", buffer=0.25, scale=0.5)) as h:
        # the last 16 tokens of 64 are the buffer: 60 tokens is 12 into it -> -12/16 * 0.5
        assert h.reward(rs, _tasks(rs)) == pytest.approx([1.0, 0.0, -0.375, -0.5])
    with Harness(_child("length_penalty", weight=0.5)) as h:
        # lam = 0.5 - (n - 10) / 54; the correct shortest gets +0.25, wrong ones min(0, lam) * 0.5
        lam = [0.5 - (n - 10) / 54 for n in (10, 20, 60, 64)]
        assert h.reward(rs, _tasks(rs)) == pytest.approx(
            [1.0 + 0.5 * lam[0]] + [0.5 * min(0.0, x) for x in lam[1:]])


def test_group_and_advantage_templates_compute_what_they_say_in_the_sandbox():
    dead = [_rollout(0, False), _rollout(0, False)]
    live = [_rollout(1, True), _rollout(1, False)]
    shaped = [_rollout(2, False), _rollout(2, False)]
    shaped[0].reward, shaped[1].reward = 0.1, 0.0   # same correctness, different shaped reward
    with Harness(_child("dapo_dynamic_sampling", signal="reward")) as h:
        assert h.keep_groups([dead, live, shaped]) == [False, True, True]
    with Harness(_child("dapo_dynamic_sampling", signal="correct")) as h:
        assert h.keep_groups([dead, live, shaped]) == [False, True, False]
    with Harness(_child("std_group_filter", min_std=0.1)) as h:
        assert h.keep_groups([dead, live, shaped]) == [False, True, False]   # std 0.05 < 0.1
    rewards = [[1.0, 0.0, 0.0, 1.0], [2.0, 2.0]]
    groups = [[_rollout(0, bool(r)) for r in rewards[0]], [_rollout(1, True), _rollout(1, True)]]
    with Harness(_child("rloo_advantages").with_knobs(scale_rewards="none")) as h:
        rloo = h.advantages(groups, rewards)
    assert rloo[0] == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3]) and rloo[1] == pytest.approx([0.0, 0.0])
    with Harness(_child("rloo_advantages")) as h:   # the reference's scale_rewards "group": divided by std
        scaled = h.advantages(groups, rewards)
    std = (4 * 0.25 / 3) ** 0.5
    a = 2 / 3 / (std + 1e-4)
    assert scaled[0] == pytest.approx([a, -a, -a, a], rel=1e-6)
    with Harness(_child("dr_grpo_advantages", value="none")) as h:
        dr = h.advantages(groups, rewards)
    assert dr[0] == pytest.approx([0.5, -0.5, -0.5, 0.5]) and dr[1] == pytest.approx([0.0, 0.0])


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory):
    """A parent cache like the demo's: most groups dead (all wrong), formats, lengths and truncation vary."""
    rows = [  # (correct, format_ok, tokens, truncated) per rollout, one group per line, two steps
        [(0, 1, 20, 0), (0, 0, 64, 1), (0, 0, 64, 1), (0, 0, 40, 0)],
        [(0, 0, 64, 1), (0, 1, 30, 0), (0, 0, 64, 1), (0, 0, 64, 1)],
        [(1, 1, 25, 0), (0, 0, 64, 1), (0, 1, 35, 0), (0, 0, 64, 1)],
        [(0, 0, 64, 1), (0, 0, 50, 0), (0, 1, 18, 0), (0, 0, 64, 1)],
    ]
    train = [_rollout(g % 2, bool(c), bool(f), n=n, truncated=bool(t), step=g // 2)
             for g, group in enumerate(rows) for c, f, n, t in group]
    for g in range(len(rows)):   # what the reference stored: GRPO advantages on binary rewards
        rs = train[4 * g: 4 * g + 4]
        m = sum(r.reward for r in rs) / 4
        for r in rs:
            r.advantage = r.reward - m
    return write_version(tmp_path_factory.mktemp("demo_parent"), train, [])


@pytest.mark.parametrize("entry_id", [e.id for e in READY if e.kind == "hook"])
def test_hook_entries_expectations_are_met_by_the_backtest_or_left_to_the_gate(entry_id, demo_cache):
    entry = ENTRIES[entry_id]
    params = entry.combinations(reference())[0]
    result = backtest(entry.apply(reference(), params), demo_cache, expect=entry.expected_effect)
    assert result.accept, result.reasons + result.errors
    expected = "met" if entry.expected_effect.metric in REPLAYED else "untestable"
    assert result.expectation_status == expected, result.reasons


def _with_select_tasks_block(parent):
    block = '''

# EVOLVE-BLOCK-START
def select_tasks(pool, stats, step, n):
    """Uniform: the first n tasks."""
    return [t["id"] for t in pool[:n]]
# EVOLVE-BLOCK-END
'''
    return parent.with_source(parent.source + block)


def _run_select(entry_id, params, pool, stats, step, n):
    """The rendered curriculum template run as the plain function it is (trusted: our own template)."""
    scope = {}
    exec(ENTRIES[entry_id].render(params), scope)
    return scope["select_tasks"](pool, stats, step, n)


def test_curriculum_templates_select_as_described():
    pool = [{"id": f"t{i}", "prompt": "q", "difficulty": d, "visible": {}} for i, d in enumerate([3, 1, 2, 1, 5, 4])]
    stats = {"t0": {"attempts": 4, "correct": 0}, "t1": {"attempts": 4, "correct": 4}, "t2": {"attempts": 4, "correct": 2},
             "t3": {"attempts": 0, "correct": 0}}
    # In band [0.2, 0.8] or untried: t2 (0.5), t3, t4, t5 (untried); t0 (0.0) and t1 (1.0) only fill up.
    picked = _run_select("pass_rate_curriculum", {"low": 0.2, "high": 0.8}, pool, stats, 0, 4)
    assert picked == ["t2", "t3", "t4", "t5"]
    assert _run_select("pass_rate_curriculum", {"low": 0.2, "high": 0.8}, pool, stats, 0, 6)[-2:] == ["t0", "t1"]
    assert set(_run_select("pass_rate_curriculum", {"low": 0.2, "high": 0.8}, pool, stats, 1, 2)) <= {"t2", "t3", "t4", "t5"}
    # Easy first: the easiest half (t1, t3, t2 by difficulty then id) during warm-up, rotating; then everything.
    early = {x for s in range(3) for x in _run_select("easy_first_curriculum", {"warmup": 4, "share": 0.5}, pool, {}, s, 2)}
    assert early == {"t1", "t3", "t2"}
    late = {x for s in range(4, 8) for x in _run_select("easy_first_curriculum", {"warmup": 4, "share": 0.5}, pool, {}, s, 3)}
    assert late == {t["id"] for t in pool}


@pytest.mark.parametrize("entry_id", [e.id for e in ENTRIES.values() if e.requires_hook and not e.episodes_only])
def test_curriculum_entries_need_a_parent_with_the_select_tasks_hook(entry_id):
    entry, parent = ENTRIES[entry_id], reference()
    assert entry.unavailable(parent) is None        # the reference harness has select_tasks in an EVOLVE block
    params = entry.combinations(parent)[0]
    iv = propose_entry("library", parent, entry, params, Evidence(health_report=REPORT))
    assert iv.factors == ["hook:select_tasks"]
    start = parent.source.index("# EVOLVE-BLOCK-START\ndef select_tasks")
    end = parent.source.index("# EVOLVE-BLOCK-END", start) + len("# EVOLVE-BLOCK-END\n")
    bare = HarnessProgram(parent.source[:start] + parent.source[end:])    # a genome without the hook
    assert "select_tasks" in entry.unavailable(bare)
    fired, skipped = get_operator("library").applicable(bare, Evidence(health_report=REPORT))
    assert entry_id not in {a.entry.id for a in fired} and "select_tasks" in skipped[entry_id]


def test_operator_proposes_fired_entries_only_and_never_the_same_child_twice():
    op = get_operator("library", seed=1)
    fired = {a.entry.id for a in op.applicable(reference(), Evidence(health_report=REPORT))[0]}
    assert {"format_partial_credit", "dapo_dynamic_sampling", "lower_temperature"} <= fired
    assert not fired & {"raise_temperature", "lower_learning_rate"}   # their triggers do not hold
    seen = set()
    for _ in range(12):
        iv = op.propose([reference()], Evidence(health_report=REPORT))
        assert iv.operator == "library" and iv.details["entry"] in fired and iv.child_hash not in seen
        seen.add(iv.child_hash)


def test_weights_steer_the_draw_and_an_exhausted_entry_is_skipped():
    weights = {e: 0.0 for e in ENTRIES}
    weights["dapo_dynamic_sampling"] = 1.0
    op = LibraryOperator(seed=0, weights=weights)
    first = op.propose([reference()], Evidence(health_report=REPORT))
    second = op.propose([reference()], Evidence(health_report=REPORT))
    assert {first.details["params"]["signal"], second.details["params"]["signal"]} == {"reward", "correct"}
    with pytest.raises(OperatorError, match="no library entry fires.*already tried") as err:
        op.propose([reference()], Evidence(health_report=REPORT))
    assert err.value.kind == "input"
    # Known genomes count as tried for a fresh operator too (the loop passes them as known_hashes).
    fresh = LibraryOperator(seed=0, weights=weights)
    with pytest.raises(OperatorError, match="already tried"):
        fresh.propose([reference()], Evidence(health_report=REPORT, known_hashes={first.child_hash, second.child_hash}))
    with pytest.raises(KeyError, match="unknown library entries"):
        LibraryOperator(weights={"no_such_entry": 1.0})


def test_entries_write_their_conditions_with_the_one_when():
    """Both entry modules build trigger conditions with ``triggers.when`` (not a copy of their own)."""
    from evotrainer.operators import library_entries, swe_entries, triggers

    assert library_entries.when is triggers.when and swe_entries.when is triggers.when
    assert triggers.when("dead_group_ratio", ">=", 0.5) == {"metric": "dead_group_ratio", "op": ">=", "value": 0.5}


def test_an_empty_report_and_a_broken_parent_are_input_errors():
    with pytest.raises(OperatorError, match="holds no health report") as err:   # not "no trigger holds"
        get_operator("library").propose([reference()], Evidence(health_report={"metrics": {}}))
    assert err.value.kind == "input"
    broken = reference().with_source("KNOBS = {'temperature': {'value': 9.0, 'range': [0.3, 1.5]}}\n")
    with pytest.raises(OperatorError, match="cannot read the parent.*outside the range") as err:
        get_operator("library").propose([broken], Evidence(health_report=REPORT))
    assert err.value.kind == "input"


def test_entries_export_as_seed_skills_that_fire_like_the_entries():
    metrics = report_metrics(REPORT)
    # What triggers read, written out from the fixture: its metrics as they are, and one alert:<name> = 1
    # for each of its three alerts. Entries and skills both read this one flattened report.
    assert metrics == {**REPORT["metrics"], "alert:insufficient_signal": 1.0, "alert:weak_reward_spread": 1.0,
                       "alert:overlong": 1.0}
    fired: dict[str, bool] = {}
    for d in seed_skills():
        skill = Skill.from_dict(d)
        entry = ENTRIES[d["intervention"]["entry"]]
        assert skill.factor == entry.factor
        fired[entry.id] = fired.get(entry.id, False) or skill.fires(metrics)
        assert skill.expected_outcome == entry.expected_effect.to_dict() and skill.intervention["template"]
        assert skill.prompt_dict()["trigger"] != "(none)"
    # An entry's skills (two for an entry that answers a second report) fire where the entry does.
    assert fired == {e.id: e.fires(metrics) for e in ENTRIES.values()}


def test_entries_render_as_compact_prompt_text():
    parent = reference()
    fired, _ = get_operator("library").applicable(parent, Evidence(health_report=REPORT))
    text = entries_text(fired, full=False)
    assert all(f"- {a.entry.id}:" in text for a in fired)
    assert "signal in {\"reward\", \"correct\"}" in text and "value in {0.5, 0.7, 0.85}" in text
    assert "source: DAPO" in entries_text(list(ENTRIES.values()))


def test_library_is_a_registered_builtin():
    assert {"library", "llm_choice"} <= set(available_operators())
    op = get_operator("library", seed=3, weights={"mask_truncated": 2.0})
    assert isinstance(op, LibraryOperator) and op.weights["mask_truncated"] == 2.0


@pytest.mark.parametrize("domain", ["math", "code", "swe"])
def test_every_domains_reference_harness_lets_curriculum_and_prompt_entries_apply(domain):
    """The curriculum and prompt entries need ``select_tasks``/``prompt`` in EVOLVE blocks; a built-in
    reference without them would leave those entries out of that domain's search space. The blocks
    are the engine's own defaults, so the seed still runs without a sandbox round trip for them."""
    from evotrainer.loop.seed import DOMAIN_HARNESSES

    seed = HarnessProgram.from_file(DOMAIN_HARNESSES[domain]) if domain in DOMAIN_HARNESSES else reference()
    assert ENTRIES["pass_rate_curriculum"].unavailable(seed) is None
    harness = Harness(seed)
    assert harness.uses_reference("select_tasks") and harness.uses_reference("prompt")


@pytest.mark.parametrize("changed, fires, quiet", [
    (0.0, "unstick_learning_rate", "raise_learning_rate"),    # live groups, yet no held-out answer moved
    (0.3, "raise_learning_rate", "unstick_learning_rate"),    # answers moved, the score did not
])
def test_a_policy_that_did_not_move_gets_an_order_of_magnitude_learning_rate(changed, fires, quiet):
    """TRL's default learning rate (1e-6, sized for full fine-tuning) leaves a LoRA adapter where it
    started: no greedy held-out answer changes though the groups had a gradient. Doubling it would not
    help; the unstick entry moves it by 100-1000x (clipped to the knob's range), and only on that report."""
    report = {"metrics": {"heldout_delta": 0.0, "dead_group_ratio": 0.5, "heldout_changed_rate": changed}}
    op = get_operator("library", seed=0)
    fired = {a.entry.id for a in op.applicable(reference(), Evidence(health_report=report))[0]}
    assert fires in fired and quiet not in fired
    parent = reference().with_knobs(learning_rate=1e-6)   # what `grpo.learning_rate: 1e-6` seeds
    for params in ENTRIES["unstick_learning_rate"].combinations(parent):
        iv = propose_entry("library", parent, ENTRIES["unstick_learning_rate"], params, Evidence(health_report=report))
        new = iv.child().knobs["learning_rate"]["value"]
        assert 1e-4 * 0.99 <= new <= 1e-3 and iv.factors == ["knob:learning_rate"]


def test_easy_first_starts_an_swe_curriculum_on_level_zero_issues():
    """On an SWE train split of levels 0 and 1 (domain.difficulty [0, 1]), the easy-first curriculum
    trains its warm-up steps on the issues that name the wrong line, then on both levels."""
    from evotrainer.domains.swe.generator import make_split

    pool = [{"id": t.id, "prompt": t.prompt, "difficulty": t.difficulty, "visible": {}}
            for t in make_split("train", 8, [0, 1], seed=0)]
    level = {t["id"]: t["difficulty"] for t in pool}
    params = {"warmup": 4, "share": 0.5}
    early = [level[x] for s in range(4) for x in _run_select("easy_first_curriculum", params, pool, {}, s, 2)]
    late = {level[x] for s in range(4, 8) for x in _run_select("easy_first_curriculum", params, pool, {}, s, 2)}
    assert set(early) == {0} and late == {0, 1}
