"""The stages of one generation, each on one branch version and each idempotent.

A stage reads a version's status from its directory and does nothing if its work is already
recorded there, so a resumed run repeats no finished work. Statuses move
pending → trained → verified → kept | promoted | rejected | invalid, and pruned when selection
drops a version. ``exp`` is the :class:`~evotrainer.experiment.Experiment` holding the resources.
"""

from __future__ import annotations

import json
import shutil
import time
from typing import Any

import torch

from evotrainer.branch import BranchVersion, write_atomic
from evotrainer.collect import sample_tasks, verify
from evotrainer.genome.errors import GenomeError
from evotrainer.genome.harness import Harness
from evotrainer.genome.program import HarnessProgram
from evotrainer.genome.sandbox import SandboxError
from evotrainer.policy.grpo import GRPOTrainer
from evotrainer.train import grpo_config, train_step

SETTLED = ("kept", "promoted")          # statuses of versions that may live on
OPTIMIZER_FILE = "optimizer.pt"        # AdamW state saved beside the adapter (train.carry_optimizer)


def train_version(exp, vid: str) -> None:
    """Trains a pending version k steps from its (copied) parent adapter under its own harness."""
    vd = exp.vdir(vid)
    meta = vd.meta()
    if meta.status != "pending":
        return
    cfg, k = exp.cfg, exp.cfg.evolution.steps_per_generation
    program = HarnessProgram(vd.genome_source(), name=f"{vid}/genome.py")
    (vd.path / "steps.jsonl").unlink(missing_ok=True)  # a crash mid-training restarts it from the copy
    exp.load_adapter(vid)
    rollouts, t0 = [], time.perf_counter()
    try:
        with Harness(program, sandbox=cfg.sandbox) as harness:
            grpo = grpo_config(harness, cfg.grpo.model_dump())
            trainer = GRPOTrainer(exp.policy, vid, grpo)
            inherited = vd.adapter_dir / OPTIMIZER_FILE   # copied with the parent's adapter
            if cfg.train.carry_optimizer and inherited.is_file():
                trainer.load_optimizer_state(torch.load(inherited, weights_only=True))
            exp.progress.steps(f"{vid} GRPO steps", k)
            for i in range(k):
                # Common random numbers: siblings of one generation see the same tasks and seeds,
                # so a child and its control differ only in the harness.
                step = meta.generation * k + i
                tasks = sample_tasks(exp.train_tasks, cfg.train.prompts_per_step, step, cfg.seed)
                step_rollouts, metrics = train_step(exp.policy, exp.engine, trainer, harness, exp.domain, tasks,
                                                    vid, step, cfg.seed)
                rollouts += step_rollouts
                vd.append_step(metrics)
                exp.progress.step()
                exp.spend(train_steps=1, rollout_tokens=sum(r.num_tokens for r in step_rollouts),
                          gen_seconds=metrics["gen_seconds"], train_seconds=metrics["train_seconds"])
            meta.knobs = harness.knob_values
    except (SandboxError, GenomeError, ValueError) as e:
        # The harness failed at run time: the engine records it and carries on with the others.
        meta.status, meta.decision = "rejected", {"reasons": [f"harness failed in training: {e}"]}
        vd.save_meta(meta)
        exp.unload_adapter(vid)
        return
    with exp.timed("adapter"):
        tmp = vd.path / "adapter.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        exp.policy.save(vid, tmp)
        if cfg.train.carry_optimizer:
            torch.save(trainer.optimizer_state(), tmp / OPTIMIZER_FILE)
        shutil.rmtree(vd.adapter_dir, ignore_errors=True)
        tmp.rename(vd.adapter_dir)
    vd.save_rollouts("train", rollouts)
    meta.metrics.update(train_seconds=time.perf_counter() - t0)
    meta.status = "trained"
    vd.save_meta(meta)
    # The adapter stays loaded: verification comes next and would otherwise read it back from disk.


def verify_version(exp, vid: str) -> None:
    """Held-out verification by the engine (hidden outcomes) and the version's health report."""
    from evotrainer.fitness.health import health_report

    vd = exp.vdir(vid)
    meta = vd.meta()
    if meta.status != "trained":
        return
    tc = exp.cfg.train
    exp.load_adapter(vid)
    exp.policy.check_adapter_applied(vid)
    t0 = time.perf_counter()
    heldout = verify(exp.engine, exp.domain, exp.heldout_tasks, vid, max_new_tokens=tc.eval_max_new_tokens,
                     temperature=tc.eval_temperature, seeds=tc.eval_seeds)
    verify_seconds = time.perf_counter() - t0
    exp.unload_adapter(vid)
    exp.spend(rollout_tokens=sum(r.num_tokens for r in heldout), verify_seconds=verify_seconds)
    vd.save_rollouts("heldout", heldout)
    parent_dir = exp.vdir(meta.parents[0]).path if meta.parents and exp.vdir(meta.parents[0]).path.exists() else None
    with exp.timed("health"):
        report = health_report(vd.path, compare=parent_dir)
        write_atomic(vd.path / "health.json", report.to_json())
        write_atomic(vd.path / "health.md", report.to_markdown())
    train = vd.rollouts("train")
    meta.metrics.update(
        heldout_accuracy=sum(bool(r.hidden.get("correct")) for r in heldout) / max(1, len(heldout)),
        train_reward_mean=sum(r.reward or 0.0 for r in train) / max(1, len(train)),
        cost=sum(r.num_tokens for r in train) / max(1, len(train)),   # generated tokens per rollout
        verify_seconds=verify_seconds,
    )
    meta.status = "verified"
    vd.save_meta(meta)


def control_of(exp, meta: BranchVersion) -> str | None:
    """The sibling that continued the child's parent under the parent's own harness this generation."""
    for vid in exp.generation_versions(meta.generation):
        other = exp.vdir(vid).meta()
        if other.operator is None and other.parents == meta.parents[:1] and other.id != meta.id:
            return vid
    return meta.parents[0] if meta.parents else None


def gate_version(exp, vid: str) -> None:
    """Validity first (engine checks + the harness's own), then paired statistics against the control."""
    from evotrainer.fitness.gates import GateConfig, gate
    from evotrainer.fitness.health import HealthReport

    vd = exp.vdir(vid)
    meta = vd.meta()
    if meta.status != "verified":
        return
    ev = exp.cfg.evolution
    gcfg = GateConfig(level=ev.gate_level, min_delta=ev.min_delta, seed=exp.cfg.seed)
    is_child = meta.operator is not None
    control = control_of(exp, meta) if is_child else None
    health = vd.path / "health.json"   # written by verification: the gate judges that same report
    report = HealthReport.from_dict(json.loads(health.read_text())) if health.is_file() else None
    with exp.timed("gate"):
        decision = gate(vd.path, exp.vdir(control).path if control else None, gcfg, labels=exp.labels,
                        report=report)
    meta.decision = decision.to_dict()
    meta.violations = [{"name": "gate", "message": r} for r in decision.reasons
                       if r.startswith(("engine check", "harness validity"))]
    if not decision.valid:
        meta.status = "invalid"
    elif is_child:
        meta.status = "promoted" if decision.promote else "rejected"
    else:
        meta.status = "kept"
    vd.save_meta(meta)
    write_atomic(vd.path / "decision.json", json.dumps(meta.decision, indent=2, default=str))
    if is_child:
        exp.after_gate(meta, control)


def new_version(exp, parent: BranchVersion | None, source: str, generation: int, *, operator: str | None = None,
                factor: str | None = None, intervention: dict[str, Any] | None = None,
                extra_parents: list[str] = (), status: str = "pending") -> str:
    """A pending version: the parent's adapter copied (copy-on-write), the genome to train under."""
    vid = exp.state.new_id()
    vd = exp.vdir(vid)
    vd.path.mkdir(parents=True, exist_ok=True)
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
    ))
    return vid


def propose_children(exp, survivors: list[str], generation: int) -> None:
    """Operators propose single-factor interventions on selected parents; each is backtested on the
    parent's cached rollouts before any training compute is spent on it."""
    from evotrainer.fitness.backtest import backtest
    from evotrainer.operators.base import OperatorError
    from evotrainer.selection import parents as select_parents

    ev, state = exp.cfg.evolution, exp.state
    wanted = 0 if ev.mode == "reference" else ev.children_per_generation
    todo = wanted - len([v for v in state.live if exp.vdir(v).meta().operator is not None])
    picks = select_parents(exp.candidates(survivors), max(0, todo), ev.tournament_size,
                           seed=exp.cfg.seed * 7919 + generation)
    cases = exp.labels.cases() if picks and ev.backtest else []   # labelled history: read once per round
    for pid in picks:
        exp.guard()
        parent = exp.vdir(pid).meta()
        programs = [HarnessProgram(exp.vdir(pid).genome_source(), name=f"{pid}/genome.py")]
        second = next((s for s in survivors if exp.vdir(s).meta().genome_hash != parent.genome_hash), None)
        if second:
            programs.append(HarnessProgram(exp.vdir(second).genome_source(), name=f"{second}/genome.py"))
        record = {"generation": generation, "parent": pid}
        t0 = time.perf_counter()
        try:
            iv = exp.mix.propose(programs, exp.evidence_for(pid), attempts=3)
        except OperatorError as e:
            state.history.append({**record, "outcome": "operator_rejected", "kind": e.kind, "reason": e.reason[:300]})
            exp.say(f"gen {generation}: proposal for {pid} rejected ({e.kind}): {e.reason[:120]}")
            exp.save()
            continue
        finally:
            exp.spend(propose_seconds=time.perf_counter() - t0)
            exp.sync_llm_budget()
        record.update(operator=iv.operator, factor=iv.factor, hypothesis=iv.hypothesis,
                      expected=iv.expected_effect.to_dict() if iv.expected_effect else None)
        bt = None
        if ev.backtest:
            t0 = time.perf_counter()
            bt = backtest(iv.child(), exp.vdir(pid).path, expect=iv.expected_effect, labels=cases)
            exp.spend(backtest_seconds=time.perf_counter() - t0)
            if not bt.accept:
                state.history.append({**record, "outcome": "backtest_rejected", "reasons": bt.reasons[:5]})
                exp.say(f"gen {generation}: {iv.operator} child of {pid} rejected by backtest: {bt.reasons[:1]}")
                exp.save()
                continue
        extra = [second] if second and len(iv.parent_hashes) > 1 else []
        status = "awaiting_approval" if ev.human_gate else "pending"
        cid = new_version(exp, parent, iv.child_source, generation, operator=iv.operator, factor=iv.factor,
                          intervention=iv.to_dict(), extra_parents=extra, status=status)
        if bt is not None:
            write_atomic(exp.vdir(cid).path / "backtest.json", bt.to_json())
        state.history.append({**record, "outcome": "accepted", "child": cid})
        state.live.append(cid)
        if ev.human_gate:
            state.approvals[cid] = "pending"
        exp.say(f"gen {generation}: {iv.operator} proposed {cid} from {pid} ({iv.factor})")
        exp.save()


def revert_target(exp, vid: str):
    """(ancestor id, paired decision) when ``vid`` regressed from its best ancestor, else None.

    The ancestors are the first-parent chain back to the seed, settled and valid. The best of them by
    held-out accuracy (the nearest one on a tie: it has had the most training) must beat ``vid`` on
    the same held-out tasks by the gate's own paired bootstrap rule (CI lower bound above
    ``min_delta``), so noise alone never triggers a revert.
    """
    from evotrainer.fitness.gates import GateConfig, paired_promotion
    from evotrainer.fitness.paired_stats import PairingError

    meta = exp.vdir(vid).meta()
    current = meta.metrics.get("heldout_accuracy")
    if current is None:
        return None
    best, seen, pid = None, {vid}, (meta.parents[0] if meta.parents else None)
    while pid and pid not in seen and exp.vdir(pid).path.is_dir():
        seen.add(pid)
        anc = exp.vdir(pid).meta()
        acc = anc.metrics.get("heldout_accuracy")
        if anc.status in SETTLED and acc is not None and acc > (best[1] if best else current):
            best = (pid, acc)
        pid = anc.parents[0] if anc.parents else None
    if best is None:
        return None
    ev = exp.cfg.evolution
    gcfg = GateConfig(level=ev.gate_level, min_delta=ev.min_delta, seed=exp.cfg.seed)
    try:
        decision = paired_promotion(exp.vdir(best[0]).rollouts("heldout"), exp.vdir(vid).rollouts("heldout"), gcfg)
    except (PairingError, ValueError):
        return None   # not sampled on the same tasks and seeds: no evidence either way
    return (best[0], decision) if decision.promote else None


def revert_regressed(exp, survivors: list[str], generation: int) -> list[str]:
    """Survivors that regressed from an ancestor are replaced by it: the next generation continues
    the ancestor (its adapter and harness), and the regressed version is pruned with the reason."""
    out: list[str] = []
    for sid in survivors:
        target = revert_target(exp, sid)
        if target is None:
            out.append(sid)
            continue
        aid, decision = target
        vd = exp.vdir(sid)
        meta = vd.meta()
        meta.decision = {**(meta.decision or {}), "reverted_to": aid, "revert_reason": decision.reason}
        vd.save_meta(meta)
        exp.state.history.append({"generation": generation + 1, "parent": sid, "operator": "revert", "factor": "revert",
                                  "outcome": "reverted", "to": aid, "reason": decision.reason})
        exp.say(f"gen {generation}: {sid} regressed from {aid}; reverting to it ({decision.reason[:80]})")
        if aid not in out:
            out.append(aid)
    return out
