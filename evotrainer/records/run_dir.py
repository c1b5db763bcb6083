"""Whose directory is this? The marker that names a directory's kind, and the lock of its writer.

A run directory (``evotrainer run``) and a version directory (``evotrainer train``) carry a marker
file, ``.evotrainer`` = ``{"kind": "run" | "version", ...}``, written when the command creates
the directory. A command writes only into a directory of its own kind: a non-empty directory
without a marker (a user's folder, a ``config.json`` of their own) or of another kind (a loop run
under ``train --run-dir``) is refused with the reason, before anything in it is touched.

A writer also holds an OS lock (``fcntl.flock`` on ``.evotrainer.lock``) for as long as it runs,
so two processes never train the same run. The kernel drops the lock when its process dies, however
it dies (``kill -9`` included), so a stale lock file left by a dead process is simply taken over;
the file only says who holds the lock, for the refusal message. Within one process the lock is
re-entrant: a library user (or a test) may open the same run twice in one process.

Directories written before markers existed are recognised by their files ("legacy") and adopted
by the first command of their kind that writes to them.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

MARKER = ".evotrainer"
LOCK = ".evotrainer.lock"
KINDS = {"run": "evotrainer run", "version": "evotrainer train"}   # kind -> the command that creates it


class RunDirError(ValueError):
    """A directory cannot be used as asked: the message names it, says why and what to do."""


def read_marker(path: str | Path) -> dict[str, Any] | None:
    """The marker of ``path``, or None when it has none."""
    file = Path(path) / MARKER
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise RunDirError(f"{file} is not a valid evotrainer marker ({e}); restore it as "
                          '{"kind": "run"} or {"kind": "version"}, or choose another directory') from None
    if not isinstance(data, dict) or data.get("kind") not in KINDS:
        raise RunDirError(f"{file} names no known kind ({data!r}); expected kind 'run' or 'version'")
    return data


def _legacy_kind(path: Path) -> str | None:
    """The kind of a directory written before markers existed, judged from its files."""
    if (path / "config.json").is_file() and any((path / f).exists() for f in ("state.json", "versions", "mlflow.db")):
        return "run"
    if (path / "meta.json").is_file() and (path / "config.json").is_file() and path.parent.name != "versions":
        return "version"
    return None


def kind_of(path: str | Path) -> str | None:
    """'run' or 'version' for a directory evotrainer wrote (marker, else legacy files); None otherwise."""
    path = Path(path)
    if not path.is_dir():
        return None
    marker = read_marker(path)
    return marker["kind"] if marker else _legacy_kind(path)


def _inside_run(path: Path) -> Path | None:
    """The loop run a path lies inside (RUN/versions/VID), if any."""
    for up in list(path.resolve().parents)[:3]:
        if (up / MARKER).is_file() and kind_of(up) == "run":
            return up
    return None


def require(path: str | Path, kind: str) -> Path:
    """Checks, without writing anything, that ``path`` is an existing directory of ``kind``."""
    path = Path(path)
    if not path.is_dir():
        what = "run directory" if kind == "run" else "version directory"
        raise RunDirError(f"{path} does not exist or is not a directory: give the {what} that "
                          f"`{KINDS[kind]}` wrote")
    found = kind_of(path)
    if found != kind:
        made = f"an evotrainer {found} directory (written by `{KINDS[found]}`)" if found else \
            "not a directory evotrainer wrote (no .evotrainer marker)"
        raise RunDirError(f"{path} is {made}; expected a {kind} directory written by `{KINDS[kind]}`")
    return path


def claim(path: str | Path, kind: str, **info: Any) -> bool:
    """Makes ``path`` a directory of ``kind``: creates it (or fills an empty one) with its marker, or
    confirms it already is one. Refuses any other directory. True when it was created now."""
    path = Path(path)
    run = _inside_run(path)
    if run is not None:
        raise RunDirError(f"{path} lies inside the loop run {run}, which only `evotrainer run/resume` writes; "
                          "choose a directory outside it")
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{path} is a file, not a directory; choose another --run-dir")
    contents = sorted(p.name for p in path.iterdir() if p.name != LOCK) if path.is_dir() else []
    if contents:
        found = kind_of(path)
        if found == kind:
            if read_marker(path) is None:   # a legacy directory of our kind: adopt it
                _write_marker(path, kind, adopted=True, **info)
            return False
        if found:
            raise RunDirError(f"{path} is an evotrainer {found} directory written by `{KINDS[found]}`; "
                              f"`{KINDS[kind]}` never writes into one: choose another --run-dir")
        shown = ", ".join(contents[:4]) + (", ..." if len(contents) > 4 else "")
        raise RunDirError(f"{path} already holds files evotrainer did not write ({shown}); "
                          "nothing was changed: choose a new or empty directory with --run-dir")
    path.mkdir(parents=True, exist_ok=True)
    _write_marker(path, kind, **info)
    return True


def _write_marker(path: Path, kind: str, **info: Any) -> None:
    data = {"kind": kind, "created_by": KINDS[kind], "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **info}
    # Atomic (temp file + rename), like every record: a crash never leaves half a marker.
    fd, tmp = tempfile.mkstemp(dir=path, prefix=f"{MARKER}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path / MARKER)


class DirLock:
    """The exclusive writer's lock of one directory (see the module docstring)."""

    _held: dict[str, "DirLock"] = {}   # resolved path -> this process's lock on it

    def __init__(self, key: str, fd: int):
        self.key, self.fd, self.count = key, fd, 1

    def release(self) -> None:
        self.count -= 1
        if self.count == 0:
            DirLock._held.pop(self.key, None)
            os.close(self.fd)           # closing the descriptor drops the flock

    def __enter__(self) -> "DirLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def acquire(path: str | Path, command: str) -> DirLock:
    """Takes the writer's lock of ``path`` or raises RunDirError naming the process that holds it."""
    path = Path(path)
    key = str(path.resolve())
    held = DirLock._held.get(key)
    if held is not None:
        held.count += 1
        return held
    file = path / LOCK
    fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)   # not inherited by subprocesses (O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(file)
        os.close(fd)
        raise RunDirError(f"{path} is in use by {holder.get('command', 'another evotrainer process')} "
                          f"(pid {holder.get('pid', '?')}, since {holder.get('since', '?')}); one process at a "
                          "time writes a run: wait for it to finish or stop it, then try again") from None
    os.ftruncate(fd, 0)   # a dead holder's record is replaced by ours
    os.write(fd, json.dumps({"pid": os.getpid(), "command": command,
                             "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode())
    lock = DirLock._held[key] = DirLock(key, fd)
    return lock


def _holder(file: Path) -> dict[str, Any]:
    try:
        data = json.loads(file.read_text() or "{}")
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}
