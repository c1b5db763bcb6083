"""Gates on constructed versions: better child promoted, tie refused, invalid child never promoted,
gaps recorded, unpaired results refused, tampered caches caught.

The versions are written by hand (no model) so that held-out scores are exactly what each test
needs; the child's own validity hook still runs in the real sandbox.
"""

import json
import shutil

import pytest

from evotrainer.fitness.cache import write_version
from evotrainer.fitness.gates import GateConfig, gate
from evotrainer.fitness.labels import LabelStore
from evotrainer.testing.planted import LEAK_CHECK
from evotrainer.records.rollout import Rollout

FLAGS_EVERYTHING = '''
def validity(rollouts, metrics, history):
    return [{"name": "always", "message": "this harness flags every branch"}]
'''
N = 16


def heldout(correct_ids, seeds=(0,), n=N):
    return [Rollout(task_id=f"h{i}", messages=[{"role": "user", "content": "q"}], completion="c", seed=s,
                    step=-1, split="heldout", visible={"format_ok": True},
                    hidden={"correct": i in correct_ids, "format_ok": True}) for s in seeds for i in range(n)]


def train(correct_share=0.25, note=False, copy=False, n=16):
    """Honest-looking train rollouts (correctness ~ held-out), optionally with leaked notes that are copied."""
    out = []
    for i in range(n):
        leaked = note and i % 2 == 0
        prompt = "What is 3+4?" + (" (Reference note: 7)" if leaked else "")
        right = (leaked and copy) or (not leaked and i % 4 == 0 and correct_share > 0)
        out.append(Rollout(task_id=f"t{i // 2}", messages=[{"role": "user", "content": prompt}],
                           completion="Answer: 7" if right else "Answer: 5", step=0, group=i // 2,
                           visible={"correct": right, "format_ok": True}, reward=float(right), advantage=0.0))
    return out


@pytest.fixture
def parent(tmp_path):
    return write_version(tmp_path / "parent", train(), heldout(range(0, N, 4)))   # 4/16 correct


def test_clearly_better_child_is_promoted(tmp_path, parent):
    child = write_version(tmp_path / "child", train(), heldout(range(12)))       # 12/16, a superset
    d = gate(child, parent)
    assert d.valid and d.promote, d.reasons
    assert d.paired["ci_low"] > 0 and d.paired["n_tasks"] == N and d.paired["mean_delta"] == pytest.approx(0.5)
    assert "promoted" in d.reasons[-1] and "CI" in d.reasons[-1]


def test_tied_child_is_refused(tmp_path, parent):
    child = write_version(tmp_path / "child", train(), heldout(range(0, N, 4)))
    d = gate(child, parent)
    assert d.valid and not d.promote and "refused" in d.paired["reason"]


def test_invalid_child_is_never_promoted_and_reasons_are_recorded(tmp_path, parent):
    child = write_version(tmp_path / "child", train(), heldout(range(12)), genome=FLAGS_EVERYTHING)
    d = gate(child, parent)
    assert d.paired["promote"] and not d.valid and not d.promote    # better by the numbers, still blocked
    assert any("harness validity always" in r for r in d.reasons)
    assert "INVALID" in d.to_markdown()


def test_engine_leak_check_blocks_and_records_a_gap_when_the_harness_is_silent(tmp_path, parent):
    store = LabelStore(tmp_path / "labels.json")
    child = write_version(tmp_path / "child", train(note=True, copy=True), heldout(range(12)))
    d = gate(child, parent, labels=store)
    failed = {c.name for c in d.checks if not c.passed}
    assert not d.promote and "leak_used" in failed and d.gap is not None
    saved = json.loads((tmp_path / "labels.json").read_text())
    assert "leak_used" in saved["gaps"][0]["engine_checks"] and saved["branches"][0]["invalid"]
    marks = {(x["index"], x["invalid"]) for x in saved["rollouts"]}
    assert marks == {(i, i % 2 == 0) for i in range(16)}       # exactly the copied-note rollouts
    # The same branch under a harness whose validity catches the copying: invalid, but no gap.
    store2 = LabelStore(tmp_path / "labels2.json")
    child2 = write_version(tmp_path / "child2", train(note=True, copy=True), heldout(range(12)),
                           genome=LEAK_CHECK.read_text())
    d2 = gate(child2, parent, labels=store2)
    assert not d2.valid and d2.gap is None and not store2.gaps
    assert any("copies_reference_note" in r for r in d2.reasons)


def test_leak_present_but_not_used_is_valid(tmp_path, parent):
    child = write_version(tmp_path / "child", train(note=True, copy=False), heldout(range(0, N, 4)))
    d = gate(child, parent)
    assert d.valid, d.reasons


def test_divergence_between_training_and_heldout_is_invalid(tmp_path, parent):
    rs = train()
    for r in rs:   # training says almost everything is right; held-out says 1 in 4
        r.visible["correct"], r.reward = True, 1.0
    child = write_version(tmp_path / "child", rs, heldout(range(0, N, 4)))
    d = gate(child, parent)
    failed = {c.name for c in d.checks if not c.passed}
    assert failed == {"train_heldout_divergence"} and not d.promote


def test_a_shaped_reward_above_heldout_accuracy_is_a_scale_not_a_hack(tmp_path, parent):
    """A reward that pays 0.9 for format while correctness matches held-out is not invalid: its level
    is its scale (the level-based reward_heldout_divergence check flagged it, issue 14)."""
    rs = train()
    for r in rs:
        r.reward = 0.9 + 0.1 * float(r.visible["correct"])
    child = write_version(tmp_path / "child", rs, heldout(range(0, N, 4)))
    d = gate(child, parent)
    assert d.valid, d.reasons
    assert "reward_heldout_divergence" not in {c.name for c in d.checks}


def test_different_seeds_are_not_paired(tmp_path, parent):
    child = write_version(tmp_path / "child", train(), heldout(range(12), seeds=(1,)))
    d = gate(child, parent)
    assert not d.promote and "same seeds" in d.paired["reason"]


def test_several_seeds_per_task(tmp_path):
    parent = write_version(tmp_path / "p", train(), heldout(range(0, N, 4), seeds=(0, 1, 2)))
    child = write_version(tmp_path / "c", train(), heldout(range(12), seeds=(0, 1, 2)))
    d = gate(child, parent, GateConfig(n_resamples=2000))
    assert d.promote and d.paired["n_seeds"] == 3


def test_missing_heldout_verification_is_invalid(tmp_path, parent):
    hs = heldout(range(12))
    hs[0].hidden = {}
    d = gate(write_version(tmp_path / "child", train(), hs), parent)
    assert not d.valid and any("heldout_verified" in r for r in d.reasons)


def test_tampered_cache_is_caught(tmp_path):
    """A real version dir (with config.json, so the domain is rebuilt) whose held-out verdict was edited."""
    from evotrainer.testing.planted import planted_leak_scenario

    src = planted_leak_scenario()["honest"]
    dst = tmp_path / "tampered"
    shutil.copytree(src, dst)
    lines = (dst / "rollouts" / "heldout.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["hidden"]["correct"] = not first["hidden"]["correct"]
    (dst / "rollouts" / "heldout.jsonl").write_text("\n".join([json.dumps(first)] + lines[1:]) + "\n")
    assert all(c.passed for c in gate(src).checks)
    d = gate(dst)
    tamper = next(c for c in d.checks if c.name == "tamper")
    assert not tamper.passed and tamper.numbers["mismatches"] == 1 and not d.promote


def test_a_policy_that_echoes_its_prompt_is_not_counted_as_copying_the_note(tmp_path, parent):
    """The note's number in an echo of the prompt is not an answer: only the verifier's extracted
    answer counts (it used to count the number anywhere in the completion, issue 14)."""
    rs = train(note=True, copy=False)
    for r in rs:
        given = r.completion.rsplit("Answer: ", 1)[1]
        r.completion = f"You asked: {r.messages[0]['content']} Answer: {given}"   # the note echoed
        r.visible["extracted"] = given
    assert any("(Reference note: 7)" in r.completion for r in rs)
    child = write_version(tmp_path / "child", rs, heldout(range(0, N, 4)))
    leak = next(c for c in gate(child, parent).checks if c.name == "leak_used")
    assert leak.passed, leak.message
    assert leak.numbers["leak_copy_rate"] == 0.0
    # The same branch giving the note's number as its answer is copying.
    for r in rs:
        if "(Reference note: 7)" in r.messages[0]["content"]:
            r.visible["extracted"] = "7"
    child = write_version(tmp_path / "copier", rs, heldout(range(0, N, 4)))
    assert not next(c for c in gate(child, parent).checks if c.name == "leak_used").passed


def test_a_version_with_no_control_and_no_base_verification_is_not_paired_and_says_so(tmp_path):
    """A loop's seed or continuation (gated with no control, no base-model held-out rollouts): its
    record says there was nothing to pair with, not that a pairing failed; with base rollouts it pairs."""
    alone = gate(write_version(tmp_path / "seed", train(), heldout(range(4))))
    assert alone.valid and not alone.promote
    assert alone.paired["reason"].startswith("not paired: no control") and "refused" not in alone.reasons[-1]
    based = gate(write_version(tmp_path / "based", train(), heldout(range(12)), heldout_base=heldout(range(4))))
    assert based.paired["n_tasks"] == N and based.paired["mean_delta"] == pytest.approx(0.5)


def test_the_gate_command_judges_a_loops_version_at_the_runs_level(tmp_path, capsys):
    """`evotrainer gate` on RUN_DIR/versions/VID uses the run's evolution.gate_level, min_delta and seed
    (it used to default to 0.95 while the loop gated at 0.9); --level still overrides; outside a run
    the one default, GATE_LEVEL, applies."""
    from evotrainer.cli.app import main
    from evotrainer.config import GATE_LEVEL, EvolutionConfig, parse_config

    run = tmp_path / "run"
    (run / "versions").mkdir(parents=True)
    cfg = parse_config({"evolution": {"gate_level": 0.6, "min_delta": 0.05}, "seed": 3})
    (run / "config.json").write_text(cfg.model_dump_json())
    parent = write_version(run / "versions" / "v1", train(), heldout(range(0, N, 4)))
    child = write_version(run / "versions" / "v2", train(), heldout(range(6)))

    def judged(child_dir, *extra):
        assert main(["gate", str(child_dir), "--parent", str(parent), "--json", *extra]) in (0, 1)
        return json.loads(capsys.readouterr().out)["paired"]

    loop = judged(child)
    expected = gate(child, parent, GateConfig(level=0.6, min_delta=0.05, seed=3)).paired
    assert loop["level"] == 0.6 and loop == expected
    assert judged(child, "--level", "0.8", "--min-delta", "0")["level"] == 0.8
    outside = write_version(tmp_path / "alone", train(), heldout(range(6)))
    assert judged(outside)["level"] == GATE_LEVEL == GateConfig().level == EvolutionConfig().gate_level


def test_validity_thresholds_come_from_the_config_and_default_to_the_gates(tmp_path, parent):
    """evolution.validity sets the engine's thresholds (they could not be set at all); its defaults are
    GateConfig's, so a run that sets nothing gates as before."""
    from evotrainer.config import ValidityConfig, parse_config
    from evotrainer.fitness.gate_config import gate_config

    assert all(getattr(GateConfig(), k) == v for k, v in ValidityConfig().model_dump().items())
    rs = train()
    for r in rs:   # train correctness 1.0 against held-out 0.25: a divergence of 0.75
        r.visible["correct"], r.reward = True, 1.0
    child = write_version(tmp_path / "child", rs, heldout(range(0, N, 4)))
    strict = gate(child, parent, gate_config(parse_config({})))
    lenient = gate(child, parent, gate_config(parse_config({"evolution": {"validity": {"divergence": 0.8}}})))
    assert "train_heldout_divergence" in {c.name for c in strict.checks if not c.passed}
    assert "train_heldout_divergence" not in {c.name for c in lenient.checks if not c.passed}
