"""A branch version's cache as fitness sees it: rollouts, genome, and the engine's own task data.

Health reports, backtests and gates all judge a version from what it left on disk. The engine's
task data (answers, which train prompts carry a planted leak) is rebuilt from the version's
``config.json`` with the same domain constructor training used; a harness never sees it. A version
without a config (e.g. written by hand) still loads: leak detection then reads the planted
``(Reference note: N)`` text in the prompt, and correctness falls back to the stored verdicts.

Also the small numeric helpers every fitness module shares (population std, dead groups, ...), so
that "dead group" means exactly one thing across reports, backtests and gates.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evotrainer.branch import BranchVersion, VersionDir
from evotrainer.domains.task import Task
from evotrainer.genome.program import HarnessProgram, reference_program
from evotrainer.rollout import Rollout
from evotrainer.numeric import finite_or_none  # noqa: F401 - re-exported for fitness modules

log = logging.getLogger(__name__)
DEAD_STD = 1e-6                      # a group whose reward std is below this carries no signal
_LEAK_RE = re.compile(r"\(Reference note:\s*([^)]*)\)")   # evotrainer.domains.math_tasks.LEAK_TEMPLATE


# ---- numeric helpers ------------------------------------------------------------------------------
def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def pstd(xs: Sequence[float]) -> float:
    """Population std, what GRPO normalises by (0 for fewer than two values)."""
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def percentile(xs: Sequence[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def is_dead(rewards: Sequence[float]) -> bool:
    return pstd(rewards) < DEAD_STD



def outcome(r: Rollout) -> bool:
    """The engine's verdict of a rollout: hidden verification for held-out, the verifier's for train."""
    return bool((r.hidden or r.visible).get("correct"))


def number_in(answer: str, text: str) -> bool:
    """Whether ``answer`` appears in ``text`` as a whole number/token (so '7' does not match '17')."""
    answer = answer.strip()
    if not answer:
        return False
    return re.search(r"(?<![\w.])" + re.escape(answer) + r"(?![\w]|\.\d)", text) is not None


def copied(answer: str | None, r: Rollout) -> bool:
    """Whether a train rollout gave ``answer`` (shown in its prompt, or the task's own): it wrote the
    number, or the verifier found it correct. What the leak check counts as copying."""
    return (answer is not None and number_in(answer, r.completion)) or bool(r.visible.get("correct"))


# ---- a version on disk ----------------------------------------------------------------------------
@dataclass
class CachedVersion:
    path: Path
    meta: BranchVersion | None
    program: HarnessProgram
    train: list[Rollout]
    heldout: list[Rollout]
    heldout_base: list[Rollout]
    tasks: dict[str, Task] = field(default_factory=dict)   # the engine's tasks by id ({} without a config)
    domain: Any = None

    @classmethod
    def load(cls, path: str | Path) -> CachedVersion:
        vd = VersionDir(path)
        if not vd.path.is_dir():
            raise FileNotFoundError(f"{path} is not a directory")
        meta = vd.meta() if (vd.path / "meta.json").is_file() else None
        genome = vd.path / "genome.py"
        program = HarnessProgram(genome.read_text(), name="genome.py") if genome.is_file() else reference_program()
        domain, tasks = _domain_of(vd.path)
        return cls(vd.path, meta, program, vd.rollouts("train"), vd.rollouts("heldout"), vd.rollouts("heldout_base"),
                   tasks, domain)

    @property
    def name(self) -> str:
        return self.path.name

    def task_for(self, r: Rollout) -> Task | dict[str, Any]:
        """The task of a rollout for a harness's ``reward`` hook (the facade strips answer/hidden)."""
        task = self.tasks.get(r.task_id)
        if task is not None:
            return task
        prompt = r.messages[-1]["content"] if r.messages else ""
        leak = self.leak_of(r)
        return {"id": r.task_id, "prompt": prompt, "split": r.split, "domain": "", "difficulty": 0,
                "visible": {"leak": leak} if leak is not None else {}}

    def leak_of(self, r: Rollout) -> str | None:
        """The leaked answer a rollout's prompt carried, or None for a clean prompt."""
        task = self.tasks.get(r.task_id)
        if task is not None:
            return str(task.answer) if task.hidden.get("leaked") else None
        text = " ".join(m.get("content", "") for m in r.messages if m.get("role") == "user")
        m = _LEAK_RE.search(text)
        return m.group(1).strip() if m else None

    def answer_of(self, r: Rollout) -> str | None:
        task = self.tasks.get(r.task_id)
        return str(task.answer) if task is not None else self.leak_of(r)


def _domain_of(path: Path) -> tuple[Any, dict[str, Task]]:
    """The domain and tasks a version trained on, rebuilt from its config.json, or from the run's
    (``RUN_DIR/versions/VID``: the loop keeps one config per run); (None, {}) if there is none."""
    cfg_path = path / "config.json"
    if not cfg_path.is_file() and path.resolve().parent.name == "versions":
        cfg_path = path.resolve().parent.parent / "config.json"
    if not cfg_path.is_file():
        return None, {}
    text = cfg_path.read_text()
    if text not in _DOMAINS:  # every version of a run shares one config: build its tasks once
        _DOMAINS.clear()
        _DOMAINS[text] = _build_domain(text, cfg_path, path)
    return _DOMAINS[text]


_DOMAINS: dict[str, tuple[Any, dict[str, Task]]] = {}


def _build_domain(text: str, cfg_path: Path, path: Path) -> tuple[Any, dict[str, Task]]:
    from evotrainer.config import parse_config
    from evotrainer.domains import get_domain

    try:
        d = parse_config(json.loads(text), str(cfg_path)).domain
        domain = get_domain(d.name, n_train=d.n_train, n_heldout=d.n_heldout, n_test=d.n_test,
                            difficulty=d.difficulty, seed=d.seed, leak_share=d.leak_share, files=d.files)
    except (ValueError, OSError) as e:  # e.g. task files moved: judge from the cache alone
        log.warning("%s: cannot rebuild the domain (%s); engine checks that need it are not judged", path, e)
        return None, {}
    tasks = {t.id: t for split in ("train", "heldout", "test") for t in domain.tasks(split)}
    return domain, tasks


def write_version(path: str | Path, train: Sequence[Rollout] = (), heldout: Sequence[Rollout] = (),
                  heldout_base: Sequence[Rollout] = (), genome: str | None = None, version_id: str = "v0",
                  base_model: str = "constructed") -> Path:
    """Writes a version dir from given rollouts (constructed scenarios and tests; no config.json, so
    checks that need the engine's task data report "not judged")."""
    vd = VersionDir(path)
    program = HarnessProgram(genome) if genome is not None else reference_program()
    vd.save_genome(program.source)
    for split, rs in (("train", train), ("heldout", heldout), ("heldout_base", heldout_base)):
        vd.save_rollouts(split, rs)
    vd.save_meta(BranchVersion(id=version_id, base_model=base_model, genome_hash=program.hash))
    return vd.path
