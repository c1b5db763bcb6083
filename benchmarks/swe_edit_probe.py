"""What the guided edits of SWE training episodes did, by issue level: did they touch the bug's line,
keep the tests, resolve the issue.

Reads trained versions' training episodes (``rollouts/train.jsonl``) and rebuilds their tasks from
the config they trained under, so each edit is compared with the catalogued bug (its line and its
buggy text). A guided episode's edit form (``guided_edit``: any line, or a one-token variant) is read
from its version's knobs. The
question it answers is the one below the level-0 rung of issue 49: with the issue naming the wrong
line, do one-token guided edits reach the fix often enough that a GRPO group holds a resolved episode
beside an unresolved one (a gradient toward the fix)?

    evotrainer train benchmarks/configs/swe_level0_probe.yaml
    python benchmarks/swe_edit_probe.py runs/swe_level0_probe --config benchmarks/configs/swe_level0_probe.yaml \
        --json benchmarks/results/swe_level0_probe.json
    python benchmarks/swe_edit_probe.py runs/suite_ds51/swe-1/evolve-s2/versions/v* \
        --config runs/suite_ds51/swe-1/evolve-s2/config.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from evotrainer.config import load_config
from evotrainer.domains import build_domain
from evotrainer.domains.swe.generator import catalogue, split_of
from evotrainer.domains.swe.templates import TEMPLATES
from evotrainer.domains.swe.token_edits import token_variants


def removed_lines(patch: str) -> list[str]:
    """The lines a unified diff removes (its ``-`` lines, without the file headers), stripped."""
    return [ln[1:].strip() for ln in patch.splitlines() if ln.startswith("-") and not ln.startswith("---")]


def edit_calls(rollout: dict) -> list[dict]:
    """The episode's ``edit`` calls the environment accepted (their ``search`` and ``replace``)."""
    return [c.get("args") or {} for c in rollout.get("tool_calls") or []
            if c.get("name") == "edit" and not c.get("error")]


def episode_row(rollout: dict, buggy_line: str, edit_form: str = "line",
                fixed_line: str | None = None) -> dict:
    """One training episode: its level, whether it was guided (and its guided edits' form), what its
    accepted edit calls wrote (on the bug's line; the fix itself, ``fixed_line``), and what its
    handed-in patch did. The calls count where an episode ends before it submits (a short probe)."""
    visible, episode = rollout.get("visible") or {}, rollout.get("episode") or {}
    patch = episode.get("patch") or ""
    edited = bool(visible.get("patch_applied")) and bool(patch.strip())
    p2p = visible.get("pass_to_pass") or {}
    calls = edit_calls(rollout)
    on_line = [c for c in calls if str(c.get("search", "")).strip() == buggy_line]
    return {"task_id": rollout["task_id"], "level": int(rollout["task_id"].split("/")[1][1:]),
            "group": rollout.get("group"), "guided": edit_form if episode.get("guided") else None,
            "edit_call": bool(calls), "call_on_bug_line": bool(on_line),
            "call_def_line": any(str(c.get("search", "")).strip().startswith(("def ", "async def ")) for c in calls),
            "call_writes_fix": fixed_line is not None and any(str(c.get("replace", "")).strip() == fixed_line
                                                               for c in on_line),
            "edited": edited, "on_bug_line": edited and buggy_line in removed_lines(patch),
            "def_line": edited and any(x.startswith(("def ", "async def ")) for x in removed_lines(patch)),
            "breaks_passing": edited and any(not t.get("passed") for t in p2p.values()),
            "resolved": bool(visible.get("resolved")), "reward": rollout.get("reward")}


COUNTS = ("edit_call", "call_on_bug_line", "call_def_line", "call_writes_fix",
          "edited", "on_bug_line", "def_line", "breaks_passing", "resolved")
HEADERS = ("accepted edit call", "edit call on the bug's line", "edit call on a `def` line", "edit call writes the fix",
           "patch applied", "patch on the bug's line", "patch on a `def` line", "patch breaks a passing test",
           "resolved")


def table(rows: list[dict]) -> list[dict]:
    """Counts per (level, guided edit form or None), and per level the groups holding a resolved
    episode beside an unresolved one (the gradient toward a fix GRPO gets)."""
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        cells[(r["level"], r["guided"] or "")].append(r)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["level"], r.get("version"), r["task_id"], r["group"])].append(r)
    out = []
    for (level, guided), rs in sorted(cells.items()):
        def parted(key: str) -> int:
            return sum(1 for (lv, *_), g in groups.items() if lv == level
                       and any(x[key] for x in g) and not all(x[key] for x in g))
        out.append({"level": level, "guided": guided or None, "episodes": len(rs),
                    **{k: sum(r[k] for r in rs) for k in COUNTS},
                    "groups_parted_by_resolution": parted("resolved"),
                    "groups_parted_by_a_written_fix": parted("call_writes_fix")})
    return out


def variant_odds(level: int = 1) -> dict[str, dict]:
    """Per split, over the catalogue's bugs of ``level``: how many fixes are one-token variants of the
    bug's line (what a guided edit writes under ``guided_edit: token``), and the mean chance that a
    variant drawn uniformly from that line's is the fix. What a guided edit on the right line could
    reach with no skill at choosing the variant."""
    out: dict[str, dict] = {}
    for bug in catalogue():
        if bug.level != level:
            continue
        clean = TEMPLATES[bug.module]["source"]
        buggy_line = bug.mutation.apply(clean).splitlines()[bug.mutation.line - 1]
        variants = token_variants(buggy_line)
        fixed = clean.splitlines()[bug.mutation.line - 1] in variants
        cell = out.setdefault(split_of(bug), {"bugs": 0, "fix_is_a_variant": 0, "chance": 0.0})
        cell["bugs"] += 1
        cell["fix_is_a_variant"] += fixed
        cell["chance"] += (1 / len(variants)) if fixed else 0.0
    for cell in out.values():
        cell["chance"] = round(cell["chance"] / cell["bugs"], 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("versions", type=Path, nargs="*", help="trained version directories (their rollouts/train.jsonl)")
    ap.add_argument("--config", help="the config they trained under (to rebuild their tasks)")
    ap.add_argument("--json", type=Path, default=None, help="write the rows and the table here")
    ap.add_argument("--variants", action="store_true", help="print, per split of level 1, how often a uniform "
                    "one-token variant of the bug's line is its fix, and stop")
    args = ap.parse_args()
    if args.variants:
        print("| split | level-1 bugs | fix among the line's one-token variants | chance a uniform variant is the fix |")
        print("|---|---|---|---|")
        for split, c in sorted(variant_odds().items()):
            print(f"| {split} | {c['bugs']} | {c['fix_is_a_variant']} | {c['chance']:.3f} |")
        return
    if not args.versions or not args.config:
        ap.error("give trained version directories and --config (or --variants)")
    cfg = load_config(args.config)
    tasks = {t.id: t for t in build_domain(cfg.domain).tasks("train")}
    rows = []
    for version in args.versions:
        train = version / "rollouts" / "train.jsonl"
        if not train.is_file():   # a version that never trained (a run's last, unfinished one)
            print(f"skipped {version}: no rollouts/train.jsonl", file=sys.stderr)
            continue
        meta = json.loads((version / "meta.json").read_text()) if (version / "meta.json").is_file() else {}
        form = (meta.get("knobs") or {}).get("guided_edit") or cfg.grpo.guided_edit or "line"
        for line in train.read_text().splitlines():
            r = json.loads(line)
            task = tasks.get(r["task_id"])
            if task is None:
                raise SystemExit(f"{r['task_id']} is not a train task of {args.config}: give the config they trained under")
            bug = task.hidden["bug"]
            path = f"{task.visible['package']}/{bug['module']}.py"
            buggy_line = task.visible["files"][path].splitlines()[bug["line"] - 1].strip()
            fixed_line = TEMPLATES[bug["module"]]["source"].splitlines()[bug["line"] - 1].strip()
            rows.append(dict(episode_row(r, buggy_line, form, fixed_line), version=str(version)))
    if not rows:
        raise SystemExit("no training episodes in the versions given: give version directories that training wrote")
    summary = table(rows)
    print("| level | guided edit | episodes | " + " | ".join(HEADERS) + " | groups parted by a resolution "
          "| groups parted by a written fix |")
    print("|---" * (len(HEADERS) + 5) + "|")
    for c in summary:
        cells = [c["level"], c["guided"] or "no", c["episodes"], *(c[k] for k in COUNTS),
                 c["groups_parted_by_resolution"], c["groups_parted_by_a_written_fix"]]
        print("| " + " | ".join(map(str, cells)) + " |")
    if args.json:
        args.json.write_text(json.dumps({"versions": [str(v) for v in args.versions], "config": args.config, "table": summary,
                                         "episodes": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
