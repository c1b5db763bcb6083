"""Unified diffs over an in-memory repository ({relative path: text}): parse, apply, protect tests.

The engine applies a policy's patch itself, to a fresh copy held in memory, so a patch can never
reach a host path: every path must be relative, without ``..`` or ``.git``, and only regular text
files exist. Hunks apply by exact context, looked for near the stated line first (an offset, like
``patch`` allows), so a diff written against the right text applies even if its line numbers drift.

``protected(path)``: the files a patch may not change for grading (tests, conftest, test config,
interpreter start-up files): ``apply_patch(..., drop_protected=True)`` leaves them out and reports
them, and the grader restores the hidden tests afterwards anyway.
"""

from __future__ import annotations

import difflib
import posixpath
import re
from dataclasses import dataclass, field

HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
TEST_CONFIG = {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "noxfile.py", "sitecustomize.py",
               "usercustomize.py"}
TEST_DIRS = {"tests", "test", "testing"}


class PatchError(ValueError):
    """The patch does not parse or does not apply (a verdict for the patch, never an engine error)."""


@dataclass
class FilePatch:
    old: str | None              # None: the file is created
    new: str | None              # None: the file is deleted
    hunks: list[tuple[int, list[str]]] = field(default_factory=list)   # (old start, lines with a +/-/space)

    @property
    def path(self) -> str:
        return self.new or self.old or ""


def protected(path: str) -> bool:
    """Tests, conftest, test configuration and interpreter start-up files (``.pth`` included)."""
    parts = path.split("/")
    name = parts[-1]
    return (bool(TEST_DIRS & set(parts[:-1])) or name.startswith("test_") or name.endswith("_test.py")
            or name in TEST_CONFIG or name.endswith(".pth"))


def clean_path(raw: str) -> str | None:
    """The repository-relative path a diff header names (``a/``/``b/`` prefixes dropped)."""
    raw = raw.split("\t")[0].strip()
    if raw == "/dev/null":
        return None
    if raw[:2] in ("a/", "b/"):
        raw = raw[2:]
    path = posixpath.normpath(raw)
    if not raw or path.startswith(("/", "..")) or path == "." or ".git" in path.split("/") or "\0" in path:
        raise PatchError(f"the patch names a path outside the repository: {raw!r}")
    return path


def parse_patch(text: str) -> list[FilePatch]:
    lines = text.splitlines()
    out: list[FilePatch] = []
    i = 0
    while i < len(lines):
        if _file_header(lines, i):
            fp = FilePatch(clean_path(lines[i][4:]), clean_path(lines[i + 1][4:]))
            if fp.old is None and fp.new is None:
                raise PatchError(f"line {i + 1}: a file patch from /dev/null to /dev/null")
            out.append(fp)
            i += 2
            while (i := _next_hunk(lines, i)) < len(lines) and (m := HUNK_RE.match(lines[i])):
                old_n = int(m.group(2) or 1)
                new_n = int(m.group(4) or 1)
                body: list[str] = []
                i += 1
                while (old_n > 0 or new_n > 0) and i < len(lines):
                    ln = lines[i] if lines[i] else " "   # an editor may strip a blank context line's space
                    if ln[0] not in " +-\\":
                        break
                    if ln[0] in " -":
                        old_n -= 1
                    if ln[0] in " +":
                        new_n -= 1
                    if ln[0] != "\\":
                        body.append(ln)
                    i += 1
                if old_n > 0 or new_n > 0:
                    raise PatchError(f"line {i}: a hunk of {fp.path} ends early")
                while i < len(lines) and lines[i].startswith("\\"):
                    i += 1
                fp.hunks.append((int(m.group(1)), body))
            if i < len(lines) and lines[i].startswith(("+", "-")) and lines[i] != "-- " and not _file_header(lines, i):
                raise PatchError(f"line {i + 1}: {lines[i][:40]!r} follows the last hunk of {fp.path} but no hunk "
                                 "counts it: its @@ header undercounts the hunk's lines")
            continue
        i += 1
    if not out:
        raise PatchError("no file patch found (expected ---/+++ headers and @@ hunks)")
    return out


def _next_hunk(lines: list[str], i: int) -> int:
    """The index of the next hunk header when only blank lines come before it (hunks separated by a
    blank line, as editors and models often write them), else ``i``."""
    j = i
    while j < len(lines) and not lines[j].strip():
        j += 1
    return j if j < len(lines) and HUNK_RE.match(lines[j]) else i


def _file_header(lines: list[str], i: int) -> bool:
    return lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")


def _apply_hunks(path: str, text: str, hunks: list[tuple[int, list[str]]]) -> str:
    lines = text.splitlines()
    shift = 0
    for start, body in hunks:
        old = [ln[1:] for ln in body if ln[0] in " -"]
        new = [ln[1:] for ln in body if ln[0] in " +"]
        want = max(0, start - 1 + shift) if old else max(0, start + shift)
        at = None
        for delta in range(0, len(lines) + 1):
            for pos in (want - delta, want + delta):
                if 0 <= pos <= len(lines) - len(old) and lines[pos:pos + len(old)] == old:
                    at = pos
                    break
            if at is not None:
                break
        if at is None:
            raise PatchError(f"a hunk does not apply to {path} (near line {start}): its context is not in the file")
        lines[at:at + len(old)] = new
        shift += len(new) - len(old)
    return "\n".join(lines) + "\n" if lines else ""


def apply_patch(files: dict[str, str], text: str, drop_protected: bool = False) -> tuple[dict[str, str], list[str]]:
    """(the patched copy, the protected paths left out). ``files`` is never changed."""
    out = dict(files)
    dropped: list[str] = []
    for fp in parse_patch(text):
        if drop_protected and any(p and protected(p) for p in (fp.old, fp.new)):
            dropped.append(fp.path)
            continue
        if fp.old is None:
            if fp.new in out:
                raise PatchError(f"the patch creates {fp.new}, which exists")
            out[fp.new] = _apply_hunks(fp.new, "", fp.hunks)
            continue
        if fp.old not in out:
            raise PatchError(f"the patch changes {fp.old}, which is not in the repository")
        body = _apply_hunks(fp.old, out[fp.old], fp.hunks)
        del out[fp.old]
        if fp.new is not None:
            out[fp.new] = body
    return out, list(dict.fromkeys(dropped))


def diff_files(before: dict[str, str], after: dict[str, str]) -> str:
    """The unified diff between two copies (what ``view_diff`` shows and ``submit`` hands in)."""
    parts = []
    for path in sorted(set(before) | set(after)):
        a, b = before.get(path), after.get(path)
        if a == b:
            continue
        old, new = (f"a/{path}" if a is not None else "/dev/null"), (f"b/{path}" if b is not None else "/dev/null")
        lines = difflib.unified_diff((a or "").splitlines(keepends=True), (b or "").splitlines(keepends=True),
                                     old, new, n=3)
        body = "".join(ln if ln.endswith("\n") else ln + "\n" for ln in lines)   # a last line without newline
        parts.append(f"diff --git a/{path} b/{path}\n" + body)
    return "".join(parts)
