"""`evotrainer run` on the swe domain: examples/evolve_swe.yaml, shrunk to the tiny model, runs the
co-evolution loop with children in two generations (real tool environment and sandboxed tests, real
LoRA training over episodes, real MLflow): every version settled, gated and recorded, the SWE health
report on every trained version, and the operators proposing from that report, never a single-turn
library entry (completion length, truncation, answer format) on episodes."""

from __future__ import annotations

import json
import logging

import yaml

from evotrainer.cli.app import main
from evotrainer.operators.evidence import Evidence
from evotrainer.operators.library import SINGLE_TURN_ONLY, LibraryOperator, default_entries
from evotrainer.genome.program import HarnessProgram
from evotrainer.records.version import VersionDir
from evotrainer.records.history import proposals
from tests.loop_runs import check_invariants, mlflow_runs

SWE_METRICS = ("turns_mean", "tool_failure_rate", "tool_calls_per_turn", "self_test_rate", "edit_rate", "submit_rate")
SINGLE_TURN = {e.id for e in default_entries() if e.single_turn}


def _swe_cfg(run_dir):
    cfg = yaml.safe_load(open("examples/evolve_swe.yaml"))
    cfg.update(model="tiny-random", run_dir=str(run_dir))
    cfg["domain"].update(n_train=4, n_heldout=2, n_test=1,
                         episode={"max_turns": 2, "max_turn_tokens": 8, "max_context_tokens": 1000, "wall_s": 60})
    cfg["grpo"].update(max_completion_length=128)   # per turn (a knob choice); the episode caps turns at 8 tokens
    cfg["train"].update(prompts_per_step=2, eval_max_new_tokens=6)
    cfg["evolution"].update(population_size=2, children_per_generation=2, generations=3, steps_per_generation=1,
                            budget={"wall_time_s": 600})
    return cfg


def test_evolve_swe_runs_the_loop_with_children_on_swe_reports(tmp_path, capsys, caplog):
    run_dir = tmp_path / "run"
    path = tmp_path / "evolve_swe.yaml"
    path.write_text(yaml.safe_dump(_swe_cfg(run_dir)))
    with caplog.at_level(logging.INFO, logger="evotrainer.operators.library"):
        assert main(["run", str(path)]) == 0, capsys.readouterr()
    state, metas = check_invariants(run_dir)
    assert state.status == "finished" and state.generation == 3
    seed = VersionDir(run_dir / "versions" / "v0000")
    assert seed.genome_source().startswith('"""Reference SWE harness'), "the seed is the SWE reference harness"

    # Every trained version: episodes under the config's limits, graded on hidden tests, and a health
    # report carrying the SWE harness's behaviour metrics.
    trained = [v for v, m in metas.items() if (run_dir / "versions" / v / "health.json").exists()]
    assert len(trained) >= 3
    for v in trained:
        vd = VersionDir(run_dir / "versions" / v)
        held = vd.rollouts("heldout")
        assert held and all(1 <= r.turns <= 2 and "resolved" in r.hidden for r in held)
        assert all(t["tokens"] <= 6 for r in held for t in r.turn_log)
        report = json.loads((vd.path / "health.json").read_text())
        assert all(k in report["metrics"] for k in SWE_METRICS), (v, sorted(report["metrics"]))
        assert report["metrics"]["tool_failure_rate"] == 1.0   # random text never holds a well-formed call
        alerts = {a["name"]: a for a in report["alerts"]}
        assert "tool_failures" in alerts
        # every episode ends at the turn limit: the overlong alert speaks of episodes, not token limits
        assert "episodes ended at a limit" in alerts["overlong"]["message"], alerts["overlong"]
        assert "max_completion_length" not in alerts["overlong"]["suggestion"]

    # Children in generations 1 and 2, each proposed by an operator, trained, verified and gated.
    children = [m for m in metas.values() if m.operator]
    assert {m.generation for m in children} == {1, 2}, [(m.version_id, m.generation) for m in children]
    for c in children:
        assert c.decision and {"tamper", "heldout_verified"} <= {ch["name"] for ch in c.decision["checks"]}
        assert c.metrics.get("heldout_accuracy") == 0.0
        # nothing resolved on either side: the gate broke the tie on the working calls (all refused: 0)
        paired = c.decision["paired"]
        assert paired.get("basis") == "working_calls" and paired["resolution"]["mean_delta"] == 0.0, paired
    for v in trained:   # what selection breaks a tie in accuracy with, then a tie in calls with
        assert metas[v].metrics.get("selection_working_calls") == 0.0, (v, metas[v].metrics)
        dead = json.loads((run_dir / "versions" / v / "health.json").read_text())["engine"]["dead_group_ratio"]
        imitated = any(m.get("imitated_tokens") for m in VersionDir(run_dir / "versions" / v).steps())
        live = metas[v].metrics.get("train_live_groups")
        # a group is live on a reward difference, or (guided_imitation) on guided calls it imitated
        assert live == 1.0 - dead if not imitated else live >= 1.0 - dead, (v, metas[v].metrics)
    # Recorded in MLflow: one run per version, the SWE metrics among a trained version's metrics.
    runs = {r.data.tags["evotrainer.version_id"]: r for r in mlflow_runs(run_dir)}
    assert set(runs) == set(metas)
    assert "turns_mean" in runs["v0000"].data.metrics and "tool_failure_rate" in runs["v0000"].data.metrics

    # The operators read the SWE report: a single-turn library entry fires on it (every episode ends at
    # the turn limit, so truncation_rate is 1) but is never proposed, and the reason is logged.
    proposed = [h for h in proposals(state.history) if h.entry]
    assert proposed and not SINGLE_TURN & {h.entry for h in proposed}, proposed
    assert any(SINGLE_TURN_ONLY in rec.getMessage() for rec in caplog.records)
    report = json.loads((seed.path / "health.json").read_text())
    found, skipped = LibraryOperator().applicable(HarnessProgram(seed.genome_source()), Evidence(health_report=report))
    assert {"longer_completions", "mask_truncated", "dapo_overlong_shaping"} <= {k for k, v in skipped.items()
                                                                               if v == SINGLE_TURN_ONLY}
    assert found and not SINGLE_TURN & {a.entry.id for a in found}


def test_prompt_leak_reads_only_the_prompt_of_an_engine_episode():
    """An engine episode's messages carry the conversation (the policy's turns and the tool results,
    which show the repository and its tests): the prompt-leak check reads only what the harness's
    prompt asked, cut at the first turn in ``turn_log``. Before, a tool result showing a hidden test
    marked the SWE seed invalid in a real smollm2 run."""
    from evotrainer.domains.swe.domain import SWEDomain
    from evotrainer.fitness.prompt_leak import _asked, _hidden_strings
    from evotrainer.records.rollout import Rollout

    domain = SWEDomain(n_train=1, n_heldout=1, n_test=1, difficulty=1, seed=0, workers=1)
    try:
        task = domain.tasks("train")[0]
    finally:
        domain.close()
    secret = _hidden_strings(task.hidden)[0]
    assert secret not in task.prompt
    prompt = [{"role": "system", "content": "use tools"}, {"role": "user", "content": task.prompt}]
    said = "```tool\n{\"name\": \"read_file\", \"args\": {\"path\": \"tests/test_x.py\"}}\n```"
    conversation = prompt + [{"role": "assistant", "content": said}, {"role": "user", "content": secret}]
    episode = Rollout(task_id=task.id, messages=conversation, completion="", turns=1,
                      turn_log=[{"text": said, "result": secret}])
    asked = _asked(episode)
    assert secret not in asked and task.prompt in asked
    # A prompt that itself carries the hidden value is still caught.
    leaky = Rollout(task_id=task.id, messages=[prompt[0], {"role": "user", "content": task.prompt + secret}] + conversation[2:],
                    completion="", turns=1, turn_log=[{"text": said, "result": ""}])
    assert secret in _asked(leaky)
