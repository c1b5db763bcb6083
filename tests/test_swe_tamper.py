"""The tamper check on SWE episodes (fitness/validity.py): it re-verifies what the engine graded, an
episode's handed-in patch, so an honest fix is not called an edited cache, and an edited verdict still is."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evotrainer.domains.code.executor import ExecLimits
from evotrainer.domains.swe.domain import SWEDomain
from evotrainer.domains.swe.environment import EnvLimits
from evotrainer.domains.swe.episode import run_episode
from evotrainer.domains.swe.scripted import Scripted, honest
from evotrainer.fitness.cache import CachedVersion
from evotrainer.fitness.gates import GateConfig
from evotrainer.fitness.validity import engine_checks
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.seed import DOMAIN_HARNESSES
from evotrainer.records.rollout import Rollout

SWE = HarnessProgram.from_file(DOMAIN_HARNESSES["swe"])


@pytest.fixture(scope="module")
def swe():
    d = SWEDomain(n_train=1, n_heldout=2, n_test=1, difficulty=1, seed=0, workers=1, limits=ExecLimits(timeout_s=2.0))
    yield d
    d.close()


def test_the_tamper_check_regrades_an_episodes_patch_not_its_last_turn(swe):
    """The engine grades an episode's submitted patch and keeps the last turn's text as its completion
    (``policy/episodes.py``). Re-grading that text called every episode that handed a patch in
    unresolved and unformatted, and so its version tampered with: a resolving branch was never promoted."""
    held = []
    for t in swe.tasks("heldout"):
        ep = run_episode(t, Scripted(honest), swe.environment(t, EnvLimits(max_turns=400)))
        assert ep["patch"] and ep["submitted"]
        held.append(Rollout(task_id=t.id, messages=ep["messages"][:2], completion=ep["turns"][-1]["text"],
                            turns=ep["n_turns"], tool_calls=ep["tool_calls"], turn_log=ep["turns"], split="heldout",
                            episode={"patch": ep["patch"], "submitted": True}, hidden=swe.verify(t, ep["patch"])))
    assert all(r.hidden["format_ok"] for r in held)

    def tamper():
        v = CachedVersion(path=None, meta=None, program=SWE, train=[], heldout=held, heldout_base=[], domain=swe,
                          tasks={t.id: t for s in ("train", "heldout", "test") for t in swe.tasks(s)})
        return next(c for c in engine_checks(v, SimpleNamespace(engine={}), GateConfig()) if c.name == "tamper")

    check = tamper()
    assert check.passed and check.numbers["reverified"] == 2, check.message
    held[0].hidden = {**held[0].hidden, "correct": not held[0].hidden["correct"]}   # an edited verdict
    check = tamper()
    assert not check.passed and check.numbers["mismatches"] == 1, check.message
