"""Re-running a recorded version: train it again from what the run kept, and compare with the record.

``rerun_version(run_dir, vid)`` rebuilds what version ``vid`` was trained from (the run's
``config.json``, the version's ``genome.py``, its generation and so its step numbers, tasks and
seeds, and the adapter it started from), trains it the same steps (its record's, else ``evolution.steps_per_generation``)
through the loop's own stages (``training.train_versions``, ``training.verify_versions``) in a
new directory, and compares the new record with the recorded one, quantity by quantity
(``loop/tools/version_compare.py``).

The run is read-only input: the rerun writes only into its own directory (by default
``RUN_DIR/reruns/<vid>-<n>``, a new ``n`` each time) and its own MLflow store there.

The weights a version started from: a version's directory holds its adapter *after* training; it
started from a copy of its first parent's adapter (``versions.new_version``,
``BranchTraining.start_from_parent``). Versions are immutable once trained: a parent that lives on
does so as a new version (a continuation), so the parent's ``adapter/`` (with ``optimizer.pt`` under
``train.carry_optimizer``) is still the one the child copied. Its file times are checked against the
child's creation time; a folder written later is reported, not trusted. A seed version (no parent)
started from a fresh LoRA adapter that the run never saved (B = 0, A drawn from the process's torch
RNG); the rerun draws it as a new process does and says that this start is not a recorded one.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from evotrainer.config import parse_config
from evotrainer.loop.stages.training import StandaloneContext, train_versions, verify_versions
from evotrainer.loop.tools.version_compare import ATOL, RTOL, Comparison, compare_versions
from evotrainer.records import run_dir as rundir
from evotrainer.records.run_dir import RunDirError
from evotrainer.records.version import BranchVersion, Status, VersionDir, read_json, write_atomic
from evotrainer.tracking.lineage import TAG, LineageTracker
from evotrainer.tracking.view import NOTE, local_experiment_id

RERUNS = "reruns"                       # RUN_DIR/reruns/<vid>-<n>: the default home of reruns
RERUN_FILE = "rerun.json"               # the rerun's provenance and comparison, in its directory
COPIED = ("genome.py", "intervention.json", "diff.patch")   # what the rerun's version dir starts with


@dataclass
class RerunResult:
    version_id: str
    run_dir: Path
    out_dir: Path
    start: dict[str, Any]               # where the starting weights came from, and whether they are the recorded ones
    comparisons: list[Comparison] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    mlflow_run_id: str | None = None
    recorded_run_id: str | None = None  # the version's MLflow run in the original run's store

    @property
    def version_dir(self) -> Path:
        return self.out_dir / "versions" / self.version_id

    @property
    def matched(self) -> bool:
        return all(c.matches for c in self.comparisons)

    @property
    def verdict(self) -> str:
        if not self.matched:
            return "differs"
        return "exact" if all(c.verdict == "exact" for c in self.comparisons) else "within tolerance"

    def to_dict(self) -> dict[str, Any]:
        return {"version_id": self.version_id, "run_dir": str(self.run_dir), "out_dir": str(self.out_dir),
                "verdict": self.verdict, "start": self.start, "environment": self.environment,
                "recorded_run_id": self.recorded_run_id, "mlflow_run_id": self.mlflow_run_id,
                "tolerance": {"rtol": RTOL, "atol": ATOL}, "comparisons": [asdict(c) for c in self.comparisons]}


class RerunError(RuntimeError):
    """A version that trained in its run failed when trained again (its harness, most often)."""


def rerun_version(run_dir: str | Path, version_id: str, out_dir: str | Path | None = None,
                  say: Callable[[str], None] = lambda msg: None, tracking_uri: str | None = None) -> RerunResult:
    """Trains version ``version_id`` of the run in ``run_dir`` again into a new directory and
    compares it with the record (see the module docstring). Raises RunDirError for a directory that
    is not a run, an unknown or never-trained version, or an output directory that cannot be used."""
    run_dir = rundir.require(run_dir, "run").resolve()
    cfg_path = run_dir / "config.json"
    if not cfg_path.is_file():
        raise RunDirError(f"{run_dir} holds no config.json: the run's configuration is lost, so no version "
                          "of it can be trained again")
    cfg = parse_config(read_json(cfg_path, "the run's configuration"), str(cfg_path))
    recorded = _recorded_version(run_dir, version_id)
    start = starting_weights(run_dir, recorded)
    out = _claim_out(run_dir, version_id, out_dir)
    cfg = cfg.model_copy(update={"run_dir": str(out)})   # nothing below may write under the original
    with rundir.acquire(out, "evotrainer rerun"):
        _prepare(run_dir / "versions" / version_id, out / "versions" / version_id, recorded)
        # The rerun's version lives in the rerun's directory; every other version (the parent) is read
        # from the original run, which nothing here writes.
        ctx = StandaloneContext(cfg, say=say, vdir=lambda vid: VersionDir(
            (out if vid == version_id else run_dir) / "versions" / vid))
        say(f"training {version_id} again: {recorded.steps or cfg.evolution.steps_per_generation} steps from {start['source']}")
        if not train_versions(ctx, [version_id]):
            why = "; ".join((ctx.vdir(version_id).meta().decision or {}).get("reasons", [])) or "unknown"
            raise RerunError(f"{version_id} trained once but not again ({why}); the rerun's record is in {out}")
        say(f"verifying {version_id} on {len(ctx.runtime.heldout_tasks)} held-out tasks")
        verify_versions(ctx, [version_id])
        rows = compare_versions(VersionDir(run_dir / "versions" / version_id), ctx.vdir(version_id))
        env = {"engine": ctx.runtime.engine_name, "device": str(ctx.runtime.policy.device), "torch": torch.__version__,
               "threads": torch.get_num_threads()}
        result = RerunResult(version_id, run_dir, out, start, rows, env,
                             recorded_run_id=recorded_run_id(run_dir, version_id))
        write_atomic(out / RERUN_FILE, _json(result.to_dict()))   # kept even if MLflow then fails
        result.mlflow_run_id = _record(result, tracking_uri, say)
        write_atomic(out / RERUN_FILE, _json(result.to_dict()))
    return result


# ---- inputs ------------------------------------------------------------------------------------
def _recorded_version(run_dir: Path, vid: str) -> BranchVersion:
    vdir = run_dir / "versions" / vid
    if not (vdir / "meta.json").is_file() or Path(vid).name != vid:
        known = sorted(p.parent.name for p in (run_dir / "versions").glob("*/meta.json"))
        raise RunDirError(f"{run_dir} has no version {vid!r}; its versions: {', '.join(known) or 'none'}")
    meta = VersionDir(vdir).meta()
    if not VersionDir(vdir).steps() or meta.heldout_accuracy is None:
        raise RunDirError(f"{vid} was never trained and verified (status {meta.status}): there is no record to "
                          "compare a rerun with; rerun a version that has steps.jsonl and a held-out accuracy")
    if not (vdir / "genome.py").is_file():
        raise RunDirError(f"{vdir / 'genome.py'} is missing: the harness {vid} trained under is lost")
    return meta


def starting_weights(run_dir: Path, meta: BranchVersion) -> dict[str, Any]:
    """Where ``meta``'s training started: its first parent's adapter (checked unchanged since the
    version was created) or, for a seed, a fresh adapter the run never recorded."""
    if not meta.parents:
        return {"source": "a fresh LoRA adapter", "recorded": False,
                "note": "a seed version starts from a fresh adapter (B = 0, A drawn from torch's RNG in the process "
                        "that trained it); the run does not save it, so the rerun draws it as a new process does: "
                        "the comparison shows whether that was the same start"}
    pid = meta.parents[0]
    src = run_dir / "versions" / pid / "adapter"
    if not (src / "adapter_config.json").is_file():
        raise RunDirError(f"{meta.id}'s parent {pid} holds no adapter ({src}): the weights {meta.id} started from "
                          "are lost, so it cannot be trained again")
    newest = max(p.stat().st_mtime for p in src.rglob("*") if p.is_file())
    start = {"source": f"{pid}'s adapter", "path": str(src), "parent": pid}
    if newest <= meta.created:
        return {**start, "recorded": True,
                "note": f"{pid}'s adapter (and optimizer state, if carried) is unchanged since {meta.id} copied it: "
                        f"its files are older than {meta.id}'s record"}
    return {**start, "recorded": False,
            "note": f"{src} was written after {meta.id} was created ({time.ctime(newest)} > {time.ctime(meta.created)}; "
                    "a copy that did not keep file times, or a changed folder): the weights it started from cannot be "
                    "confirmed, so a difference may come from the start"}


def _claim_out(run_dir: Path, vid: str, out: str | Path | None) -> Path:
    """A new directory for this rerun: RUN_DIR/reruns/<vid>-<n> (n one more than the last), or ``out``
    (new or empty, outside the run except under its reruns/)."""
    if out is None:
        root = run_dir / RERUNS
        root.mkdir(exist_ok=True)
        taken = [int(m.group(1)) for p in root.iterdir() if (m := re.fullmatch(rf"{re.escape(vid)}-(\d+)", p.name))]
        n = max(taken, default=0) + 1
        while True:     # mkdir is the claim: two reruns started together never share a directory
            try:
                (root / f"{vid}-{n}").mkdir()
                return root / f"{vid}-{n}"
            except FileExistsError:
                n += 1
    out = Path(out).resolve()
    if (out == run_dir or run_dir in out.parents) and (run_dir / RERUNS) not in out.parents:
        raise RunDirError(f"--out {out} lies inside the run {run_dir}, which a rerun never writes; choose a "
                          f"directory outside it (or leave --out out: {run_dir / RERUNS}/{vid}-<n>)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RunDirError(f"--out {out} already exists and is not empty: a rerun never writes over another "
                          "record; choose a new directory")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _prepare(src: Path, dst: Path, recorded: BranchVersion) -> None:
    """The version as it was before its training: its genome and intervention, status pending."""
    dst.mkdir(parents=True)
    for name in COPIED:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    VersionDir(dst).save_meta(BranchVersion(
        id=recorded.id, base_model=recorded.base_model, genome_hash=recorded.genome_hash, parents=list(recorded.parents),
        intervention=recorded.intervention, status=Status.PENDING, generation=recorded.generation,
        operator=recorded.operator, factor=recorded.factor, knobs=dict(recorded.knobs),
        steps=recorded.steps, first_step=recorded.first_step))   # a probe trains its own steps again


# ---- MLflow --------------------------------------------------------------------------------------
def recorded_run_id(run_dir: Path, vid: str) -> str | None:
    """The version's MLflow run in the run's own store, read-only (opening it through MLflow could
    migrate it); None when it was never recorded."""
    eid = local_experiment_id(run_dir)
    if eid is None:
        return None
    db = (run_dir / "mlflow.db").resolve()
    try:
        with contextlib.closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)) as con:
            row = con.execute("SELECT r.run_uuid FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid WHERE "
                              "r.experiment_id = ? AND r.lifecycle_stage = 'active' AND t.key = ? AND t.value = ?",
                              (eid, "evotrainer.version_id", vid)).fetchone()
    except sqlite3.Error:
        return None
    return row[0] if row else None


def _record(result: RerunResult, tracking_uri: str | None, say: Callable[[str], None]) -> str:
    """The rerun as an MLflow run in the rerun's own store (or ``tracking_uri``), tagged with the
    version and the MLflow run it reran, with the comparison as its description and artifact."""
    tracker = LineageTracker(result.out_dir, experiment_name=f"evotrainer:{result.run_dir.name}:reruns",
                             tracking_uri=tracking_uri, say=say)
    run_id = tracker.record(result.version_dir)
    tracker.client.update_run(run_id, name=f"rerun of {result.version_id} ({result.out_dir.name}) · {result.verdict}")
    tags = {TAG + "rerun_of": result.version_id, TAG + "rerun_of_run": result.recorded_run_id or "not recorded",
            TAG + "rerun_of_run_dir": str(result.run_dir), TAG + "rerun": result.verdict,
            TAG + "rerun_start": result.start["source"] + ("" if result.start["recorded"] else " (not recorded)"),
            NOTE: rerun_markdown(result)}
    for key, value in tags.items():
        tracker.client.set_tag(run_id, key, value)
    tracker.client.log_dict(run_id, result.to_dict(), RERUN_FILE)
    return run_id


def rerun_markdown(result: RerunResult) -> str:
    lines = [f"Rerun of **{result.version_id}** of `{result.run_dir}`"
             + (f" (MLflow run `{result.recorded_run_id}` there)" if result.recorded_run_id else "")
             + f": **{result.verdict}**.", f"- start: {result.start['note']}", "",
             "| quantity | kind | recorded | rerun | verdict | max abs diff |", "|---|---|---|---|---|---|"]
    for c in result.comparisons:
        diff = "" if c.max_abs_diff is None else f"{c.max_abs_diff:.3g}"
        lines.append(f"| {c.name} | {c.kind} | {c.recorded} | {c.rerun} | {c.verdict} | {diff} |")
    return "\n".join(lines)


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, default=str)
