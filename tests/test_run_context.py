"""The train and verify stages are typed by ``RunContext``, and every object the code passes them is
one: the experiment, the standalone context (``evotrainer train``, ``rerun``) and the Ray worker."""

import ast
from pathlib import Path

from evotrainer.config import parse_config
from evotrainer.loop.compute.branch_worker import BranchWorker
from evotrainer.loop.context import RunContext
from evotrainer.loop.experiment import Experiment
from evotrainer.loop.stages.training import StandaloneContext
from evotrainer.records.version import VersionDir
from tests.loop_runs import tiny_cfg

TRAINING = Path(__file__).resolve().parents[1] / "evotrainer" / "loop" / "stages" / "training.py"


def test_every_context_the_stages_get_is_a_run_context(tmp_path):
    cfg = parse_config(tiny_cfg(tmp_path / "run"))
    contexts = [Experiment(cfg), StandaloneContext(cfg, lambda v: VersionDir(tmp_path / v), print),
                BranchWorker(cfg.model_dump(mode="json"), str(tmp_path / "run"))]
    for ctx in contexts:
        assert isinstance(ctx, RunContext), type(ctx).__name__
    assert not isinstance(object(), RunContext)


def test_the_stages_name_the_protocol_not_the_experiment():
    tree = ast.parse(TRAINING.read_text())
    hints = [ast.unparse(a.annotation) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
             for a in f.args.args if a.arg == "exp" and a.annotation is not None]
    assert hints and set(hints) == {"RunContext"}
    assert "Experiment" not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
