"""benchmarks/swe_edit_probe.py: each episode's patch, graded for real, is read against its bug."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from swe_edit_probe import episode_row, removed_lines, table, variant_odds  # noqa: E402

from evotrainer.domains import get_domain  # noqa: E402
from evotrainer.domains.swe.patching import diff_files  # noqa: E402
from evotrainer.domains.swe.templates import TEMPLATES  # noqa: E402


def _episode(domain, task, patch, group, guided, calls=()):
    visible = domain.verify_batch([task], [f"```diff\n{patch}```\n"])[0]
    return {"task_id": task.id, "group": group, "visible": visible, "reward": float(visible["resolved"]),
            "episode": {"patch": patch, "guided": guided}, "tool_calls": list(calls)}


def _lines(task):
    bug = task.hidden["bug"]
    path = f"{task.visible['package']}/{bug['module']}.py"
    buggy = task.visible["files"][path].splitlines()[bug["line"] - 1]
    fixed = TEMPLATES[bug["module"]]["source"].splitlines()[bug["line"] - 1]
    return path, buggy, fixed


def test_the_fix_and_a_breaking_edit_of_the_bugs_line_are_told_apart_by_level_and_group():
    domain = get_domain("swe", n_train=4, n_heldout=5, n_test=5, difficulty=[0, 1], seed=0)
    task = next(t for t in domain.tasks("train") if t.id.startswith("swe/L0/"))
    bug = task.hidden["bug"]
    path = f"{task.visible['package']}/{bug['module']}.py"
    buggy = task.visible["files"][path].splitlines()[bug["line"] - 1].strip()
    assert buggy in task.prompt                        # level 0 names the wrong line
    assert removed_lines(task.answer) == [buggy]       # the fix replaces exactly that line

    # the bug's line replaced by prose (a vandal edit): it applies, touches the bug's line, and the module
    # no longer imports, so its other functions' passing tests fail
    source = task.visible["files"][path]
    lines = source.splitlines(keepends=True)
    lines[bug["line"] - 1] = "this line is wrong!\n"
    breaking = diff_files({path: source}, {path: "".join(lines)})
    _, buggy_raw, fixed_raw = _lines(task)
    fix_call = {"name": "edit", "args": {"path": path, "search": buggy_raw, "replace": fixed_raw}, "error": None}
    refused = {"name": "edit", "args": {"path": path, "search": buggy_raw, "replace": fixed_raw}, "error": "no such line"}
    vandal_call = {"name": "edit", "args": {"path": path, "search": buggy_raw, "replace": "this line is wrong!"},
                   "error": None}
    fixed = episode_row(_episode(domain, task, task.answer, 0, True, [refused, fix_call]), buggy, "token",
                        fixed_raw.strip())
    broken = episode_row(_episode(domain, task, breaking, 0, False, [vandal_call]), buggy, "line",
                         fixed_raw.strip())
    assert fixed["edit_call"] and fixed["call_on_bug_line"] and fixed["call_writes_fix"]
    assert broken["edit_call"] and broken["call_on_bug_line"] and not broken["call_writes_fix"]
    only_refused = episode_row(_episode(domain, task, "", 1, True, [refused]), buggy, "token", fixed_raw.strip())
    assert not only_refused["edit_call"] and not only_refused["call_writes_fix"]
    signature = {"name": "edit", "args": {"path": path, "search": "def f(x, n=3):", "replace": "def f(x, n=4):"},
                 "error": None}
    on_def = episode_row(_episode(domain, task, "", 1, True, [signature]), buggy, "token", fixed_raw.strip())
    assert on_def["edit_call"] and on_def["call_def_line"] and not on_def["call_on_bug_line"]
    assert not fixed["call_def_line"]
    assert fixed["level"] == 0 and fixed["resolved"] and fixed["on_bug_line"] and not fixed["breaks_passing"]
    assert broken["edited"] and broken["on_bug_line"] and not broken["resolved"] and broken["breaks_passing"]
    assert not fixed["def_line"] and not broken["def_line"]
    cells = {(c["level"], c["guided"]): c for c in table([fixed, broken])}
    assert cells[(0, "token")]["resolved"] == 1 and cells[(0, None)]["resolved"] == 0
    assert cells[(0, "token")]["groups_parted_by_resolution"] == 1      # one group: a resolved and an unresolved member
    assert cells[(0, "token")]["groups_parted_by_a_written_fix"] == 1

    # an episode that handed in nothing did not edit
    idle = episode_row({"task_id": task.id, "group": 1, "visible": {"patch_applied": False},
                        "episode": {"patch": ""}}, buggy)
    assert not idle["edited"] and not idle["on_bug_line"] and not idle["breaks_passing"]


def test_every_level_one_fix_is_a_one_token_variant_of_the_bugs_line():
    """What a one-token guided edit on the right line can reach: the fix is always among the line's
    variants, one of about ten, so the line is what the policy has to find."""
    odds = variant_odds(1)
    assert set(odds) == {"train", "heldout", "test"}
    for split, cell in odds.items():
        assert cell["fix_is_a_variant"] == cell["bugs"] > 0, split
        assert 1 / 40 <= cell["chance"] <= 0.5, (split, cell)


def test_the_command_reads_version_directories_and_logs_one_that_never_trained(tmp_path):
    domain = get_domain("swe", n_train=4, n_heldout=5, n_test=5, difficulty=[0, 1], seed=0)
    task = next(t for t in domain.tasks("train") if t.id.startswith("swe/L0/"))
    version = tmp_path / "v0001"
    (version / "rollouts").mkdir(parents=True)
    (version / "meta.json").write_text(json.dumps({"knobs": {"guided_edit": "token"}}))
    path, buggy, fixed = _lines(task)
    episodes = [_episode(domain, task, task.answer, 0, True,
                         [{"name": "edit", "args": {"path": path, "search": buggy, "replace": fixed}, "error": None}]),
                _episode(domain, task, "", 0, False)]
    (version / "rollouts" / "train.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    (tmp_path / "v0002").mkdir()
    config = tmp_path / "probe.yaml"
    config.write_text("model: smollm2-135m\ndomain:\n  name: swe\n  difficulty: [0, 1]\n  n_train: 4\n"
                      "  n_heldout: 5\n  n_test: 5\n")
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "swe_edit_probe.py"
    out = subprocess.run([sys.executable, str(script), str(version), str(tmp_path / "v0002"), "--config", str(config),
                          "--json", str(tmp_path / "out.json")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"skipped {tmp_path / 'v0002'}: no rollouts/train.jsonl" in out.stderr
    assert "| 0 | token | 1 | 1 | 1 | 0 | 1 | 1 | 1 | 0 | 0 | 1 | 1 | 1 |" in out.stdout, out.stdout
    assert "| 0 | no | 1 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 1 | 1 |" in out.stdout, out.stdout
    saved = json.loads((tmp_path / "out.json").read_text())
    assert [r["resolved"] for r in saved["episodes"]] == [True, False]
    bad = subprocess.run([sys.executable, str(script), str(tmp_path / "v0002"), "--config", str(config)],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "no training episodes" in bad.stderr


@pytest.mark.parametrize("name, form", [("swe_level0_probe", "token"), ("swe_level0_quoted_probe", "quoted")])
def test_the_level_zero_probe_configs_are_runs_the_cli_accepts(name, form):
    """benchmarks/configs/swe_level0_*probe.yaml: levels 0 and 1 in train, half of each group guided with
    one-token (or quoted) edits, and knob values the reference SWE harness declares (else `evotrainer
    train` refuses)."""
    from evotrainer.config import load_config
    from evotrainer.loop.seed import seed_program

    cfg = load_config(Path(__file__).resolve().parents[1] / "benchmarks" / "configs" / f"{name}.yaml")
    program = seed_program(cfg)
    assert program.knobs["guided_edit"]["value"] == form and program.knobs["guided_plan_share"]["value"] == 0.5
    levels = {t.difficulty for t in get_domain("swe", n_train=cfg.domain.n_train, n_heldout=cfg.domain.n_heldout,
                                               n_test=cfg.domain.n_test, difficulty=cfg.domain.difficulty,
                                               seed=cfg.domain.seed).tasks("train")}
    assert levels == {0, 1} and cfg.train.prompts_per_step == cfg.domain.n_train
