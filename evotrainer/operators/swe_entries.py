"""Library entries for the failure modes an SWE health report diagnoses (multi-turn tool episodes).

What the reference SWE recipe cannot escape at 135M parameters: no well-formed tool call (the policy
writes prose or a ```python block, never the ```tool block the environment reads), so resolution is 0,
every group is dead and no gradient step is taken. The entries answer the report's alerts:

- ``tool_failures`` / ``insufficient_signal``: a graded credit for the call's form, a ladder the policy
  can climb before it can resolve anything (a fenced block, the ``tool`` fence, a JSON object with a
  name, a call the environment accepted), capped far below a resolution;
- the same: a prompt with a worked exchange, showing the format rather than describing it;
- well-formed calls the environment refuses (the tool list's placeholder paths copied): the calls a fix
  takes written after the issue with the repository's own paths;
- ``giving_up``: a penalty for an episode that hands in a patch without editing anything;
- ``echo_trap``: a penalty for turns that repeat a call already made in the episode, or make one
  the environment refuses (else a malformed call is the way out of the penalty);
- ``calls_without_progress`` (well-formed calls that edit nothing and run no test), or a guided
  plan's progress that the reward does not pay (dead groups): a credit for progress itself, an
  applied edit that breaks no passing test and a test run, in place of a credit for the calls' form;
- ``tool_failures`` (malformed calls): part of each group decoded under the environment's tool-call
  grammar (``guided_call_share``), so well-formed calls reach the tools and the free rest learns from them;
- the same, once some episodes are guided: behaviour cloning on their accepted calls (``guided_imitation``),
  which trains the form even while every group is dead;
- no progress (no episode edits or runs the tests, whatever its calls' form): part of each group guided
  through the plan a fix takes (``guided_plan_share``: read, edit, run the tests, submit), so some
  episodes make the progress a progress credit pays for;
- guided edits that break the tests (the policy's replacement line is ``...`` or prose): a guided edit
  that changes one token of the line it names (``guided_edit: token``), so its patch keeps the module;
  where training issues quote an editable line (a level-0 rung), one that may change only that line
  (``guided_edit: quoted``), the bug's.

A form credit invites its own hack (valid calls that make no progress): the engine's episode check
(``fitness/validity.py``, ``episode_progress``) marks a branch invalid when its shaped reward rises on
episodes that edit nothing, run no test and resolve nothing, while those do not rise.

Templates read the plain dicts a harness sees: ``tool_calls`` (``name``, ``args``, ``error``: the
environment's own message), ``turn_log`` (each turn's ``text``), ``visible.correct`` (resolved),
``episode.submitted``. They import nothing and use no helper of the reference harness.
"""

from __future__ import annotations

from evotrainer.operators.intervention import ExpectedEffect
from evotrainer.operators.library_entry import KnobMove, LibraryEntry, Param
from evotrainer.operators.triggers import when

FEWER_DEAD = ExpectedEffect("dead_group_ratio", "delta<", 0.0)
FEWER_MALFORMED = ExpectedEffect("malformed_call_rate", "<", 0.5)
# the two guided-edit entries answer one report (most guided patches break a passing test) and expect one effect
GUIDED_BREAKING = when("train_guided_breaking_rate", ">", 0.5)
FEWER_BREAKING = ExpectedEffect("train_guided_breaking_rate", "delta<", 0.0)


CALL_FORM_CREDIT = '''def reward(rollouts, tasks):
    """1 when the patch resolves the issue. Otherwise a credit for the form of the episode's calls, at
    most $credit (far below a resolution): each turn scores its best rung of a ladder (0 prose, 1 a
    fenced block, 2 the ```tool fence, 3 a JSON object naming a tool, 4 a call the environment
    accepted) and the episode earns $credit times its turns' mean rung over 4."""
    out = []
    for r in rollouts:
        if (r.get("visible") or {}).get("correct"):
            out.append(1.0)
            continue
        turns = [t for t in (r.get("turn_log") or []) if isinstance(t, dict)]
        rungs = []
        for t in turns:
            text = str(t.get("text") or "")
            call = t.get("tool_call") if isinstance(t.get("tool_call"), dict) else {}
            error = call.get("error")
            if call.get("name") and error is None:
                rung = 4
            elif call.get("name"):
                rung = 3                      # a named call the environment refused (unknown tool, bad args)
            elif "```tool" in text:
                rung = 2
            elif "```" in text:
                rung = 1
            else:
                rung = 0
            rungs.append(rung)
        out.append($credit * (sum(rungs) / (4.0 * len(rungs))) if rungs else 0.0)
    return out'''

WORKED_CALL_PROMPT = '''def prompt(task):
    """The issue after a worked exchange: three turns that are each exactly one well-formed tool call,
    with their results, so the ```tool format is shown, not only described (the engine puts the tool
    instructions first as the system message)."""
    calls = [('{"name": "list_files", "args": {}}', "pkg/__init__.py\\npkg/mod.py\\ntests/test_mod.py"),
             ('{"name": "read_file", "args": {"path": "pkg/mod.py"}}', "   1 | def add(a, b):\\n   2 |     return a - b"),
             ('{"name": "edit", "args": {"path": "pkg/mod.py", "search": "a - b", "replace": "a + b"}}',
              "edited pkg/mod.py")]
    msgs = [{"role": "user", "content": "Example issue: add() in pkg/mod.py subtracts. Use the tools."}]
    for call, result in calls[:$shots]:
        msgs.append({"role": "assistant", "content": "```tool\\n" + call + "\\n```"})
        msgs.append({"role": "user", "content": result})
    msgs.append({"role": "user", "content": "Now the real issue. Answer with one ```tool block.\\n\\n" + task["prompt"]})
    return msgs'''

GROUNDED_CALLS_PROMPT = '''def prompt(task):
    """The issue, then the calls that start its fix written with this repository's own paths (the file
    the issue names and that module's test file), so a policy that copies an example copies a call the
    environment accepts rather than a placeholder it refuses. The engine still puts the tool
    instructions first as the system message."""
    files = sorted((task.get("visible") or {}).get("files") or {})

    def is_test(path):
        return path.startswith("tests/") or path.rsplit("/", 1)[-1].startswith("test_")

    source = [f for f in files if f.endswith(".py") and not is_test(f) and not f.endswith("__init__.py")]
    named = [f for f in source if f in task["prompt"]] or source
    text = task["prompt"]
    if named:
        path = named[0]
        tests = [f for f in files if is_test(f) and f.rsplit("/", 1)[-1] == "test_" + path.rsplit("/", 1)[-1]]
        # The first call comes last: a small policy copies the call it was shown last (written in the
        # order of the fix, ending on submit, the 135M policy submitted at once on 12 of 16 issues).
        later = ['to change the wrong line (search: that line exactly as read_file shows it, without its '
                 'number; replace: the line fixed): ```tool\\n{"name": "edit", "args": {"path": "' + path
                 + '", "search": "...", "replace": "..."}}\\n```']
        if tests:
            later.append('to run its tests: ```tool\\n{"name": "run_tests", "args": {"tests": ["' + tests[0]
                         + '"]}}\\n```')
        text += ("\\n\\nIn this repository, one call per turn. Later, " + "; later, ".join(later)
                 + "; when they pass, submit.\\nFirst, read the file:\\n```tool\\n"
                 + '{"name": "read_file", "args": {"path": "' + path + '"}}\\n```')
    return [{"role": "user", "content": text}]'''

GIVE_UP_PENALTY = '''def reward(rollouts, tasks):
    """1 when resolved; -$penalty for an episode that submitted without a single successful edit
    (handing in nothing is then worse than trying); 0 otherwise."""
    out = []
    for r in rollouts:
        if (r.get("visible") or {}).get("correct"):
            out.append(1.0)
            continue
        calls = [c for c in (r.get("tool_calls") or []) if isinstance(c, dict)]
        edited = any(c.get("name") == "edit" and c.get("error") is None for c in calls)
        submitted = bool((r.get("episode") or {}).get("submitted")) or any(c.get("name") == "submit" for c in calls)
        out.append(-$penalty if submitted and not edited else 0.0)
    return out'''

REPEAT_PENALTY = '''def reward(rollouts, tasks):
    """1 when resolved; otherwise minus $weight times the share of the episode's turns that learned
    nothing new: a call that repeats an earlier accepted call exactly (same tool, same arguments), or a
    call the environment refused. A refused call counts too: left out, it was the echo trap's cheapest
    way out (a 135M policy under this penalty stopped making valid calls at all)."""
    out = []
    for r in rollouts:
        if (r.get("visible") or {}).get("correct"):
            out.append(1.0)
            continue
        calls = [c for c in (r.get("tool_calls") or []) if isinstance(c, dict)]
        seen, wasted = set(), 0
        for c in calls:
            if not c.get("name") or c.get("error") is not None:
                wasted += 1
                continue
            key = (c.get("name"), repr(sorted((c.get("args") or {}).items())))
            wasted += 1 if key in seen else 0
            seen.add(key)
        out.append(-$weight * wasted / len(calls) if calls else 0.0)
    return out'''

PROGRESS_CREDIT = '''def reward(rollouts, tasks):
    """1 when the patch resolves the issue. Otherwise a credit for progress, at most $credit (far below a
    resolution): half of it for an edit the environment applied, paid only when the handed-in patch
    applies and breaks no test that passed before it; half for running the tests. A call that changes
    nothing (reading, listing, repeating) earns nothing, so the credit cannot be farmed with well-formed
    calls alone; and an edit that breaks the repository earns nothing, so it cannot be farmed with
    vandalism (paid for any applied edit, a 135M policy learned to replace a function's def line with
    `...`)."""
    out = []
    for r in rollouts:
        grade = r.get("visible") or {}
        if grade.get("correct"):
            out.append(1.0)
            continue
        calls = [c for c in (r.get("tool_calls") or []) if isinstance(c, dict) and c.get("error") is None]
        edited = any(c.get("name") == "edit" for c in calls)
        kept = bool(grade.get("patch_applied")) and not any(
            isinstance(t, dict) and not t.get("passed") for t in (grade.get("pass_to_pass") or {}).values())
        tested = any(c.get("name") == "run_tests" for c in calls)
        out.append($credit * (0.5 * (edited and kept) + 0.5 * tested))
    return out'''

SWE_ENTRIES: tuple[LibraryEntry, ...] = (
    LibraryEntry(
        "swe_guided_tool_calls", "knob (episodes): decode part of each group under the tool-call grammar",
        "knob:guided_call_share", (when("malformed_call_rate", ">", 0.5),),
        "If guided_call_share goes from {old} to {new} (that share of each group's training episodes decoded under "
        "the environment's tool-call grammar), the free episodes' malformed calls fall and edits and test runs rise, "
        "because guided calls reach the tools and earn what free ones cannot, and the policy gradient moves the "
        "policy towards the calls it was steered to.",
        FEWER_MALFORMED, "grammar-constrained decoding (llguidance; Geng et al., 2023) as guided exploration",
        move=KnobMove("guided_call_share"), episodes_only=True),
    LibraryEntry(
        "swe_imitate_guided_calls", "knob (episodes): behaviour cloning on the guided episodes' accepted calls",
        "knob:guided_imitation", (when("malformed_call_rate", ">", 0.5), when("guided_episode_rate", ">", 0.0)),
        "If guided_imitation goes from {old} to {new} (that weight on the mean negative log-likelihood of the guided "
        "episodes' accepted calls, added to the policy loss whatever their reward), the free episodes' malformed calls "
        "fall, because the policy is trained on well-formed calls at every step, where the policy gradient gives them "
        "nothing while their groups are dead and little while the free members' long turns share the step.",
        FEWER_MALFORMED, "rejection-sampling fine-tuning on accepted samples (RFT, Yuan et al., 2023; expert "
        "iteration, Anthony et al., 2017), here on grammar-guided calls",
        move=KnobMove("guided_imitation"), episodes_only=True),
    LibraryEntry(
        "swe_guided_tool_plan", "knob (episodes): guide part of each group through read, edit, run tests, submit",
        "knob:guided_plan_share", (when("train_progress_rate", "<", 0.05),),
        "If guided_plan_share goes from {old} to {new} (that share of each group's training episodes decoded under "
        "the call grammar with the tool fixed turn by turn: read_file, edit of a line the file holds once, run_tests, "
        "submit), the free episodes' edits and test runs rise, because the guided ones make the progress the free "
        "ones never try, earn what progress earns, and the policy gradient moves the policy towards their choices.",
        ExpectedEffect("train_progress_rate", "delta>", 0.0),
        "guided exploration over tools: grammar-constrained decoding (Geng et al., 2023) of a scripted workflow",
        move=KnobMove("guided_plan_share"), episodes_only=True),
    LibraryEntry(
        "swe_guided_token_edits", "knob (episodes): a guided edit changes one token of the line it names",
        # the training issues quote no editable line: where they do, `quoted` (below) is the same edit, aimed
        "knob:guided_edit", (GUIDED_BREAKING, when("train_quoted_line_rate", "<=", 0.0)),
        "If guided_edit goes from {old} to {new} (a guided edit writes the line it names with one operator, "
        "comparison or integer changed, in place of any line), fewer guided patches break passing tests and some "
        "resolve, because the policy's own replacement lines (`...`, prose) break the module, while a one-token "
        "change keeps it importable, so whether an edit helps depends on the line and token chosen; the policy "
        "gradient then reinforces edits that keep the tests, not vandalism.",
        FEWER_BREAKING,
        "grammar-constrained decoding over a local edit space (one-token program repair, as in mutation-based APR)",
        move=KnobMove("guided_edit", to="token"), episodes_only=True),
    LibraryEntry(
        "swe_guided_quoted_edits", "knob (episodes): a guided edit changes one token of the line the issue quotes",
        # only where some training issues quote an editable line (a level-0 rung): elsewhere `quoted` is
        # `token`, and a child would train exactly as its control
        "knob:guided_edit", (GUIDED_BREAKING, when("train_quoted_line_rate", ">", 0.0)),
        "If guided_edit goes from {old} to {new} (a guided edit writes a line with one operator, comparison or "
        "integer changed, and on an issue that quotes a line, only that line), fewer guided patches break passing "
        "tests and some resolve, because the quoted line is the bug's, where untrained guided edits take the "
        "file's first `def` line with a default value; a group then holds a fixed episode beside unfixed ones.",
        FEWER_BREAKING,
        "a curriculum rung that gives the location (fault localisation) so the policy learns the repair",
        move=KnobMove("guided_edit", to="quoted"), episodes_only=True),
    LibraryEntry(
        "swe_call_form_credit", "reward (episodes): graded credit for the tool-call format, capped below a resolution",
        "hook:reward", (when("tool_failure_rate", ">", 0.3), when("dead_group_ratio", ">", 0.5)),
        "If each unresolved episode earns up to {credit} for the form of its calls (a fenced block, the tool fence, a "
        "named JSON call, an accepted call), dead groups regain reward variance and malformed calls fall, because the "
        "format is within the policy's reach when resolving is not.",
        FEWER_DEAD, "format rewards for agentic RL (DeepSeek-R1's format reward, applied per tool call)",
        template=CALL_FORM_CREDIT, params=(Param("credit", (0.1, 0.2, 0.3)),), episodes_only=True),
    LibraryEntry(
        "swe_worked_call_prompt", "prompt (episodes): a worked exchange of well-formed tool calls before the issue",
        "hook:prompt", (when("malformed_call_rate", ">", 0.5),),
        "If the episode opens with {shots} worked turns that are each one well-formed ```tool call, fewer calls are "
        "malformed, because a small model copies a format it is shown more readily than one it is told.",
        FEWER_MALFORMED, "few-shot demonstrations (Brown et al., 2020) for tool-call formats",
        template=WORKED_CALL_PROMPT, params=(Param("shots", (1, 2, 3)),), requires_hook="prompt", episodes_only=True),
    LibraryEntry(
        "swe_grounded_calls_prompt", "prompt (episodes): the calls a fix takes, written with the repository's own paths",
        "hook:prompt", (when("malformed_call_rate", "<", 0.5), when("tool_failure_rate", ">", 0.5)),
        "If the issue is followed by the calls that start its fix written with this repository's paths (read the file "
        "the issue names, edit it, run its test file, submit), fewer well-formed calls are refused, because a small "
        "policy copies the examples it is shown, and the tool list's placeholders (pkg/mod.py, tests/test_x.py, "
        "exact old text) are what it copied; so the free episodes' progress (an applied edit, a test run) rises.",
        ExpectedEffect("train_progress_rate", "delta>", 0.0),
        "grounded few-shot demonstrations: examples drawn from the task's own context (Liu et al., 2022)",
        template=GROUNDED_CALLS_PROMPT, requires_hook="prompt", episodes_only=True),
    LibraryEntry(
        "swe_give_up_penalty", "reward (episodes): a penalty for submitting without any edit",
        "hook:reward", (when("submit_without_edit_rate", ">", 0.5),),
        "If an episode that submits without a successful edit earns -{penalty}, fewer episodes give up and dead groups "
        "regain variance, because handing in nothing is no longer as good as trying and failing.",
        FEWER_DEAD, "the giving-up rule of the agentic RL field notes", template=GIVE_UP_PENALTY,
        params=(Param("penalty", (0.1, 0.2)),), episodes_only=True),
    LibraryEntry(
        "swe_repeat_penalty", "reward (episodes): a penalty for turns that repeat a call or make a refused one",
        "hook:reward", (when("repeat_call_rate", ">", 0.3),),
        "If each turn that repeats an accepted call or makes a refused one costs {weight} times its share of the "
        "episode's turns, repeats fall without valid calls falling and dead groups regain variance, because the echo "
        "trap now lowers the reward of the episodes caught in it and a malformed call is no way out of it.",
        FEWER_DEAD, "the echo-trap rule of the agentic RL field notes", template=REPEAT_PENALTY,
        params=(Param("weight", (0.1, 0.3)),), episodes_only=True,
        # The greedy held-out episodes can be caught in the trap (rereading one file) while the sampled
        # training episodes' calls are still malformed and repeat nothing: the engine's held-out rate.
        or_trigger=(when("heldout_repeat_call_rate", ">", 0.3),)),
    LibraryEntry(
        "swe_progress_credit", "reward (episodes): credit for an applied edit and a test run, capped below a resolution",
        "hook:reward", (when("train_valid_call_rate", ">", 0.5), when("train_progress_rate", "<", 0.05)),
        "If each unresolved episode earns up to {credit} for progress (half for an applied edit whose handed-in patch "
        "breaks no passing test, half for a test run) in place of what the reward paid, the share of free episodes "
        "that edit or run the tests rises, because progress is within reach (well-formed calls, or a guided plan's "
        "edits and test runs) and now pays, where before it earned what doing nothing earns.",
        ExpectedEffect("train_progress_rate", "delta>", 0.0),
        "process rewards for agentic RL: reward progress, not activity (the calls_without_progress rule)",
        template=PROGRESS_CREDIT, params=(Param("credit", (0.2, 0.3)),), episodes_only=True,
        # A guided plan's episodes edit and run the tests, and a resolution-only reward pays them what it pays
        # the free ones (nothing): every group is dead. The credit makes the plan's progress the contrast.
        or_trigger=(when("train_guided_progress_rate", ">", 0.5), when("dead_group_ratio", ">", 0.5),
                    when("train_progress_rate", "<", 0.05)),
        # Well-formed held-out calls that edit nothing and run no test (the engine's calls_without_progress
        # on the held-out split): the same answer, read where the greedy policy shows it.
        more_triggers=((when("heldout_valid_call_rate", ">", 0.5), when("heldout_progress_rate", "<", 0.05)),)),
)
