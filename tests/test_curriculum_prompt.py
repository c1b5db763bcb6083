"""Curriculum and prompt in the harness: the select_tasks and prompt hooks, and the engine's own
checks of what they chose (train tasks only; no answer or hidden data in what the policy is asked)."""

import pytest
import yaml

from evotrainer.cli.app import main
from evotrainer.domains import get_domain
from evotrainer.domains.sampling import sample_tasks, seeded_order
from evotrainer.fitness.gates import gate
from evotrainer.genome.contract import check_contract
from evotrainer.genome.edits import rewrite_hook
from evotrainer.genome.errors import ContractError
from evotrainer.genome.harness import Harness
from evotrainer.genome.program import HarnessProgram, reference_program
from evotrainer.policy.collect import default_prompt, prompt_fn
from evotrainer.policy.curriculum import choose_tasks, task_stats
from evotrainer.records.rollout import Rollout
from evotrainer.records.version import VersionDir

DOMAIN = get_domain("math", difficulty=[1, 2], n_train=16, n_heldout=6, n_test=4)
POOL = DOMAIN.tasks("train")

EASIEST_FIRST = '''def select_tasks(pool, stats, step, n):
    """Easier-first: lowest difficulty, then fewest correct answers so far."""
    ranked = sorted(pool, key=lambda t: (t["difficulty"], stats.get(t["id"], {}).get("correct", 0)))
    return [t["id"] for t in ranked[:n]]
'''

PICKS_HELDOUT = '''def select_tasks(pool, stats, step, n):
    return ["math-heldout-guess"] + [t["id"] for t in pool[: n - 1]]
'''

LEAKING_PROMPT = '''def prompt(task):
    """Computes the answer from the question and tells the policy: a leak the engine must catch."""
    import re
    m = re.search(r"(\\d+) ([+-]) (\\d+)", task["prompt"])
    extra = ""
    if m:
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        extra = f" (Hint: the result is {a + b if op == '+' else a - b}.)"
    return [{"role": "user", "content": task["prompt"] + extra}]
'''

SYSTEM_PROMPT = '''def prompt(task):
    """A format instruction as a system prompt, with a fixed worked example."""
    return [{"role": "system", "content": "Reply with one line 'Answer: N', e.g. 'Answer: 5'."},
            {"role": "user", "content": task["prompt"]}]
'''


def child(hook: str, source: str) -> HarnessProgram:
    return rewrite_hook(reference_program(), hook, source)


def test_the_contract_knows_the_new_hooks_signatures():
    check_contract(child("select_tasks", EASIEST_FIRST))
    check_contract(child("prompt", SYSTEM_PROMPT))
    bad = reference_program().source.replace("def select_tasks(pool, stats, step, n):", "def select_tasks(pool, n):")
    with pytest.raises(ContractError, match="select_tasks"):
        check_contract(HarnessProgram(bad))


def test_the_reference_harness_keeps_the_default_sampler():
    """The reference hook, run in the sandbox on the engine's seeded order, is the old sampler."""
    with Harness(reference_program()) as h:
        for step in range(5):
            ids = h.select_tasks(seeded_order(POOL, 4, step, 3), {}, step, 4)
            assert ids == [t.id for t in sample_tasks(POOL, 4, step, 3)]
        assert h.uses_reference("select_tasks") and h.uses_reference("prompt")
        assert prompt_fn(h) is default_prompt      # no round trip per task for the reference's prompt
        assert h.prompt(POOL[0]) == POOL[0].messages()


def test_a_curriculum_hook_chooses_the_steps_tasks_in_the_sandbox():
    with Harness(child("select_tasks", EASIEST_FIRST)) as h:
        assert not h.uses_reference("select_tasks")
        tasks, violations = choose_tasks(h, POOL, {}, step=0, n=4, seed=0)
    assert violations == [] and len(tasks) == 4
    assert all(t.difficulty == min(p.difficulty for p in POOL) for t in tasks)


def test_stats_count_attempts_and_correct_answers():
    rs = [Rollout(task_id="a", messages=[], completion="", visible={"correct": c}) for c in (True, False, True)]
    assert task_stats(rs) == {"a": {"attempts": 3, "correct": 2}}


def test_a_curriculum_that_picks_a_non_train_task_is_refused_and_recorded():
    with Harness(child("select_tasks", PICKS_HELDOUT)) as h:
        tasks, violations = choose_tasks(h, POOL, {}, step=2, n=4, seed=0)
    assert len(tasks) == 4 and all(t.split == "train" for t in tasks)   # never trained on the guess
    assert len(violations) == 1 and "math-heldout-guess" in violations[0] and "step 2" in violations[0]


def train(tmp_path, program: HarnessProgram, name: str):
    harness = tmp_path / f"{name}.py"
    harness.write_text(program.source)
    cfg = {"model": "tiny-random", "run_dir": str(tmp_path / name), "harness": str(harness),
           "domain": {"difficulty": 2, "n_train": 12, "n_heldout": 6, "n_test": 4},
           "grpo": {"max_completion_length": 32, "num_generations": 2},
           "train": {"steps": 1, "prompts_per_step": 4, "eval_max_new_tokens": 4}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path)]) == 0
    return tmp_path / name


def test_a_prompt_hook_that_leaks_the_answer_is_caught_by_the_gate(tmp_path, capsys):
    leaky = train(tmp_path, child("prompt", LEAKING_PROMPT), "leaky")
    asked = VersionDir(leaky).rollouts("train")[0].messages[-1]["content"]
    assert "Hint: the result is" in asked            # the hook really shaped what the policy was asked
    held = VersionDir(leaky).rollouts("heldout")
    assert all("Hint" in r.messages[-1]["content"] for r in held)   # verified as it was trained
    d = gate(leaky)
    check = next(c for c in d.checks if c.name == "prompt_leak")
    assert not d.valid and not check.passed and check.numbers["own_share"] == 1.0
    assert "reveals" in check.message


def test_an_honest_prompt_hook_passes_and_a_chosen_heldout_task_fails(tmp_path, capsys):
    honest = train(tmp_path, child("prompt", SYSTEM_PROMPT), "honest")
    assert VersionDir(honest).rollouts("train")[0].messages[0]["role"] == "system"
    checks = {c.name: c for c in gate(honest).checks}
    assert checks["prompt_leak"].passed and checks["train_tasks_only"].passed
    picky = train(tmp_path, child("select_tasks", PICKS_HELDOUT), "picky")
    assert "engine check" in capsys.readouterr().out
    assert "not a train task" in VersionDir(picky).engine_violations()[0]
    d = gate(picky)
    check = next(c for c in d.checks if c.name == "train_tasks_only")
    assert not d.valid and not check.passed and "math-heldout-guess" in check.message


FAILING_PROMPT = '''def prompt(task):
    raise RuntimeError("this prompt hook always fails")
'''


def test_a_prompt_hook_that_fails_at_run_time_rejects_its_version_and_the_run_goes_on(tmp_path):
    """The train stage asks each version's prompts before the (shared) sampling call, so a hook that
    raises is that version's failure, recorded with the hook's error, not a crash of the run."""
    harness = tmp_path / "failing.py"
    harness.write_text(child("prompt", FAILING_PROMPT).source)
    cfg = {"model": "tiny-random", "run_dir": str(tmp_path / "run"), "harness": str(harness),
           "domain": {"difficulty": 2, "n_train": 8, "n_heldout": 4, "n_test": 4},
           "grpo": {"max_completion_length": 32, "num_generations": 2},
           "train": {"prompts_per_step": 2, "eval_max_new_tokens": 4},
           "evolution": {"population_size": 2, "children_per_generation": 2, "generations": 2,
                         "steps_per_generation": 1, "operators": {"knobs": 1.0}, "user_skills": False}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["run", str(path)]) == 0
    meta = VersionDir(tmp_path / "run" / "versions" / "v0000").meta()
    assert meta.status == "rejected"
    assert "harness failed in training" in meta.decision["reasons"][0]
    assert "this prompt hook always fails" in meta.decision["reasons"][0]
