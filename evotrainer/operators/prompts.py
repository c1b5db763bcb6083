"""Prompts of the LLM operators.

Every prompt carries the harness contract, the parent genome, the health report (alerts first,
most severe first), matching skills and recent history, and ends with the REQUIRED REPLY FORMAT
that ``parsing`` reads. Sections are capped in length so that a small local model's context
holds the whole prompt.
"""

from __future__ import annotations

import json
from typing import Any

from evotrainer.operators.evidence import Evidence
from evotrainer.operators.intervention import FITNESS_METRIC
from evotrainer.operators.library import Applicable, entries_text
from evotrainer.genome.contract import DEFAULT_ALLOWED_IMPORTS
from evotrainer.genome.program import HOOK_PARAMS

SEVERITY_ORDER = {"critical": 0, "error": 1, "warning": 2, "info": 3}

SYSTEM = (
    "You are an expert reinforcement-learning engineer. You improve a training harness for an LLM policy "
    "trained with GRPO-style RL. You change ONE factor at a time (one knob or one hook), state a falsifiable "
    "hypothesis and the metric effect you expect, and follow the reply format exactly."
)

REPLY_HEADER = f"""HYPOTHESIS: <one sentence: if <change>, then <metric> moves, because <reason>>
EXPECT: <metric> <op> <number>      (op: < > <= >= delta< delta>; metric: a name from METRICS, or {FITNESS_METRIC})
FACTOR: <knob:NAME or hook:NAME>    (the one knob or hook you change)"""

DIFF_FORMAT = REPLY_HEADER + """
then one or more edit blocks; SEARCH text must be copied exactly from the harness:
<<<<<<< SEARCH
<lines copied exactly from the harness>
=======
<the new lines>
>>>>>>> REPLACE

Example reply:
HYPOTHESIS: If groups whose rewards are all equal are dropped, fewer dead groups train, because they carry no advantage.
EXPECT: dead_group_ratio < 0.3
FACTOR: hook:keep_groups
<<<<<<< SEARCH
    return [True for _ in groups]
=======
    return [len(set(r["visible"].get("correct") for r in g)) > 1 for g in groups]
>>>>>>> REPLACE"""

REWRITE_FORMAT = REPLY_HEADER + """
then ONE ```python code block holding the complete new definition of the hook `def {hook}(...)` with the
same parameters, and nothing else in the block (no imports outside the function, no other functions)."""

CROSSOVER_FORMAT = REPLY_HEADER + """
TAKE: <the factor to copy from harness B, exactly as listed above>"""


def contract_text() -> str:
    """The harness contract, built from the genome package's own definitions so it cannot drift."""
    hooks = "\n".join(f"  def {name}({', '.join(params)})" for name, params in HOOK_PARAMS.items())
    return (
        "A harness is one Python module. KNOBS is a dict literal: name -> {'value': v, 'range': [lo, hi] "
        "(optional 'log': True) or 'choices': [...]}. Hooks (plain functions, each called once per batch "
        f"on plain JSON data):\n{hooks}\n"
        "reward returns one float per rollout; keep_groups one bool per group; advantages one list of floats "
        "per group; metrics a dict of floats; alerts and validity lists of dicts.\n"
        f"Only these imports are allowed: {', '.join(DEFAULT_ALLOWED_IMPORTS)}. No file access, eval/exec, "
        "dunder attributes. Only code between '# EVOLVE-BLOCK-START' and '# EVOLVE-BLOCK-END' may change."
    )


def _cap(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 20] + "\n... [truncated]"


def health_text(evidence: Evidence, max_chars: int = 3000) -> str:
    report = evidence.health_report or {}
    alerts = sorted(evidence.alerts(), key=lambda a: SEVERITY_ORDER.get(str(a.get("severity", "info")), 9))
    lines = ["ALERTS (most severe first):"]
    lines += [f"- [{a.get('severity', '?')}] {a.get('name') or a.get('rule') or ''}: {a.get('message', '')}"
              + (f" -> suggestion: {a['suggestion']}" if a.get("suggestion") else "") for a in alerts] or ["- none"]
    metrics = report.get("metrics") or {}
    lines.append("METRICS:")
    lines += [f"- {k}: {_fmt(v)}" for k, v in metrics.items()] or ["- none reported"]
    violations = report.get("validity") or report.get("violations") or []
    if violations:
        lines.append("VALIDITY VIOLATIONS:")
        lines += [f"- {json.dumps(v, default=str)}" for v in violations]
    return _cap("\n".join(lines), max_chars)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def skills_text(evidence: Evidence, max_chars: int = 1500) -> str:
    if not evidence.skills:
        return "none"
    parts = []
    for s in evidence.skills:
        parts.append("- " + "; ".join(f"{k}: {s[k]}" for k in ("trigger", "intervention", "expected_outcome", "evidence")
                                      if k in s) if isinstance(s, dict) else f"- {s}")
    return _cap("\n".join(parts), max_chars)


def history_text(evidence: Evidence, last: int = 5, max_chars: int = 1500) -> str:
    if not evidence.history:
        return "none"
    parts = [f"- {json.dumps(h, default=str)}" for h in evidence.history[-last:]]
    return _cap("\n".join(parts), max_chars)


def gaps_text(evidence: Evidence, last: int = 3, max_chars: int = 1200) -> str:
    """Invalid branches that no validity check of their harness flagged: what a diagnostic should catch."""
    parts = [f"- {', '.join(g.get('engine_checks') or [])} found {g.get('path', '?')} invalid; "
             f"its harness said nothing. Suggestion: {g.get('suggestion', '')}" for g in evidence.gaps[-last:]]
    return _cap("\n".join(parts), max_chars)


def _context(parent_source: str, evidence: Evidence, title: str = "HARNESS") -> str:
    gaps = f"## DIAGNOSTIC GAPS\n{gaps_text(evidence)}\n\n" if evidence.gaps else ""
    return (
        f"## HARNESS CONTRACT\n{contract_text()}\n\n"
        f"## HEALTH REPORT\n{health_text(evidence)}\n\n"
        f"## MATCHING SKILLS\n{skills_text(evidence)}\n\n"
        f"## RECENT HISTORY\n{history_text(evidence)}\n\n" + gaps +
        f"## {title}\n```python\n{parent_source}\n```\n"
    )


def _messages(user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def diff_messages(parent_source: str, evidence: Evidence) -> list[dict[str, str]]:
    return _messages(
        _context(parent_source, evidence)
        + "\n## TASK\nPropose ONE change to one knob or one hook that addresses the most severe alert.\n\n"
        f"## REQUIRED REPLY FORMAT\n{DIFF_FORMAT}\n"
    )


def rewrite_messages(parent_source: str, hook: str, evidence: Evidence) -> list[dict[str, str]]:
    return _messages(
        _context(parent_source, evidence)
        + f"\n## TASK\nRewrite the hook `{hook}` to address the health report. Change nothing else.\n\n"
        f"## REQUIRED REPLY FORMAT\n{REWRITE_FORMAT.format(hook=hook)}\nFACTOR must be hook:{hook}.\n"
    )


def crossover_messages(a_source: str, differences: dict[str, tuple[str, str]],
                       evidence: Evidence) -> list[dict[str, str]]:
    diffs = "\n\n".join(f"### {factor}\nA:\n{_cap(a, 1200)}\nB:\n{_cap(b, 1200)}"
                        for factor, (a, b) in differences.items())
    return _messages(
        _context(a_source, evidence, title="HARNESS A")
        + f"\n## FACTORS WHERE HARNESS B DIFFERS\n{diffs}\n\n"
        "## TASK\nChoose the ONE factor of harness B that, copied into harness A, best addresses the health "
        "report.\n\n"
        f"## REQUIRED REPLY FORMAT\n{CROSSOVER_FORMAT}\nFACTOR and TAKE name the same factor.\n"
    )


def repair_messages(failed_source: str, failure: str, evidence: Evidence) -> list[dict[str, str]]:
    return _messages(
        _context(failed_source, evidence, title="BROKEN CHILD HARNESS")
        + f"\n## ERROR\n{_cap(failure, 2000)}\n\n"
        "## TASK\nThe child harness above failed with this error. Fix the error with the smallest edit, keeping "
        "the child's intended change. Edit the BROKEN CHILD HARNESS (SEARCH text comes from it).\n\n"
        f"## REQUIRED REPLY FORMAT\n{DIFF_FORMAT}\n"
    )


# ---- llm_choice: pick a fired library entry or a knob value (a JSON reply under a schema) -----------
# The metrics a choice prompt shows: the ones library triggers read, so a small model's context
# holds the whole prompt and every number in it bears on a listed option.
CHOICE_METRICS = ("heldout_accuracy", "heldout_delta", "train_correct_rate", "train_heldout_gap", "dead_group_ratio",
                  "kept_group_ratio", "reward_spread", "format_compliance", "truncation_rate", "mean_logprob",
                  "response_length_p50")


def health_summary_text(evidence: Evidence, max_alerts: int = 5) -> str:
    """The alerts (most severe first) and the key metrics, one line each."""
    alerts = sorted(evidence.alerts(), key=lambda a: SEVERITY_ORDER.get(str(a.get("severity", "info")), 9))
    lines = [f"- [{a.get('severity', '?')}] {a.get('name') or a.get('rule') or ''}: {a.get('message', '')}"
             for a in alerts[:max_alerts]] or ["- no alerts"]
    metrics = (evidence.health_report or {}).get("metrics") or {}
    shown = [f"{k}={_fmt(metrics[k])}" for k in CHOICE_METRICS if metrics.get(k) is not None]
    return "\n".join(lines + ["metrics: " + (", ".join(shown) or "none reported")])


def _knob_line(name: str, spec: dict[str, Any], grid: list[Any]) -> str:
    declared = f" in [{spec['range'][0]:g}, {spec['range'][1]:g}]" if "range" in spec else ""
    return (f"- {name} = {json.dumps(spec['value'])}{declared}; new value one of: "
            f"{' | '.join(json.dumps(v) for v in grid)}")


def choice_messages(evidence: Evidence, fired: list[Applicable], knob_specs: dict[str, dict[str, Any]],
                    knob_grids: dict[str, list[Any]]) -> list[dict[str, str]]:
    """The llm_choice prompt: health summary, the fired library entries, the tunable knobs, and the
    reply format. It is short on purpose: prefill dominates a small local model's time on a CPU, and
    the schema, not the prompt, keeps the reply valid."""
    knobs = "\n".join(_knob_line(n, knob_specs[n], g) for n, g in knob_grids.items()) or "none"
    user = (
        f"## HEALTH REPORT\n{health_summary_text(evidence)}\n\n"
        f"## INTERVENTIONS THAT FIT THIS REPORT (from papers and recipes)\n{entries_text(fired, full=False)}\n\n"
        f'## OR SET ONE KNOB (reply {{"entry": "knob", "knob": <name>, "value": <new value>, "hypothesis": <why>}})\n'
        f"{knobs}\n\n"
        "## TASK\nChoose the ONE change that best addresses the health report, preferably an intervention above "
        "with a value for each of its params. Reply with one JSON object only:\n"
        '{"entry": "<intervention id>", "params": {"<param>": <value>}, "hypothesis": "<one short sentence: why>"}\n'
    )
    return _messages(user)
