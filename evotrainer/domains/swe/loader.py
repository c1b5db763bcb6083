"""SWE-bench-format JSONL instances over repositories the user already has on disk (nothing is downloaded).

Each line is one JSON object with ``instance_id``, ``repo`` ("owner/name"), ``base_commit``,
``patch`` (the reference fix), ``test_patch``, ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` (lists of test
ids, or JSON strings of lists, as SWE-bench ships them) and optionally ``problem_statement`` and
``repo_path``. The repository is a git clone that has ``base_commit``, found at ``repo_path`` (absolute
or relative to the JSONL file), else ``<JSONL folder>/repos/<owner>__<name>``, else
``<JSONL folder>/repos/<name>``. Its files are read from git at grading time (``read_tree``).

What grading needs of such a repository: its tests must run with the standard library only (the
sandbox has no site-packages: no pytest, no third-party dependencies) as plain ``test_*``
functions or ``unittest.TestCase`` methods, with pytest-style ids (``path::test`` or
``path::Class::test``). A malformed line is an error naming the file and the line.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from evotrainer.domains.task import Task

REQUIRED = ("instance_id", "repo", "base_commit", "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS")
MAX_REPO_BYTES = 32 << 20   # the repository travels inside the sandboxed program


def _ids(value: Any, key: str, where: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"{where}: {key} is a string but not a JSON list") from None
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValueError(f"{where}: {key} must be a list of test ids")
    return value


def _git(repo: Path, *args: str) -> bytes:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=60)
    if proc.returncode != 0:
        raise ValueError(f"git {' '.join(args[:2])} in {repo} failed: {proc.stderr.decode(errors='replace').strip()[:200]}")
    return proc.stdout


def _find_repo(rec: dict[str, Any], base: Path) -> Path | None:
    cands = []
    if rec.get("repo_path"):
        cands.append((base / str(rec["repo_path"])).resolve())
    owner, _, name = str(rec["repo"]).partition("/")
    cands += [base / "repos" / f"{owner}__{name}", base / "repos" / (name or owner)]
    return next((c for c in cands if (c / ".git").exists()), None)


def load_swebench(path: str | Path, split: str) -> list[Task]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None
    tasks = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{where}: expected a JSON object")
        missing = [k for k in REQUIRED if k not in rec]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        f2p, p2p = _ids(rec["FAIL_TO_PASS"], "FAIL_TO_PASS", where), _ids(rec["PASS_TO_PASS"], "PASS_TO_PASS", where)
        if not f2p:
            raise ValueError(f"{where}: FAIL_TO_PASS is empty (nothing would show the fix)")
        repo = _find_repo(rec, path.parent)
        if repo is None:
            raise ValueError(f"{where}: repository {rec['repo']!r} not found (set repo_path, or clone it to "
                             f"{path.parent / 'repos'}/<owner>__<name>)")
        try:
            _git(repo, "cat-file", "-e", f"{rec['base_commit']}^{{commit}}")
        except ValueError:
            raise ValueError(f"{where}: {repo} has no commit {rec['base_commit']!r}") from None
        tasks.append(Task(id=str(rec["instance_id"]), prompt=str(rec.get("problem_statement") or rec["instance_id"]),
                          answer=str(rec["patch"]), split=split, domain="swe", difficulty=0,
                          visible={"repo_path": str(repo), "base_commit": str(rec["base_commit"]),
                                   "issue": str(rec.get("problem_statement", "")), "history": [], "leaky": False},
                          hidden={"test_patch": str(rec["test_patch"]), "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p}))
    return tasks


def read_tree(repo: str | Path, commit: str) -> dict[str, str]:
    """The text files of ``commit`` ({path: text}); binary files are left out."""
    data = _git(Path(repo), "archive", "--format=tar", commit)
    files, total = {}, 0
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            raw = tar.extractfile(member).read()  # type: ignore[union-attr]
            try:
                files[member.name] = raw.decode("utf-8")
            except UnicodeDecodeError:
                continue
            total += len(raw)
            if total > MAX_REPO_BYTES:
                raise ValueError(f"{repo} at {commit} has over {MAX_REPO_BYTES >> 20} MiB of text files; too big to grade")
    return files
