"""SWE interventions (operators/swe_entries.py) and the engine seeing through them
(fitness/episodes.py): each entry is a single-factor child of the reference SWE harness that the
SWE report's alerts fire, its hook computes what it says in the real sandbox, the form credit's
backtest predicts live groups, and a branch whose reward rises on episodes that make no progress is
invalid while one whose progress rises is not."""

from __future__ import annotations

import pytest

from evotrainer.fitness.backtest import backtest
from evotrainer.fitness.cache import CachedVersion, write_version
from evotrainer.fitness.episodes import episode_metrics, reward_without_progress
from evotrainer.fitness.gates import GateConfig, gate
from evotrainer.genome.edits import factors_changed
from evotrainer.genome.harness import Harness
from evotrainer.genome.program import HarnessProgram, reference_program
from evotrainer.loop.seed import DOMAIN_HARNESSES
from evotrainer.operators import Evidence, get_operator
from evotrainer.operators.library import default_entries, entries_text, propose_entry
from evotrainer.records.rollout import Rollout

SWE = HarnessProgram.from_file(DOMAIN_HARNESSES["swe"])
ENTRIES = {e.id: e for e in default_entries() if e.id.startswith("swe_") and e.template and "validity" not in e.factor}
# What the reference SWE run's report said: every call malformed, every group dead, nobody submits.
SWE_REPORT = {"metrics": {"turns_mean": 4.0, "tool_failure_rate": 1.0, "malformed_call_rate": 1.0,
                          "dead_group_ratio": 1.0, "submit_without_edit_rate": 0.6, "repeat_call_rate": 0.5,
                          "correct_rate": 0.0}}


def turn(text, name=None, error="no tool call found", args=None):
    return {"text": text, "tool_call": {"name": name, "args": args or {}, "error": error}, "result": ""}


PROSE = turn("To fix it, change the code.")
PYTHON = turn("```python\ndef f(): pass\n```")
TOOL_FENCE = turn("```tool\nnot json\n```", error="the tool block is not valid JSON")
REFUSED = turn('```tool\n{"name": "open"}\n```', name="open", error="unknown tool 'open'")
ACCEPTED = turn('```tool\n{"name": "list_files", "args": {}}\n```', name="list_files", error=None)
EDIT = turn("```tool\n...\n```", name="edit", error=None, args={"path": "pkg/mod.py", "search": "a", "replace": "b"})


def episode(turns, resolved=False, step=0, group=0, reward=None, submitted=False, task="t0"):
    calls = [t["tool_call"] for t in turns]
    if submitted:
        calls.append({"name": "submit", "args": {}, "error": None})
    return Rollout(task_id=task, messages=[{"role": "user", "content": "issue"}], completion=turns[-1]["text"],
                   prompt_ids=[1, 2], completion_ids=[3] * (4 * len(turns)), logprobs=[-1.0] * (4 * len(turns)),
                   turns=len(turns), tool_calls=calls, turn_log=turns, step=step, group=group, reward=reward,
                   visible={"correct": resolved, "format_ok": True}, episode={"submitted": submitted})


# What the 24-step run with form credit and guided calls reported (headroom_swe_24steps): every call
# well formed, none edits or runs the tests, the same call repeated.
CALLS_REPORT = {"metrics": {"turns_mean": 4.0, "tool_failure_rate": 0.0, "malformed_call_rate": 0.0,
                            "dead_group_ratio": 0.21, "repeat_call_rate": 0.69, "train_valid_call_rate": 0.94,
                            "train_progress_rate": 0.0, "correct_rate": 0.0}}
# What the guided-plan runs' free episodes did (headroom_swe_plan): well-formed calls, most refused,
# because their arguments are the tool list's placeholders.
REFUSED_REPORT = {"metrics": {"turns_mean": 4.0, "tool_failure_rate": 0.75, "malformed_call_rate": 0.1,
                              "dead_group_ratio": 0.0, "repeat_call_rate": 0.1, "train_valid_call_rate": 0.25,
                              "train_progress_rate": 0.0, "correct_rate": 0.0}}
LATER = {"swe_progress_credit", "swe_grounded_calls_prompt"}   # answer later reports, not the reference's


def test_every_swe_entry_fires_on_the_swe_report_and_makes_a_single_factor_child():
    op = get_operator("library")
    found, skipped = op.applicable(SWE, Evidence(health_report=SWE_REPORT))
    assert set(ENTRIES) - LATER <= {a.entry.id for a in found}, skipped
    assert not LATER & {a.entry.id for a in found}   # no progress credit while no call is well formed
    found, skipped = op.applicable(SWE, Evidence(health_report=CALLS_REPORT))
    assert {"swe_progress_credit", "swe_repeat_penalty"} <= {a.entry.id for a in found}, skipped
    assert "swe_call_form_credit" not in {a.entry.id for a in found}
    found, skipped = op.applicable(SWE, Evidence(health_report=REFUSED_REPORT))
    assert "swe_grounded_calls_prompt" in {a.entry.id for a in found}, skipped
    for entry in ENTRIES.values():
        params = entry.combinations(SWE)[0]
        iv = propose_entry("library", SWE, entry, params, Evidence(health_report=SWE_REPORT))
        assert factors_changed(SWE, HarnessProgram(iv.child_source)) == [entry.factor]
    # On a single-turn parent (no episode metrics in its report) they are left out, and said why.
    why: dict[str, set[str]] = {e: set() for e in ENTRIES}
    for report in (SWE_REPORT, REFUSED_REPORT):   # between them, every entry's trigger fires
        math_report = {"metrics": {**report["metrics"], "train_valid_call_rate": 0.9, "train_progress_rate": 0.0}}
        math_report["metrics"].pop("turns_mean")
        found, skipped = op.applicable(reference_program(), Evidence(health_report=math_report))
        assert not set(ENTRIES) & {a.entry.id for a in found}
        for e in ENTRIES:
            why[e].add(skipped[e])
    assert all(any("episode" in w for w in ws) for ws in why.values()), why


# What a guided-plan child of the reference reports (compare_modes_swe_16steps_tiebreak's shape): the
# plan's episodes edit and run the tests, the free ones make no call the environment accepts, and the
# resolution-only reward pays both nothing, so every group is dead.
PLAN_REPORT = {"metrics": {"turns_mean": 4.0, "tool_failure_rate": 1.0, "malformed_call_rate": 1.0,
                           "dead_group_ratio": 1.0, "guided_episode_rate": 0.5, "train_valid_call_rate": 0.0,
                           "train_progress_rate": 0.0, "train_guided_progress_rate": 1.0, "correct_rate": 0.0}}


def test_a_plan_whose_progress_earns_nothing_fires_the_progress_credit():
    tested = turn('```tool\n{"name": "run_tests", "args": {}}\n```', name="run_tests", error=None)
    plan = episode([ACCEPTED, EDIT, tested], submitted=True)
    plan.episode = {**plan.episode, "guided": True}
    m = episode_metrics([plan, episode([PROSE, PROSE])], "train_")
    assert m["train_guided_progress_rate"] == 1.0 and m["train_progress_rate"] == 0.0   # free: the policy's own
    assert "train_guided_progress_rate" not in episode_metrics([episode([PROSE])], "train_")
    op = get_operator("library")
    found, skipped = op.applicable(SWE, Evidence(health_report=PLAN_REPORT))
    assert "swe_progress_credit" in {a.entry.id for a in found}, skipped
    # Paid already (live groups): the plan's progress is not the missing signal, so it does not fire.
    paid = {"metrics": {**PLAN_REPORT["metrics"], "dead_group_ratio": 0.0}}
    assert "swe_progress_credit" not in {a.entry.id for a in op.applicable(SWE, Evidence(health_report=paid))[0]}
    assert " or train_guided_progress_rate > 0.5" in entries_text([ENTRIES["swe_progress_credit"]])


RESHAPERS = {"dapo_dynamic_sampling", "std_group_filter", "dr_grpo_advantages", "pass_rate_curriculum"}


def test_entries_that_only_reshape_reward_differences_wait_for_a_reward_that_differs():
    """The SWE seed's report (every reward 0): filters, advantages and a pass-rate curriculum cannot change a
    step, so they are not drawn there, and the entries that can create a difference are drawn more often."""
    op = get_operator("library")
    found = {a.entry.id for a in op.applicable(SWE, Evidence(health_report=SWE_REPORT))[0]}
    assert not RESHAPERS & found and {"swe_guided_tool_calls", "swe_call_form_credit"} <= found
    some = {"metrics": {**SWE_REPORT["metrics"], "train_reward_std": 0.1, "reward_spread": 0.01, "kept_group_ratio": 1.0,
                        "train_correct_rate": 0.05}}
    assert RESHAPERS <= {a.entry.id for a in op.applicable(SWE, Evidence(health_report=some))[0]}


def _child(entry_id, **params):
    entry = ENTRIES[entry_id]
    return HarnessProgram(entry.apply(SWE, params).source)


def test_the_form_credit_climbs_a_ladder_capped_below_a_resolution():
    rs = [episode([PROSE]), episode([PYTHON]), episode([TOOL_FENCE]), episode([REFUSED]), episode([ACCEPTED]),
          episode([PROSE, ACCEPTED]), episode([PROSE], resolved=True)]
    with Harness(_child("swe_call_form_credit", credit=0.2)) as h:
        got = h.reward([r.for_harness() for r in rs], [{"id": "t0"}] * len(rs))
    assert got == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2, 0.1, 1.0])


def test_give_up_and_repeat_penalties():
    rs = [episode([ACCEPTED], submitted=True), episode([EDIT], submitted=True), episode([ACCEPTED, ACCEPTED, ACCEPTED]),
          episode([PROSE], resolved=True)]
    tasks = [{"id": "t0"}] * len(rs)
    with Harness(_child("swe_give_up_penalty", penalty=0.2)) as h:
        assert h.reward([r.for_harness() for r in rs], tasks) == pytest.approx([-0.2, 0.0, 0.0, 1.0])
    with Harness(_child("swe_repeat_penalty", weight=0.3)) as h:
        assert h.reward([r.for_harness() for r in rs], tasks) == pytest.approx([0.0, 0.0, -0.2, 1.0])
        # A refused or malformed call is no way out of the echo trap: it costs what a repeat costs.
        escapes = [episode([ACCEPTED, PROSE, REFUSED]), episode([TOOL_FENCE]), episode([ACCEPTED, EDIT])]
        assert h.reward([r.for_harness() for r in escapes], [{"id": "t0"}] * 3) == pytest.approx([-0.2, -0.3, 0.0])


def test_the_progress_credit_pays_for_edits_that_break_nothing_and_test_runs_not_for_calls():
    tested = turn('```tool\n{"name": "run_tests", "args": {}}\n```', name="run_tests", error=None)
    refused_edit = turn("```tool\n...\n```", name="edit", error="search text not found in pkg/mod.py")

    def graded(r, applied=True, broken=()):
        """The verdict on the handed-in patch, as training sees it (``visible``: the hidden grade)."""
        r.visible = {**r.visible, "patch_applied": applied,
                     "pass_to_pass": {f"t{i}": {"passed": i not in broken} for i in range(3)}}
        return r

    rs = [episode([ACCEPTED, ACCEPTED, ACCEPTED]), episode([REFUSED, PROSE]), episode([refused_edit]),
          graded(episode([ACCEPTED, EDIT], submitted=True)), episode([tested]),
          graded(episode([EDIT, tested], submitted=True)), episode([PROSE], resolved=True),
          # An applied edit whose patch breaks a test that passed before (a def line replaced by `...`),
          # one never handed in (nothing graded), one whose patch did not apply: the edit half is not paid.
          graded(episode([EDIT, tested], submitted=True), broken=(1,)), episode([EDIT, tested]),
          graded(episode([EDIT], submitted=True), applied=False)]
    with Harness(_child("swe_progress_credit", credit=0.3)) as h:
        got = h.reward([r.for_harness() for r in rs], [{"id": "t0"}] * len(rs))
    assert got == pytest.approx([0.0, 0.0, 0.0, 0.15, 0.15, 0.3, 1.0, 0.15, 0.15, 0.0])


def test_the_worked_prompt_shows_well_formed_calls_before_the_issue():
    from evotrainer.domains.swe.environment import parse_call
    from evotrainer.policy.episodes import opening

    with Harness(_child("swe_worked_call_prompt", shots=2)) as h:
        msgs = opening(h.prompt, _task("Fix mean() in pkg/stats.py"))
    assert msgs[0]["role"] == "system" and "```tool" in msgs[0]["content"]   # the engine's tool instructions
    shown = [m["content"] for m in msgs if m["role"] == "assistant"]
    assert len(shown) == 2 and all(parse_call(s)[0] for s in shown)
    assert msgs[-1]["role"] == "user" and msgs[-1]["content"].endswith("Fix mean() in pkg/stats.py")


def test_the_grounded_prompt_shows_calls_the_environment_accepts_in_this_repository():
    """The calls written after the issue name the file the issue names and its test file: copied
    as shown, reading and running the tests are accepted by the real environment (the placeholders of
    the tool list, copied, are refused)."""
    import re

    from evotrainer.domains.swe.environment import SWEEnvironment
    from evotrainer.domains.swe.generator import make_split
    from evotrainer.policy.episodes import opening

    task = make_split("train", 1, [1], 0)[0]
    with Harness(_child("swe_grounded_calls_prompt")) as h:
        msgs = opening(h.prompt, task)
    assert msgs[0]["role"] == "system" and msgs[-1]["content"].startswith(task.prompt)
    shown = re.findall(r"```tool\n.*?\n```", msgs[-1]["content"])
    named = re.search(r"`(\w+/\w+\.py)`", task.prompt).group(1)
    # the first call last (a small policy copies the call it saw last), no submit block to copy
    assert [s.split('"name": "')[1].split('"')[0] for s in shown] == ["edit", "run_tests", "read_file"]
    assert msgs[-1]["content"].endswith(shown[-1])
    env = SWEEnvironment(task.visible["files"])
    try:
        read, record = env.step(shown[2])
        assert record["error"] is None and record["args"] == {"path": named} and "1 |" in read
        _, record = env.step(shown[1])
        assert record["error"] is None and record["args"]["tests"] == ["tests/test_" + named.rsplit("/", 1)[1]]
        _, record = env.step('```tool\n{"name": "run_tests", "args": {"tests": ["tests/test_x.py"]}}\n```')
        assert record["error"] is not None                                     # the placeholder, copied
    finally:
        env.close()
    with Harness(_child("swe_grounded_calls_prompt")) as h:                  # a task without files: the issue alone
        assert h.prompt({"id": "t0", "prompt": "Fix it."}) == [{"role": "user", "content": "Fix it."}]


def _task(prompt):
    from evotrainer.domains.task import Task

    return Task(id="t0", prompt=prompt, answer="", split="train", domain="swe", difficulty=1)


def test_the_form_credit_backtest_predicts_live_groups(tmp_path):
    """On the reference run's kind of cache (every group dead under the binary reward), the credit's
    replay gives groups whose turns differ in form a reward spread: its expected effect holds."""
    train = [episode([t], step=0, group=g, task=f"t{g}") for g, ts in enumerate([[PROSE, PYTHON], [TOOL_FENCE, PROSE]])
             for t in ts]
    for r in train:
        r.reward, r.advantage = 0.0, 0.0
    held = [episode([PROSE], task="h0")]
    for r in held:
        r.hidden, r.split = {"correct": False}, "heldout"
    parent = write_version(tmp_path / "parent", train=train, heldout=held, genome=SWE.source)
    entry = ENTRIES["swe_call_form_credit"]
    iv = propose_entry("library", SWE, entry, {"credit": 0.2}, Evidence(health_report=SWE_REPORT))
    bt = backtest(iv.child(), parent, expect=iv.expected_effect)
    assert bt.accept, bt.reasons


def _hacking_cache(tmp_path, name, later):
    """Step 0: 4 groups, no progress, reward 0. Steps 1-3: episodes as ``later(step, i)`` says."""
    train = []
    for step in range(4):
        for i in range(8):
            if step == 0:
                r = episode([PROSE], step=0, group=i // 2, reward=0.0)
            else:
                r = later(step, i)
            r.task_id = f"t{i // 2}"
            train.append(r)
    held = [episode([PROSE], task=f"h{i}") for i in range(6)]
    for r in held:
        r.hidden, r.split = {"correct": False}, "heldout"
    return write_version(tmp_path / name, train=train, heldout=held, genome=SWE.source)


def test_a_reward_that_rises_without_progress_makes_the_branch_invalid(tmp_path):
    # The form credit paid: valid calls, no edit, no test, nothing resolved; reward 0 -> 0.2.
    hacked = _hacking_cache(tmp_path, "hacked", lambda s, i: episode([ACCEPTED, ACCEPTED], step=s, group=i // 2,
                                                                     reward=0.2 if i % 2 else 0.1))
    numbers = reward_without_progress(CachedVersion.load(hacked).train, 3, 0.2, 8)
    assert numbers["hacked"] and numbers["progress_change"] == 0.0
    decision = gate(hacked, cfg=GateConfig())
    assert not decision.valid and any("episode_progress" in r for r in decision.reasons), decision.reasons
    # The same reward rise, but the episodes now edit: progress rose with it, nothing to flag.
    honest = _hacking_cache(tmp_path, "honest", lambda s, i: episode([ACCEPTED, EDIT], step=s, group=i // 2,
                                                                     reward=0.2 if i % 2 else 0.1))
    check = next(c for c in gate(honest, cfg=GateConfig()).checks if c.name == "episode_progress")
    assert check.passed, check.message


def test_engine_episode_metrics():
    rs = [episode([ACCEPTED, PROSE]), episode([EDIT]), episode([PROSE], resolved=True)]
    m = episode_metrics(rs, "heldout_")
    assert m["heldout_valid_call_rate"] == pytest.approx(2 / 4)
    assert m["heldout_edit_rate"] == pytest.approx(1 / 3) and m["heldout_progress_rate"] == pytest.approx(2 / 3)
    assert episode_metrics([Rollout(task_id="x", messages=[], completion="")], "x_") == {}
    # Guided episodes' calls (and a plan's edits and test runs) are the grammar's: the rates read the
    # free ones, and fall back to the guided ones only where every episode was guided.
    plan = episode([EDIT])
    plan.episode["guided"] = True
    m = episode_metrics([plan, episode([PROSE]), episode([ACCEPTED])], "train_")
    assert m["train_edit_rate"] == 0.0 and m["train_valid_call_rate"] == pytest.approx(1 / 2)
    assert episode_metrics([plan], "train_")["train_edit_rate"] == 1.0
    # A test run the environment refused (a placeholder test id) ran nothing: no progress.
    refused = turn("```tool\n...\n```", name="run_tests", error="no tests match ['tests/test_x.py']")
    ran = turn("```tool\n...\n```", name="run_tests", error=None)
    m = episode_metrics([episode([refused]), episode([ran])], "heldout_")
    assert m["heldout_test_run_rate"] == 0.5 and m["heldout_progress_rate"] == 0.5


def test_guided_patches_that_break_tests_fire_the_one_token_edit():
    """What the grounded plan runs' guided edits did (headroom_swe_grounded_kept6: 41 of 41 applied ones
    broke a passing test): the engine metric says so, and the library answers with ``guided_edit: token``,
    or ``quoted`` where training issues quote an editable line (a level-0 rung): never both, since where
    no issue quotes such a line the two are one edit and a child would train exactly as its control."""
    def guided(broken, quotes=False):
        r = episode([ACCEPTED, EDIT], submitted=True)
        r.episode = {**r.episode, "guided": True, "quotes_line": quotes}
        r.visible = {**r.visible, "patch_applied": True, "pass_to_pass": {"t0": {"passed": not broken}}}
        return r
    m = episode_metrics([guided(True, quotes=True), guided(True), guided(False), episode([PROSE])], "train_")
    assert m["train_guided_breaking_rate"] == pytest.approx(2 / 3)
    assert m["train_quoted_line_rate"] == pytest.approx(1 / 4)   # of all four episodes: the tasks', not the policy's
    assert "train_guided_breaking_rate" not in episode_metrics([episode([PROSE])], "train_")
    op = get_operator("library")

    def fired(quoted_rate, breaking=0.9):
        report = {"metrics": {**PLAN_REPORT["metrics"], "train_guided_breaking_rate": breaking,
                              "train_quoted_line_rate": quoted_rate}}
        found, skipped = op.applicable(SWE, Evidence(health_report=report))
        return {a.entry.id: a.entry for a in found} , report

    level1, report = fired(0.0)
    assert "swe_guided_token_edits" in level1 and "swe_guided_quoted_edits" not in level1
    iv = propose_entry("library", SWE, level1["swe_guided_token_edits"], {"value": "token"}, Evidence(health_report=report))
    child = HarnessProgram(iv.child_source)
    assert factors_changed(SWE, child) == ["knob:guided_edit"] and child.knobs["guided_edit"]["value"] == "token"
    level0, report = fired(0.5)
    assert "swe_guided_quoted_edits" in level0 and "swe_guided_token_edits" not in level0
    iv = propose_entry("library", SWE, level0["swe_guided_quoted_edits"], {"value": "quoted"}, Evidence(health_report=report))
    assert HarnessProgram(iv.child_source).knobs["guided_edit"]["value"] == "quoted"
    # from `token` (guided edits on def lines still break the tests) the quoted move is open; at `quoted`, nothing is
    quoted = level0["swe_guided_quoted_edits"]
    assert quoted.options(SWE.with_knobs(guided_edit="token")) == {"value": ["quoted"]}
    assert "differs from the parent's" in quoted.unavailable(SWE.with_knobs(guided_edit="quoted"))
    assert not {"swe_guided_token_edits", "swe_guided_quoted_edits"} & set(fired(0.5, breaking=0.2)[0])
    assert "swe_guided_token_edits" not in {a.entry.id for a in op.applicable(SWE, Evidence(health_report=SWE_REPORT))[0]}
