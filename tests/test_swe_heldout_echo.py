"""The held-out echo trap reaches the library: the engine measures repeated calls on either split, and
the entries that answer the trap (a repeat penalty, credit for progress) fire when the greedy held-out
episodes make well-formed calls that repeat and go nowhere, even while the sampled training episodes'
calls are still malformed (what the last SWE picks did: the issue's file read four times)."""

from evotrainer.fitness.episodes import episode_metrics, repeated_calls
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.seed import DOMAIN_HARNESSES
from evotrainer.operators.evidence import Evidence
from evotrainer.operators.library import LibraryOperator, seed_skills
from evotrainer.records.rollout import Rollout

READ = {"name": "read_file", "args": {"path": "pkg/mod.py", "start": 1, "end": 40}, "error": None}


def episode(calls, split="heldout"):
    return Rollout(task_id="t", messages=[], completion="", split=split, turns=len(calls), tool_calls=calls,
                   episode={"submitted": False})


def test_repeated_calls_count_exact_repeats_only():
    other = {**READ, "args": {"path": "pkg/mod.py", "start": 41, "end": 80}}
    assert repeated_calls(episode([READ, READ, other, READ])) == 2
    m = episode_metrics([episode([READ] * 4), episode([READ, other])], "heldout_")
    assert m["heldout_repeat_call_rate"] == 3 / 6 and m["heldout_valid_call_rate"] == 1.0


# The seed-report shape of an SWE pick caught in the trap: malformed sampled calls in training (nothing
# repeats there, nothing progresses), well-formed greedy held-out calls that reread one file.
TRAPPED = {"turns_mean": 4.0, "tool_calls_mean": 4.0, "malformed_call_rate": 0.7, "tool_failure_rate": 0.7,
           "repeat_call_rate": 0.0, "dead_group_ratio": 1.0, "correct_rate": 0.0,
           "train_valid_call_rate": 0.3, "train_progress_rate": 0.0, "train_repeat_call_rate": 0.0,
           "heldout_valid_call_rate": 1.0, "heldout_progress_rate": 0.0, "heldout_repeat_call_rate": 0.75}


def fired(metrics):
    program = HarnessProgram.from_file(DOMAIN_HARNESSES["swe"])
    found, _ = LibraryOperator(seed=0).applicable(program, Evidence(health_report={"metrics": metrics}))
    return {a.entry.id for a in found}


def test_the_held_out_trap_fires_the_entries_that_answer_it():
    assert {"swe_repeat_penalty", "swe_progress_credit"} <= fired(TRAPPED)
    calm = {**TRAPPED, "heldout_valid_call_rate": 0.2, "heldout_repeat_call_rate": 0.0}
    assert not {"swe_repeat_penalty", "swe_progress_credit"} & fired(calm)


def test_seed_skills_keep_one_id_per_trigger():
    ids = [s["id"] for s in seed_skills()]
    assert len(ids) == len(set(ids))
    assert {"library-swe_progress_credit", "library-swe_progress_credit-or",
            "library-swe_progress_credit-or2"} <= set(ids)
