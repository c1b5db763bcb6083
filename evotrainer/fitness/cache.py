"""A branch version's cache as fitness sees it: rollouts, genome, and the engine's own task data.

Health reports, backtests and gates all judge a version from what it left on disk. The engine's
task data (answers, which train prompts carry a planted leak) is rebuilt from the version's
``config.json`` with the same domain constructor training used; a harness never sees it. A version
without a config (e.g. written by hand) still loads: leak detection then reads the planted
``(Reference note: N)`` text in the prompt, and correctness falls back to the stored verdicts.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evotrainer.config import parse_config
from evotrainer.domains import build_domain, planted_leak
from evotrainer.domains.task import Task
from evotrainer.genome.program import HarnessProgram, reference_program
from evotrainer.records.rollout import Rollout
from evotrainer.records.version import BranchVersion, VersionDir

log = logging.getLogger(__name__)


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
    engine_violations: list[str] = field(default_factory=list)   # what the engine caught while it trained

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
                   tasks, domain, vd.engine_violations())

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
        """The leaked answer a rollout's prompt carried, or None for a clean prompt. An SWE repository
        whose history holds the fix (``visible["leaky"]``) leaks its answer, the fix, to an episode
        that reads the history."""
        task = self.tasks.get(r.task_id)
        if task is not None:
            return str(task.answer) if task.hidden.get("leaked") or task.visible.get("leaky") else None
        text = " ".join(m.get("content", "") for m in r.messages if m.get("role") == "user")
        return planted_leak(text)

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
    try:
        domain = build_domain(parse_config(json.loads(text), str(cfg_path)).domain)
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
