"""Creating a branch version: a pending directory with its parent's adapter copied (copy-on-write),
the genome it will train under and the intervention that made it."""

from __future__ import annotations

import json
import shutil
from typing import TYPE_CHECKING, Any

from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.crash import crash_point
from evotrainer.loop.stages.probes import first_step, generation_steps
from evotrainer.records.run_dir import RunDirError
from evotrainer.records.version import BranchVersion, Status, write_atomic

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment



def new_version(exp: Experiment, parent: BranchVersion | None, source: str, generation: int, *, operator: str | None = None,
                factor: str | None = None, intervention: dict[str, Any] | None = None,
                extra_parents: list[str] = (), status: Status = Status.PENDING) -> str:
    """A pending version: the parent's adapter copied (copy-on-write), the genome to train under.

    The caller saves the run state (which holds ``next_id``) after this returns. A process killed in
    between leaves a directory under an id the saved state never allocated; the resumed run allocates
    that id again, so whatever is there is a leftover and is cleared first (a continuation must not
    inherit a crashed child's intervention.json or backtest.json)."""
    vid = exp.state.new_id()
    vd = exp.vdir(vid)
    if vd.path.exists():
        _clear_leftover(exp, vid)
    vd.path.mkdir(parents=True)
    if parent is not None:
        src = exp.vdir(parent.id).adapter_dir
        shutil.rmtree(vd.adapter_dir, ignore_errors=True)
        shutil.copytree(src, vd.adapter_dir)
    vd.save_genome(source)
    if intervention is not None:
        write_atomic(vd.path / "intervention.json", json.dumps(intervention, indent=2, default=str))
        write_atomic(vd.path / "diff.patch", intervention.get("diff", ""))
    program = HarnessProgram(source)
    vd.save_meta(BranchVersion(
        id=vid, base_model=exp.cfg.model, genome_hash=program.hash,
        parents=([parent.id] if parent else []) + list(extra_parents), intervention=intervention,
        status=status, generation=generation, operator=operator, factor=factor, knobs=program.knob_values,
        steps=generation_steps(exp.cfg, exp.state.exploit_from, generation),
        first_step=first_step(exp.cfg, exp.state.exploit_from, generation),
    ))
    crash_point("version:created")
    return vid


def _clear_leftover(exp: Experiment, vid: str) -> None:
    """Clears a directory under an id the saved state never allocated: what a process killed while
    creating it left. One that got further than ``pending`` was recorded, so the state is older
    than the run's versions (restored from a backup?) and nothing is deleted."""
    vd = exp.vdir(vid)
    status = vd.meta().status if (vd.path / "meta.json").is_file() else None
    if status not in (None, Status.PENDING, Status.AWAITING_APPROVAL):   # what new_version itself writes
        raise RunDirError(f"{vd.path} holds a recorded version ({status}) that state.json says was never "
                          f"created (its next id is {vid}): the state is older than the run's versions; restore "
                          "the state.json that goes with them, or start the run again in a new --run-dir")
    shutil.rmtree(vd.path)
    exp.say(f"{vid}: cleared what a process that died while creating it left ({status or 'no meta.json'})")
