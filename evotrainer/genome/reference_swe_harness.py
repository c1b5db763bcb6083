"""Reference SWE harness: the human RL recipe for repository bug fixing (``domain.name: swe``).

The math recipe (GRPO, clip-higher 0.2 / 0.28, no KL, no group filtering) with a binary reward that
is 1 only when the patch **resolves** the issue (the verifier's ``correct``: every FAIL_TO_PASS and
PASS_TO_PASS test passes in a clean copy), per-turn completions long enough for a tool call with its
reasoning, and the behaviour and efficiency layers of the field as standard metrics and alerts.

What it reads from a rollout dict (``records/rollout.py`` ``for_harness``), all defensively, since
multi-turn rollouts are plain data that older caches and other engines may lack:

* ``turns``: a list of turn dicts, or an int (a turn count; the engine's episodes then carry the
  turn dicts in ``turn_log`` and the submitted patch in ``episode.patch``). A turn dict may have ``role`` (only
  ``"assistant"`` turns are counted when any turn has a role), ``content`` or ``text``, the call's
  ``tool`` or ``name`` (or a nested ``tool_call`` dict), ``ok`` or ``error``, and the tool's
  ``result`` (a tool-result turn of role ``tool``/``user`` also carries it as ``content``).
* ``tool_calls``: a list of ``{"name", "args", "ok"}`` (``ok`` absent: ``error`` is None means ok).
  Without it, the calls are read from the turns.
* ``visible.correct`` (resolved), ``completion`` (the final patch) or ``patch``/``visible.patch``,
  ``messages`` (the issue: a file the issue names is the one it expects edited), ``step``, ``group``.

Tool names are the SWE environment's (``domains/swe/environment.py``): ``edit`` changes a file,
``run_tests`` is a self-test, ``search``/``read_file`` localise, ``git_log`` reads the history.

It is a harness file in the contract (data to the engine, run only in the sandbox, imports only
allow-listed modules). ``select_tasks`` and ``prompt`` are the reference harness's, written out so that
curriculum and prompt interventions have a block to replace.
"""

import math
import re

# EVOLVE-BLOCK-START
KNOBS = {
    "learning_rate": {"value": 1e-04, "range": [1e-06, 1e-03], "log": True},  # LoRA-sized step
    "num_generations": {"value": 4, "choices": [2, 4, 8]},
    "temperature": {"value": 1.0, "range": [0.3, 1.5]},
    "max_completion_length": {"value": 512, "choices": [128, 256, 512, 1024]},  # one turn: reasoning + a call
    "epsilon": {"value": 0.2, "range": [0.05, 0.5]},
    "epsilon_high": {"value": 0.28, "range": [0.05, 0.5]},  # clip-higher (DAPO)
    "beta": {"value": 0.0, "range": [0.0, 0.2]},  # KL coefficient: no KL by default
    "loss_type": {"value": "dapo", "choices": ["grpo", "dr_grpo", "dapo", "bnpo"]},
    "scale_rewards": {"value": "group", "choices": ["group", "batch", "none"]},
    "mask_truncated_completions": {"value": False, "choices": [True, False]},
    "guided_call_share": {"value": 0.0, "choices": [0.0, 0.25, 0.5]},  # episodes decoded under the call grammar
    "guided_plan_share": {"value": 0.0, "choices": [0.0, 0.25, 0.5]},  # ... that read, edit, test, submit in turn
    # a guided edit: any line; a one-token change; a one-token change of a line the issue quotes (level 0)
    "guided_edit": {"value": "line", "choices": ["line", "token", "quoted"]},
    # Behaviour cloning on guided episodes' accepted calls, whatever their reward: guidance alone trained
    # nothing where every group was dead. Inert while no episode is guided (the shares above are 0).
    "guided_imitation": {"value": 1.0, "choices": [0.0, 0.5, 1.0]},
}
# EVOLVE-BLOCK-END

EDIT_TOOLS = ("edit",)
TEST_TOOLS = ("run_tests",)
LOCATE_TOOLS = ("search", "read_file")
HISTORY_TOOLS = ("git_log",)
KNOWN_TOOLS = ("list_files", "read_file", "search", "edit", "run_tests", "view_diff", "git_log", "submit")
PATH_RE = re.compile(r"[\w./-]+\.py\b")


# ---- helpers (fixed; not evolved) -------------------------------------------------------------
def _mean(xs):
    return sum(xs) / len(xs) if xs else 0.0


def _pstd(xs):
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def _sstd(xs):
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _percentile(xs, q):
    xs = sorted(xs)
    if not xs:
        return 0.0
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _reward_of(rollout):
    r = rollout.get("reward")
    return float(r) if r is not None else (1.0 if (rollout.get("visible") or {}).get("correct") else 0.0)


def _resolved(rollout):
    return bool((rollout.get("visible") or {}).get("correct"))


def _turn_list(rollout):
    turns = rollout.get("turns")
    if not isinstance(turns, list):   # the engine's episodes: ``turns`` is a count, the turns are in turn_log
        turns = rollout.get("turn_log")
    return [t for t in turns if isinstance(t, dict)] if isinstance(turns, list) else []


def _n_turns(rollout):
    """Assistant turns of the episode (an int ``turns`` is a count; 1 for a single-turn rollout)."""
    turns = rollout.get("turns")
    if isinstance(turns, (int, float)) and not isinstance(turns, bool):
        return int(turns)
    listed = _turn_list(rollout)
    if any("role" in t for t in listed):
        return sum(1 for t in listed if t.get("role") == "assistant")
    return len(listed) if listed else int(rollout.get("n_turns") or 1)


def _call_of(d):
    """(name, args, ok) of a call dict, or None when the dict records no call."""
    nested = d.get("tool_call")
    if isinstance(nested, dict):
        d = {**d, **nested}
    name = d.get("name", d.get("tool"))
    if name is None and "args" not in d and "ok" not in d and "error" not in d:
        return None
    args = d.get("args") if isinstance(d.get("args"), dict) else {}
    ok = d.get("ok")
    ok = bool(ok) if ok is not None else d.get("error") is None
    return (name if isinstance(name, str) else None, args, ok)


def _calls(rollout):
    """The episode's tool calls in order, as (name, args, ok); from ``tool_calls`` or the turns."""
    raw = rollout.get("tool_calls")
    if not isinstance(raw, list) or not raw:
        raw = [t for t in _turn_list(rollout) if t.get("role", "assistant") == "assistant"]
    out = []
    for d in raw:
        if isinstance(d, dict):
            c = _call_of(d)
            if c is not None:
                out.append(c)
    return out


def _is_test_path(path):
    p = str(path)
    return p.startswith("tests/") or "/tests/" in p or p.rsplit("/", 1)[-1].startswith("test_") \
        or p.endswith("conftest.py")


def _source_edits(calls):
    """(call index, path) of successful edits of non-test files."""
    return [(i, str(a.get("path"))) for i, (n, a, ok) in enumerate(calls)
            if n in EDIT_TOOLS and ok and a.get("path") and not _is_test_path(a.get("path"))]


def _issue_paths(rollout):
    """Files the issue names: paths in the first user message (later ones are tool results)."""
    users = [m for m in rollout.get("messages") or [] if isinstance(m, dict) and m.get("role") == "user"]
    text = str(users[0].get("content", "")) if users else ""
    return {p.lstrip("./") for p in PATH_RE.findall(text)}


def _final_diff(rollout):
    for d in (rollout, rollout.get("visible") or {}, rollout.get("episode") or {}):
        if isinstance(d.get("patch"), str):
            return d["patch"].strip()
    return str(rollout.get("completion") or "").strip()


def _episode(rollout):
    """The behaviour facts of one episode."""
    calls = _calls(rollout)
    names = [n for n, _, _ in calls]
    edits = _source_edits(calls)
    first_edit = edits[0][0] if edits else None
    submit = names.index("submit") if "submit" in names else None
    end = submit if submit is not None else len(calls)
    issue = _issue_paths(rollout)
    edited = {p for _, p in edits}
    return {
        "turns": _n_turns(rollout),
        "calls": len(calls),
        "failed": sum(1 for _, _, ok in calls if not ok),
        "malformed": sum(1 for n, _, _ in calls if n not in KNOWN_TOOLS),
        "self_test": any(n in TEST_TOOLS and ok for n, _, ok in calls[:end]),   # a refused run ran nothing
        "edited": bool(edits),
        "files_edited": len(edited),
        "issue_file_edited": (bool(issue & edited) if issue else None),
        "search_before_edit": (any(n in LOCATE_TOOLS for n in names[:first_edit]) if edits else None),
        "first_edit_turn": (first_edit + 1 if edits else None),
        "submitted": submit is not None,
        "history": sum(1 for n in names if n in HISTORY_TOOLS),
        "repeats": _repeats(calls),
        "resolved": _resolved(rollout),
    }


def _repeats(calls):
    """Calls that repeat an earlier call of the episode exactly (same tool, same arguments)."""
    seen, n = set(), 0
    for name, args, _ in calls:
        key = (name, repr(sorted(args.items())))
        n += 1 if name is not None and key in seen else 0
        seen.add(key)
    return n


# ---- hooks -------------------------------------------------------------------------------------
# EVOLVE-BLOCK-START
def reward(rollouts, tasks):
    """1 when the patch resolves the issue (hidden tests of the repository, graded in a clean copy)."""
    return [1.0 if r["visible"].get("correct") else 0.0 for r in rollouts]
# EVOLVE-BLOCK-END


# EVOLVE-BLOCK-START
def keep_groups(groups):
    """No filtering: every group trains, dead ones included."""
    return [True for _ in groups]
# EVOLVE-BLOCK-END


# EVOLVE-BLOCK-START
def advantages(groups, rewards):
    """GRPO: (r - group mean) / (std + 1e-4), sample std as in TRL; the scale follows KNOBS."""
    scale = KNOBS["scale_rewards"]["value"]
    batch_std = _sstd([r for rs in rewards for r in rs])
    out = []
    for rs in rewards:
        m = _mean(rs)
        std = _sstd(rs) if scale == "group" else batch_std if scale == "batch" else None
        out.append([(r - m) / (std + 1e-4) if std is not None else r - m for r in rs])
    return out
# EVOLVE-BLOCK-END


# EVOLVE-BLOCK-START
def metrics(rollouts, groups):
    """Score and signal metrics, and the behaviour/efficiency layers of an SWE episode."""
    if not rollouts:
        return {"num_rollouts": 0.0, "num_groups": float(len(groups))}
    rewards = [_reward_of(r) for r in rollouts]
    group_stds = [_pstd([_reward_of(r) for r in g]) for g in groups if g]
    eps = [_episode(r) for r in rollouts]
    calls = sum(e["calls"] for e in eps)
    turns = [e["turns"] for e in eps]
    # The policy's own calls: an episode decoded under the call grammar (guided_call_share) is
    # well-formed by construction, so call-form rates read the free episodes when there are any.
    guided = [bool((r.get("episode") or {}).get("guided")) for r in rollouts]
    free = [e for e, g in zip(eps, guided) if not g] or eps
    free_calls = sum(e["calls"] for e in free)
    out = {
        "num_rollouts": float(len(rollouts)),
        "num_groups": float(len(groups)),
        "reward_mean": _mean(rewards),
        "reward_std": _pstd(rewards),
        "correct_rate": _mean([1.0 if e["resolved"] else 0.0 for e in eps]),
        "dead_group_ratio": _mean([1.0 if s < 1e-6 else 0.0 for s in group_stds]),
        "reward_spread": _mean(group_stds),
        "truncation_rate": _mean([1.0 if r.get("truncated") else 0.0 for r in rollouts]),
        # behaviour
        "turns_mean": _mean(turns),
        "turns_p90": _percentile(turns, 90),
        "tool_calls_mean": _mean([e["calls"] for e in eps]),
        "tool_calls_per_turn": calls / sum(turns) if sum(turns) else 0.0,
        "tool_failure_rate": sum(e["failed"] for e in free) / free_calls if free_calls else 0.0,
        "malformed_call_rate": sum(e["malformed"] for e in free) / free_calls if free_calls else 0.0,
        "guided_episode_rate": _mean([1.0 if g else 0.0 for g in guided]),
        # what a guided plan (guided_plan_share) does by construction: the free episodes' own
        "self_test_rate": _mean([1.0 if e["self_test"] else 0.0 for e in free]),
        "edit_rate": _mean([1.0 if e["edited"] else 0.0 for e in free]),
        "files_edited_mean": _mean([e["files_edited"] for e in free]),
        "submit_rate": _mean([1.0 if e["submitted"] else 0.0 for e in free]),
        "submit_without_edit_rate": _mean([1.0 if e["submitted"] and not e["edited"] else 0.0 for e in free]),
        "history_call_rate": _mean([1.0 if e["history"] else 0.0 for e in eps]),
        "history_calls_mean": _mean([e["history"] for e in eps]),
        "repeat_call_rate": sum(e["repeats"] for e in eps) / calls if calls else 0.0,
    }
    # Rates over the episodes they are defined for: absent rather than a misleading 0.0.
    named = [e["issue_file_edited"] for e in eps if e["issue_file_edited"] is not None]
    if named:
        out["issue_file_edit_rate"] = _mean([1.0 if x else 0.0 for x in named])
    located = [e["search_before_edit"] for e in eps if e["search_before_edit"] is not None]
    if located:
        out["search_before_edit_rate"] = _mean([1.0 if x else 0.0 for x in located])
    first = [e["first_edit_turn"] for e in eps if e["first_edit_turn"] is not None]
    if first:
        out["first_edit_turn_mean"] = _mean(first)
    diverse = [len({_final_diff(r) for r in g if _final_diff(r)}) / len(g) for g in groups if g]
    if diverse:
        out["solution_diversity"] = _mean(diverse)   # distinct non-empty final diffs per rollout of a group
    tokens = sum(len(r.get("logprobs") or []) for r in rollouts)
    if tokens:
        out["mean_logprob"] = sum(sum(r.get("logprobs") or []) for r in rollouts) / tokens
    return out
# EVOLVE-BLOCK-END


# EVOLVE-BLOCK-START
def alerts(metrics, history):
    """Agentic rules (echo trap, giving up, laziness, tool failures) and the signal rules."""
    found = []

    def add(name, severity, message, suggestion):
        found.append({"name": name, "severity": severity, "message": message, "suggestion": suggestion})

    window = [m for m in list(history[-3:]) + [metrics] if "turns_mean" in m and "correct_rate" in m]
    if len(window) >= 3:
        turns = [m["turns_mean"] for m in window]
        solved = [m["correct_rate"] for m in window]
        rising = all(b > a for a, b in zip(turns, turns[1:])) and turns[-1] >= 1.25 * turns[0] + 1.0
        if rising and solved[-1] - solved[0] < 0.05:
            add("echo_trap", "critical" if turns[-1] >= 2 * turns[0] else "warning",
                f"turns per episode rose {turns[0]:.1f} -> {turns[-1]:.1f} while resolution went "
                f"{solved[0]:.2f} -> {solved[-1]:.2f}",
                "the policy repeats itself: cap turns lower, penalise repeated calls, or filter groups whose "
                "rollouts all hit the turn limit")
        calls = [m.get("tool_calls_mean", 0.0) for m in window]
        tests = [m.get("self_test_rate", 0.0) for m in window]
        fewer = calls[-1] <= 0.75 * calls[0] and calls[0] - calls[-1] >= 1.0
        if fewer and tests[-1] < tests[0] - 0.1 and solved[-1] <= solved[0] + 0.02:
            add("laziness", "warning",
                f"tool calls per episode fell {calls[0]:.1f} -> {calls[-1]:.1f} and self-tests "
                f"{tests[0]:.0%} -> {tests[-1]:.0%} without better resolution ({solved[0]:.2f} -> {solved[-1]:.2f})",
                "reward self-testing (a small bonus for running the tests before submit) or raise the temperature")
    turns_now, blind = metrics.get("turns_mean"), metrics.get("submit_without_edit_rate")
    if turns_now is not None and (turns_now < 2.0 or (blind or 0.0) > 0.5):
        add("giving_up", "critical" if (blind or 0.0) > 0.8 or turns_now < 1.5 else "warning",
            f"{turns_now:.1f} turns per episode; {blind or 0.0:.0%} of episodes submit without an edit",
            "the tasks are too hard or submitting is too cheap: an easier curriculum, or no reward for an empty patch")
    fails, malformed = metrics.get("tool_failure_rate"), metrics.get("malformed_call_rate") or 0.0
    # Calls the environment cannot read reach no tool, so no episode can edit, test or earn anything:
    # the cause to answer first, by guiding some calls through the call grammar (the knobs named here).
    unread = malformed > 0.5
    if fails is not None and fails > 0.3:
        add("tool_failures", "critical" if fails > 0.6 else "warning",
            f"{fails:.0%} of tool calls failed (malformed: {malformed:.0%})",
            ("decode part of each group under the call grammar (guided_call_share, or guided_plan_share for "
             "the plan a fix takes), " if unread else "") +
            "show a worked tool call in the prompt, or add a small reward for well-formed calls")
    dead = metrics.get("dead_group_ratio")
    if dead is not None and dead > 0.5:
        add("insufficient_signal", "critical" if dead > 0.8 else "warning",
            f"{dead:.0%} of groups have no reward variance (dead groups)" +
            (f"; {malformed:.0%} of calls are malformed, so no episode reaches a tool that could earn reward"
             if unread else ""),
            "first make calls reach the tools (guided_call_share or guided_plan_share): an easier curriculum or "
            "larger groups cannot revive groups whose calls reach no tool" if unread else
            "an easier curriculum (level 1 first), larger groups, or a denser reward (visible tests passed)")
    logprob = metrics.get("mean_logprob")
    if logprob is not None and logprob > -0.05:
        add("exploration_collapse", "critical", f"mean sampler logprob is {logprob:.3f} (> -0.05)",
            "raise the temperature or add an exploration bonus")
    return found
# EVOLVE-BLOCK-END


# EVOLVE-BLOCK-START
def select_tasks(pool, stats, step, n):
    """The engine's seeded sampler: the pool arrives shuffled for this step; train on the first n.

    ``pool``: train tasks (id, prompt, difficulty, visible fields; never answers); ``stats``: task id ->
    {"attempts", "correct"} over the lineage's recent training. A curriculum reorders by these.
    """
    return [t["id"] for t in pool[:n]]
# EVOLVE-BLOCK-END


# EVOLVE-BLOCK-START
def prompt(task):
    """The task's own prompt as one user message (the model keeps its default system prompt)."""
    return [{"role": "user", "content": task["prompt"]}]
# EVOLVE-BLOCK-END


# EVOLVE-BLOCK-START
def validity(rollouts, metrics, history):
    """No validity checks in the reference recipe (the engine checks the leak and the held-out gap)."""
    return []
# EVOLVE-BLOCK-END
