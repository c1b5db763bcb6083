"""The co-evolution loop: a population of LoRA branches co-evolving with their harnesses.

One generation in the five stages of ``records/run_state.py::STAGES`` (docs/concepts/one-generation.md):

    train live versions k steps → verify on held-out (and write the health reports) → gate children
    against their control siblings (and record every version) → select survivors (and revert
    regressions) → propose children (operators + backtest) and continue survivors → next generation

State is saved after every stage and every version, so ``resume`` after ``kill -9`` repeats no
finished work and duplicates nothing (stages are idempotent; MLflow records are keyed by version).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Callable

from rich.console import Console

from evotrainer.config import Config, parse_config
from evotrainer.fitness.gate_config import gate_config
from evotrainer.fitness.labels import LabelStore
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.budgets import BudgetReached, Budgets
from evotrainer.loop.stages.continuations import continue_survivors
from evotrainer.loop.crash import crash_point
from evotrainer.loop.stages.diversity import version_cell
from evotrainer.loop.compute.executor import Executor, build_executor
from evotrainer.loop.stages.exploit import narrow_to_exploit, stuck_elite
from evotrainer.loop.stages.final_pick import report_test
from evotrainer.loop.human import human_gate
from evotrainer.loop.stages.gating import GateInputs, gate_version
from evotrainer.loop.stages.racing import race_child
from evotrainer.loop.knowledge.operator_mix import operator_mix
from evotrainer.loop.progress import NullProgress
from evotrainer.loop.stages.propose_stage import propose_children
from evotrainer.loop.stages.proposals import ProposalInputs, evidence_for
from evotrainer.loop.stages.revert import apply_revert, plan_reverts
from evotrainer.loop.run_versions import RunVersions
from evotrainer.loop.compute.runtime import Runtime
from evotrainer.loop.stages.selection import (Candidate, below_start, harness_evidence, lineage_stuck, rank_score,
                                               survivors as select_survivors)
from evotrainer.loop.knowledge.skills import SkillLibrary
from evotrainer.loop.stages.start import note_selection, verify_start
from evotrainer.loop.tools.summary import print_summary
from evotrainer.loop.seed import seed_program
from evotrainer.loop.tools.validate import validate_resources
from evotrainer.loop.versions import new_version
from evotrainer.records import run_dir as rundir
from evotrainer.records.history import RevertRecord, from_dict, to_dict
from evotrainer.records.run_state import STAGES, RunState, load_state, save_state
from evotrainer.records.version import SETTLED, Status, VersionDir, read_json, write_atomic
from evotrainer.tracking.lineage import LineageTracker


class Experiment:
    """A run: its config, its state on disk, what it spends (``budgets``) and the heavy parts it
    holds (``runtime``: tasks, model and branches, rollout engine); the stages act on it."""

    def __init__(self, cfg: Config, run_dir: str | Path | None = None, on_event: Callable[[str], None] | None = None,
                 progress: NullProgress | None = None, readonly: bool = False):
        self.cfg = cfg
        self.progress = progress or NullProgress()
        self.run_dir = Path(run_dir or cfg.run_dir)
        self.run_versions = RunVersions(self.run_dir / "versions")   # what the stages look versions up in
        self.on_event = on_event or (lambda msg: None)
        self.readonly = readonly
        self._lock = None
        if readonly:   # status and other readers: nothing is written, no lock is taken
            rundir.require(self.run_dir, "run")
            self.state = load_state(self.run_dir)
            human_gate.migrate(self.state, self.run_versions, write=False)   # a reader writes nothing
        else:
            self.state = self._open_for_writing()
        self._clock = time.monotonic()
        self.budgets = Budgets(cfg, self.state, persist=self._persist_spend)
        self.runtime = Runtime(cfg, self.budgets)

    def _open_for_writing(self) -> RunState:
        """Claims the run directory (refusing one that is not a run's), takes its lock, and loads the
        state, or starts a new run in a new (or empty) directory."""
        if not (self.run_dir / "state.json").is_file():   # a new run: its config is checked before anything is written
            self.validate()
        rundir.claim(self.run_dir, "run")
        self._lock = rundir.acquire(self.run_dir, "evotrainer run")
        if (self.run_dir / "state.json").is_file():
            state = load_state(self.run_dir)
            if human_gate.migrate(state, self.run_versions):   # a run from before the four points, once
                save_state(self.run_dir, state)
            return state
        if self.versions():   # a restart would overwrite v0000 and duplicate its MLflow runs
            raise rundir.RunDirError(
                f"{self.run_dir / 'state.json'} is missing but the run holds versions "
                f"({', '.join(self.versions()[:3])}...): it cannot be continued safely; restore state.json "
                "from a backup, or start the run again in a new --run-dir")
        write_atomic(self.run_dir / "config.json", self.cfg.model_dump_json(indent=2))
        return RunState()

    def validate(self) -> None:
        """Everything the config names is usable (once per process): before any compute."""
        if not getattr(self, "_validated", False):
            validate_resources(self.cfg, loop=True, say=self.on_event)
            self._validated = True

    def close(self) -> None:
        """Releases the run's lock (the process's exit releases it too)."""
        self.close_executor()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @classmethod
    def resume(cls, run_dir: str | Path, **kw) -> "Experiment":
        path = rundir.require(run_dir, "run") / "config.json"
        if not path.is_file():
            raise rundir.RunDirError(f"{run_dir} holds no config.json: the run's configuration is lost; "
                                       "start the run again in a new directory")
        return cls(parse_config(read_json(path, "the run's configuration"), str(path)), run_dir, **kw)

    # ---- the loop ---------------------------------------------------------------------------
    def run(self) -> RunState:
        s = self.state
        if s.status in ("finished", "stopped"):
            return s
        if s.status == "paused" and human_gate.pending(self):
            self.say(f"paused: {human_gate.pause_line(self, human_gate.pending(self))}")
            return s
        self.validate()   # what a resumed run names (data files, model folder) may have moved since
        s.status = "running"
        if not s.live and s.generation == 0 and s.next_id == 0:
            seed = self.seed_program()
            s.live = [new_version(self, None, seed.source, 0)]
            self.save()
        try:
            if s.start is None:
                verify_start(self)   # the untrained model's scores, before any training
            while s.generation < self.cfg.evolution.generations and s.status == "running":
                self.run_generation()
        except BudgetReached as e:
            s.status, s.stop_reason = "stopped", str(e)
            for vid in s.live:  # proposed but never trained: keep the record, mark why
                if self.vdir(vid).meta().status in (Status.PENDING, Status.AWAITING_APPROVAL):
                    self.prune_if_budget_spent(vid)
            self.say(f"stopping cleanly: {e}")
        finally:
            self.close_executor()   # the loop's training is over (or paused): workers and their models go
        if s.status == "running":
            s.status = "finished"
        self.finish()
        self.save()   # after finish, so the wall time (and its share for lineage and plots) is recorded
        return s

    def run_generation(self) -> None:
        """The five stages from where the state stands, each saved when done. Between two stages the
        human gate's checkpoint (``loop/human/human_gate.py``) may pause the run until a person decides:
        the stages themselves know nothing of people."""
        s, g = self.state, self.state.generation
        for stage in STAGES[STAGES.index(s.stage):]:
            if stage == "propose" and s.stop_reason:   # a budget ran out during this generation: now stop
                raise BudgetReached(s.stop_reason)
            if human_gate.checkpoint(self, stage, g):
                return
            getattr(self, f"{stage}_stage")(g)
            self.runtime.return_freed_memory()
            if stage != "propose":
                self.advance(STAGES[STAGES.index(stage) + 1])
        s.generation, s.stage = g + 1, "train"
        self.save()   # children awaiting a decision (design, backtest) pause before the next train stage

    def train_stage(self, g: int) -> None:
        self.progress.stage(f"gen {g}/{self.cfg.evolution.generations - 1} train", len(self.state.live))
        self.executor.train(self, list(self.state.live))

    def verify_stage(self, g: int) -> None:
        self.progress.stage(f"gen {g} verify", len(self.state.live))
        self.executor.verify(self, list(self.state.live))

    def gate_stage(self, g: int) -> None:
        """Each live version judged; with the completion point on, a child's effects (history, skills,
        operator credit) wait for the checkpoint before selection."""
        self.progress.stage(f"gen {g} gate", len(self.state.live))
        for vid in self.state.live:
            gate_version(self.gate_inputs(), vid, finish=not human_gate.defers(self, vid))
            self.record(vid)
            self.save()
            self.progress.advance()

    def propose_stage(self, g: int) -> None:
        if g + 1 < self.cfg.evolution.generations:
            self.continue_survivors(g + 1)
            if self.state.exploit_from is None:
                propose_children(self, human_gate.parents_for_children(self, g), g + 1)
            elif stuck := stuck_elite(self):
                self.say(f"gen {g + 1}: exploit phase: {stuck[0]}'s report raised {stuck[1]}; one child beside its "
                         "continuation, from the changes the alert names")
                propose_children(self, [stuck[0]], g + 1, wanted=1)

    def select_stage(self, g: int) -> None:
        """Selection and reverts are planned first and saved with the state (survivors, the reverts'
        history records, the versions to prune) in one write; then the plan is applied, idempotently.
        Pruning only after that save is what keeps a revert on resume: a pruned version is no candidate."""
        s = self.state
        plan = s.selection if s.selection and s.selection.get("generation") == g else None
        if plan is None:
            cands = self.candidates(self.generation_versions(g))
            survivors = select_survivors(cands, self.cfg.evolution.population_size, self.cfg.evolution.selection,
                                         self.cfg.evolution.elitism, self.cfg.evolution.tournament_size,
                                         seed=self.cfg.seed + g, min_cells=self.cfg.evolution.diversity.min_cells,
                                         say=lambda msg: self.say(f"gen {g}: {msg}"))
            if not cands:   # nothing of this generation was trained (a budget ran out before it):
                # the last survivors stand, or the run would end with none and no final pick
                survivors = [v for v in s.survivors if self.vdir(v).path.is_dir()]
                self.say(f"gen {g}: no version was trained; the survivors of the last selection stand")
            survivors = narrow_to_exploit(self, g, cands, survivors)
            reverts: list[RevertRecord] = []
            if self.cfg.evolution.revert:
                survivors, reverts = plan_reverts(self.run_versions, survivors, g, gate_config(self.cfg), self.say)
            note_selection(self, g, survivors)
            plan = {"generation": g, "survivors": survivors, "reverts": [to_dict(r) for r in reverts],
                    "prune": [c.version_id for c in cands if c.version_id not in survivors]}
            s.selection, s.survivors = plan, list(survivors)
            s.history.extend(reverts)
            self.save()
            crash_point("select:planned")
        for r in map(from_dict, plan["reverts"]):
            apply_revert(self.run_versions, r)
            self.say(f"gen {g}: {r.parent} regressed from {r.to}; reverting to it ({r.reason[:80]})")
        for vid in plan["prune"]:
            if self.vdir(vid).meta().status != Status.PRUNED:
                self.set_status(vid, Status.PRUNED)
                crash_point("select:pruned")
        self.say(f"gen {g}: survivors {', '.join(s.survivors) or 'none'}")
        s.live = []

    def prune_if_budget_spent(self, vid: str) -> bool:
        """True, with the untrained version pruned and its reason recorded, once a budget is spent (the
        generation then verifies, gates and records what it trained, and the run stops at its end);
        False, touching nothing, while ``vid`` may still train."""
        try:
            self.budgets.guard()
            return False
        except BudgetReached as e:
            self.state.stop_reason = str(e)
            vd = self.vdir(vid)
            meta = vd.meta()
            meta.status, meta.decision = Status.PRUNED, {"reasons": [f"not trained: {e}"]}
            vd.save_meta(meta)
            self.record(vid)
            self.say(f"{vid} not trained: {e}")
            return True

    def continue_survivors(self, generation: int) -> None:
        continue_survivors(self, generation)   # the controls of this generation's children (loop/stages/continuations.py)

    # ---- helpers the stages use -------------------------------------------------------------
    @functools.cached_property
    def executor(self) -> Executor:
        """Where train and verify run (``executor: local | ray``, ``loop/compute/executor.py``)."""
        return build_executor(self)

    def close_executor(self) -> None:
        if "executor" in self.__dict__:
            self.__dict__.pop("executor").close()

    def vdir(self, vid: str) -> VersionDir:
        return self.run_versions.vdir(vid)

    def versions(self) -> list[str]:
        return self.run_versions.ids()

    def generation_versions(self, generation: int) -> list[str]:
        return self.run_versions.of_generation(generation)

    def gate_inputs(self) -> GateInputs:
        """What the gate stage reads and changes of this run (``loop/stages/gating.py``)."""
        listeners = (self.skills, self.mix) if self.mix_loaded else (self.skills,)   # the mix: when built here
        race = functools.partial(race_child, self, self.run_versions) if self.cfg.evolution.race_cap else None
        return GateInputs(self.run_versions, gate_config(self.cfg), self.cfg.evolution.keep_ties, self.cfg.domain.name,
                          self.state.history, listeners, labels=self.labels, timed=self.budgets.timed, say=self.say,
                          race=race)

    def proposal_inputs(self) -> ProposalInputs:
        """What the propose stage reads and changes of this run (``loop/stages/proposals.py``)."""
        ev = self.cfg.evolution
        return ProposalInputs(self.run_versions, self.state, ev.backtest, tuple(ev.human_gate),
                              functools.partial(new_version, self), lambda: self.mix,
                              functools.partial(evidence_for, self), lambda: self.labels.cases(),
                              guard=self.budgets.guard, spend=self.budgets.spend, sync=self.sync_budgets,
                              save=self.save, say=self.say)

    def candidates(self, vids: list[str]) -> list[Candidate]:
        out = []
        start, bar = self.state.start, self.cfg.evolution.start_bar   # the untrained model's record, once scored
        for v in vids:
            cell = version_cell(self, v)   # every version's descriptor is recorded, settled or not
            m = self.vdir(v).meta()
            if m.status in SETTLED:
                # Ranked on the selection draw: the gate draw decided this version's promotion.
                stuck = lineage_stuck(v, self.vdir, self.run_versions.meta_or_none)
                below = below_start(m.metrics, start, bar)
                out.append(Candidate(v, rank_score(m.metrics), m.metrics.get("cost", 0.0), cell=cell, stuck=stuck,
                                     evidence=harness_evidence(v, self.run_versions.meta_or_none), below_start=below))
        return out

    def set_status(self, vid: str, status: str) -> None:
        vd = self.vdir(vid)
        meta = vd.meta()
        meta.status = status
        vd.save_meta(meta)
        self.record(vid)

    def seed_program(self) -> HarnessProgram:
        return seed_program(self.cfg)

    def advance(self, stage: str) -> None:
        self.state.stage = stage
        self.save()

    def _persist_spend(self) -> None:
        """An LLM call was reserved or charged: save its count now, not with the next stage."""
        if not self.readonly:
            self.save()

    def save(self) -> None:
        if self.readonly:
            raise RuntimeError("a read-only view of a run never saves it")
        now = time.monotonic()
        self.state.budget_used["wall_time_s"] += now - self._clock
        self._clock = now
        save_state(self.run_dir, self.state)

    # ---- operators, labels, skills, lineage ----------------------------------------------------
    @functools.cached_property
    def mix(self):
        return operator_mix(self.cfg, self.run_dir, self.budgets.llm, self.state.history, say=self.on_event)

    @property
    def mix_loaded(self) -> bool:
        """Whether operators were built in this process (their statistics are then current)."""
        return "mix" in self.__dict__

    def sync_budgets(self) -> None:
        self.budgets.sync_llm()
        if self.mix_loaded:
            self.state.operator_stats = self.mix.stats_dict()

    @functools.cached_property
    def labels(self) -> LabelStore:
        return LabelStore(self.run_dir / "labels.json")

    @functools.cached_property
    def skills(self) -> SkillLibrary:
        return SkillLibrary(self.run_dir / "skills.json", validate_after=self.cfg.evolution.skills_validate_after)

    @functools.cached_property
    def user_skills(self) -> SkillLibrary | None:
        """The user's skills from earlier experiments (read at the start of every run), or None."""
        if not self.cfg.evolution.user_skills:
            return None
        try:
            return SkillLibrary.user(validate_after=self.cfg.evolution.skills_validate_after)
        except (OSError, ValueError) as e:
            self.say(f"could not read the user skill library: {e}; proposing without it")
            return None

    @functools.cached_property
    def tracker(self) -> LineageTracker:
        return LineageTracker(self.run_dir, say=self.say)

    def record(self, vid: str) -> None:
        """MLflow run of a version (idempotent: keyed by version id, so resume makes no duplicates)."""
        with self.budgets.timed("record"):
            self.tracker.record(self.vdir(vid).path)

    def finish(self) -> None:
        if self.state.status in ("finished", "stopped"):   # not at a human-gate pause: the loop goes on
            with self.budgets.timed("test"):
                final = report_test(self)
            if final and "test_accuracy" in final:
                self.tracker.mark_final(final["version"], final)
        try:
            with self.budgets.timed("finish"):
                self.tracker.record_all()  # idempotent sweep: every version has its run, statuses current
                self.tracker.log_plots()
        except Exception as e:  # noqa: BLE001 - a plot failure must not lose a finished run
            self.say(f"could not log plots: {e}")
        if self.cfg.evolution.user_skills:
            try:
                self.skills.merge_into(SkillLibrary.user())
            except Exception as e:  # noqa: BLE001
                self.say(f"could not update the user skill library: {e}")

    def print_summary(self, console: Console | None = None) -> None:
        print_summary(self, console)

    def say(self, msg: str) -> None:
        self.state.log(msg)
        self.on_event(msg)

