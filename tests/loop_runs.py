"""Runs for tests to share: the tiny loop's config, what every finished run must hold, and a small
run written by hand (version directories only, no training) for the lineage and plot views."""

from __future__ import annotations

from pathlib import Path

from evotrainer.loop.experiment import Experiment
from evotrainer.records.run_state import load_state
from evotrainer.records.version import BranchVersion, VersionDir

TERMINAL = {"kept", "promoted", "rejected", "invalid", "pruned"}

# A reward that varies within groups, so every step moves the weights (the tiny model's answers are
# never correct, and a constant reward would leave them as they were): for the kill-and-resume tests.
MOVING_REWARD_HARNESS = '''
def reward(rollouts, tasks):
    return [float(len(r["completion"]) % 3) for r in rollouts]
'''


class Crashed(BaseException):
    """Stands in for os._exit(137) in-process: nothing after the crash point runs or saves."""


def die():
    """What a test puts in place of ``evotrainer.loop.crash._die``."""
    raise Crashed


def tiny_cfg(run_dir, **evolution):
    """A loop config on the tiny model that runs three generations in about a minute on CPU
    (``evolution``: overrides of its evolution section)."""
    ev = {"population_size": 2, "children_per_generation": 2, "generations": 3, "steps_per_generation": 1,
          "operators": {"knobs": 1.0, "crossover": 1.0}, "user_skills": False}
    ev.update(evolution)
    return {
        "model": "tiny-random", "run_dir": str(run_dir),
        "domain": {"difficulty": 2, "n_train": 16, "n_heldout": 6, "n_test": 4},
        "grpo": {"max_completion_length": 32, "num_generations": 2},
        "train": {"prompts_per_step": 2, "eval_max_new_tokens": 6},
        "evolution": ev,
    }


def lineage_steps(exp, vid):
    """Training steps recorded on ``vid`` and its first parents back to the seed: how deep it trained."""
    steps = 0
    while vid:
        steps += len(exp.vdir(vid).steps())
        parents = exp.vdir(vid).meta().parents
        vid = parents[0] if parents else None
    return steps


def mlflow_runs(run_dir):
    """The MLflow runs of the run's versions (those tagged with a version id)."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run_dir}/mlflow.db")
    exps = client.search_experiments()
    runs = [r for e in exps for r in client.search_runs([e.experiment_id], max_results=1000)]
    return [r for r in runs if "evotrainer.version_id" in r.data.tags]


def check_invariants(run_dir):
    """No version lost or duplicated: every version settled, one MLflow run each, ids contiguous."""
    state = load_state(run_dir)
    exp = Experiment.resume(run_dir)
    vids = exp.versions()
    assert vids == [f"v{i:04d}" for i in range(state.next_id)], (vids, state.next_id)
    metas = {v: exp.vdir(v).meta() for v in vids}
    assert all(m.status in TERMINAL for m in metas.values()), {v: m.status for v, m in metas.items()}
    runs = mlflow_runs(run_dir)
    ids = [r.data.tags["evotrainer.version_id"] for r in runs]
    assert sorted(ids) == vids, "exactly one MLflow run per version"
    for r in runs:
        m = metas[r.data.tags["evotrainer.version_id"]]
        assert r.data.tags["evotrainer.status"] == m.status
        if m.parents:
            assert r.data.tags["evotrainer.parents"].split(",") == m.parents
    return state, metas


GENOME = "KNOBS = {'learning_rate': {'low': 1e-6, 'high': 1e-3, 'default': 1e-5}}\n"


def build_run(run_dir: Path) -> dict[str, BranchVersion]:
    """A small run: two seeds, a child of each, a crossover of the children, an invalid high scorer."""
    specs = [
        # id, generation, parents, score, status, violations, operator, factor
        ("v000", 0, [], 0.20, "promoted", [], None, None),
        ("v001", 0, [], 0.15, "trained", [], None, None),
        ("v002", 1, ["v000"], 0.30, "promoted", [], "knobs", "knob:learning_rate"),
        ("v003", 1, ["v001"], 0.90, "invalid",
         [{"name": "leak_used", "message": "answers copied from leaked prompts"}], "llm_diff", "hook:reward"),
        ("v004", 2, ["v002", "v001"], 0.35, "trained", [], "crossover", "hook:keep_groups"),
    ]
    versions = {}
    for i, (vid, gen, parents, score, status, violations, op, factor) in enumerate(specs):
        d = VersionDir(run_dir / "versions" / vid)
        v = BranchVersion(id=vid, base_model="tiny-random", genome_hash=f"h{vid}", parents=parents,
                          metrics={"heldout_accuracy": score, "train_reward": score / 2}, status=status,
                          created=1_700_000_000 + i, generation=gen, operator=op, factor=factor,
                          violations=violations, knobs={"learning_rate": 1e-5 * (i + 1), "group_size": 4},
                          intervention={"factor": factor, "diff": "-a\n+b\n"} if op else None,
                          decision={"promote": status == "promoted", "valid": not violations} if op else None)
        d.save_meta(v)
        d.save_genome(GENOME + f"# {vid}\n")
        for step in range(3):
            d.append_step({"step": step, "loss": 1.0 - 0.1 * step, "dead_group_ratio": 0.5, "note": "text"})
        if op:
            (d.path / "diff.patch").write_text("--- a/parent.py\n+++ b/child.py\n-a\n+b\n")
            (d.path / "health.md").write_text(f"# Health report: {vid}\n")
        versions[vid] = v
    return versions
