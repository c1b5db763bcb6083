"""One SWE-bench instance over a local git repository, for the SWE loader and grading tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from evotrainer.domains.swe.loader import read_tree
from evotrainer.domains.swe.patching import diff_files


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def write_swebench_instance(root: Path) -> tuple[Path, dict]:
    """``root/train.jsonl`` with one SWE-bench record over a local git clone in ``root/repos``
    (a package whose ``add`` subtracts, and one passing test): ``root`` and the record."""
    repo = root / "repos" / "acme__calc"
    (repo / "calc").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calc" / "__init__.py").write_text("")
    (repo / "calc" / "ops.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "tests" / "test_ops.py").write_text("from calc.ops import add\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    base = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    files = read_tree(repo, base)
    fix = diff_files(files, {**files, "calc/ops.py": "def add(a, b):\n    return a + b\n"})
    test_patch = diff_files(files, {**files, "tests/test_ops.py": files["tests/test_ops.py"]
                                    + "\n\nclass TestAdd:\n    def test_two(self):\n        assert add(1, 1) == 2\n"})
    rec = {"instance_id": "acme__calc-1", "repo": "acme/calc", "base_commit": base, "patch": fix,
           "test_patch": test_patch, "FAIL_TO_PASS": json.dumps(["tests/test_ops.py::TestAdd::test_two"]),
           "PASS_TO_PASS": ["tests/test_ops.py::test_zero"], "problem_statement": "add(1, 1) is 0"}
    (root / "train.jsonl").write_text(json.dumps(rec) + "\n")
    return root, rec
