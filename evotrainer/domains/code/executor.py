"""Executor: grades batches of policy-written programs on a pool of warm, isolated workers.

Policy code never runs in the engine's process. Each worker (``exec_worker.py``) is a long-lived
Python process, started once in its own session with a scrubbed environment and a scratch cwd; it
isolates itself (a fresh network namespace, not dumpable) and preloads the standard modules, then
forks one confined process per program (per test for stdin/stdout programs), which is what makes a
batch cheap: a fork of a warm interpreter instead of a new interpreter per program
(``benchmarks/code_execution.py`` measures both). The worker runs the trusted checker; see its
docstring for why a program cannot forge a pass.

The engine enforces a wall-clock limit on every job (SIGKILL to the worker's process group, then a
fresh worker); a worker that dies or hangs costs that one program a ``worker_died`` verdict, never
the batch.
"""

from __future__ import annotations

import atexit
import json
import os
import pwd
import queue
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

WORKER = Path(__file__).with_name("exec_worker.py")
HEADER_SIZE = 8
KINDS = ("function", "stdio")
VERDICTS = ("pass", "wrong_answer", "runtime_error", "syntax_error", "timeout", "memory", "bad_return",
            "output_limit", "exit", "not_run", "worker_died")
# What the worker (and so every program) sees of the environment: no secrets, one BLAS thread.
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for ex in list(_LIVE):
        ex.close()


@dataclass(frozen=True)
class ExecLimits:
    timeout_s: float = 3.0        # wall clock per test (a test may call the function many times)
    load_timeout_s: float = 5.0   # wall clock to load the program's module code
    cpu_s: int = 10               # CPU seconds per program process (RLIMIT_CPU)
    memory_mb: int = 1024         # address space per program process (RLIMIT_AS)
    nofile: int = 32              # open files
    fsize_mb: int = 4             # largest file a program may write (in its scratch)
    scratch_mb: int = 256         # all files of a worker's programs (a tmpfs, where mounts are allowed)
    output_bytes: int = 1 << 20   # stdout of a stdin/stdout program
    reply_bytes: int = 1 << 20    # one return value, encoded
    drop_privileges: bool = True  # programs run as `nobody` when the engine is root
    isolate_network: bool = True  # workers live in a fresh network namespace


@dataclass(frozen=True)
class Program:
    """One program and the tests to grade it with.

    ``kind="function"``: tests are ``{"code": "assert candidate(1) == 2"}`` statements run by the
    trusted checker after ``preamble`` (trusted helper code); ``entry`` is the function's name.
    ``kind="stdio"``: tests are ``{"input": ..., "output": ...}``; each runs a fresh process.
    """

    source: str
    kind: str
    tests: tuple[dict[str, Any], ...]
    entry: str = ""
    preamble: str = ""


@dataclass
class ExecResult:
    verdicts: list[dict[str, Any]]
    flags: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> int:
        return sum(v["verdict"] == "pass" for v in self.verdicts)

    @property
    def all_passed(self) -> bool:
        return bool(self.verdicts) and self.passed == len(self.verdicts)


class ExecutorError(RuntimeError):
    """The executor could not start or the checker code of a task failed (an engine problem)."""


def _read_roots() -> tuple[list[str], list[str]]:
    """(allowed, denied): a program may read the standard library and a few devices, but nothing
    under site-packages (datasets such as HumanEval's, and the engine's own code, live there)."""
    paths = sysconfig.get_paths()
    roots = {os.path.realpath(p) for p in (paths["stdlib"], paths["platstdlib"])}
    denied = {os.path.realpath(p) for p in (paths["purelib"], paths["platlib"])}
    denied |= {os.path.realpath(p) for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
    return sorted(roots | {"/dev/null", "/dev/urandom", "/dev/zero"}), sorted(denied)


def _hidden_paths() -> list[str]:
    """Folders a program must not see at all (``exec_worker.hide``): every import path outside the
    standard library (site-packages, the engine's code), the engine's cwd and home (run folders),
    and the temp folders; never a folder that holds the standard library."""
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    cands = {os.path.realpath(p) for p in sys.path if p} | {os.path.realpath(p) for p in (
        os.getcwd(), os.path.expanduser("~"), str(Path(__file__).resolve().parents[3]),
        "/tmp", "/var/tmp", "/dev/shm", "/home", "/root", "/mnt", "/srv")}
    return sorted(p for p in cands if p != "/" and not (stdlib == p or stdlib.startswith(p + os.sep)
                                                      or p.startswith(stdlib + os.sep)))


_DEAD = object()   # put on the idle queue in place of a worker that could not be replaced


class _Worker:
    def __init__(self, limits: ExecLimits, ids: tuple[int, int] | None):
        self.limits, self.ids = limits, ids
        self.scratch = tempfile.mkdtemp(prefix="evotrainer-code-")
        req_r, self.req = os.pipe()
        self.resp, resp_w = os.pipe()
        env = dict(_ENV, HOME=self.scratch, TMPDIR=self.scratch)
        self.log = Path(self.scratch) / "worker.log"  # a file, not a pipe: nothing can block on it
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", str(WORKER), str(req_r), str(resp_w)], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=self.log.open("wb"), pass_fds=(req_r, resp_w), cwd=self.scratch,
                env=env, start_new_session=True)
        finally:
            os.close(req_r)
            os.close(resp_w)
        lim = asdict(limits)
        allowed, denied = _read_roots()
        init = {"limits": lim, "read_roots": allowed, "deny_roots": denied, "hide": _hidden_paths(),
                "isolate_network": limits.isolate_network,
                "uid": ids and ids[0], "gid": ids and ids[1]}
        try:
            self.send(init, time.monotonic() + 30)
            ready = self.recv(time.monotonic() + 30)
        except ExecutorError:
            err = self.kill()
            raise ExecutorError(f"the code execution worker did not start: {err or 'no reply'}") from None
        self.features = ready.get("features", {})

    def send(self, obj: Any, deadline: float) -> None:
        data = json.dumps(obj).encode()
        view = memoryview(len(data).to_bytes(HEADER_SIZE, "big") + data)
        while view:
            self._wait(self.req, select.POLLOUT, deadline)
            try:
                view = view[os.write(self.req, view[: 1 << 20]):]
            except BrokenPipeError:
                raise ExecutorError("the worker went away") from None

    def recv(self, deadline: float) -> dict:
        size = int.from_bytes(self._read(HEADER_SIZE, deadline), "big")
        return json.loads(self._read(size, deadline))

    def _read(self, n: int, deadline: float) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            self._wait(self.resp, select.POLLIN, deadline)
            chunk = os.read(self.resp, min(n - len(buf), 1 << 22))
            if not chunk:
                raise ExecutorError("the worker went away")
            buf += chunk
        return bytes(buf)

    def _wait(self, fd: int, event: int, deadline: float) -> None:
        poller = select.poll()
        poller.register(fd, event)
        while not poller.poll(max(0.0, min(deadline - time.monotonic(), 1.0)) * 1000):
            if time.monotonic() >= deadline:
                raise ExecutorError("the worker did not answer in time")

    def grade(self, program: Program) -> ExecResult:
        lim, n = self.limits, len(program.tests)
        deadline = time.monotonic() + lim.load_timeout_s + (n + 1) * lim.timeout_s + 10
        start = time.perf_counter()
        self.send({"kind": program.kind, "program": program.source, "entry": program.entry,
                   "preamble": program.preamble, "n_tests": n}, deadline)
        self.send({"tests": list(program.tests)}, deadline)
        reply = self.recv(deadline)
        if not reply.get("ok"):
            raise ExecutorError(f"the checker failed: {reply.get('error')}")
        return ExecResult(reply["verdicts"], list(dict.fromkeys(reply["flags"])), time.perf_counter() - start)

    def kill(self) -> str:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        try:
            err = self.log.read_text(errors="replace")[-500:]
        except OSError:
            err = ""
        for fd in (self.req, self.resp):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.scratch, ignore_errors=True)
        return err.strip()


class CodeExecutor:
    """A pool of warm workers; ``run(programs)`` grades a batch and keeps the input order."""

    def __init__(self, workers: int | None = None, limits: ExecLimits | None = None):
        self.limits = limits or ExecLimits()
        self.n_workers = max(1, workers or os.cpu_count() or 1)
        self._ids = None
        if self.limits.drop_privileges and os.geteuid() == 0:
            try:
                nobody = pwd.getpwnam("nobody")
                self._ids = (nobody.pw_uid, nobody.pw_gid)
            except KeyError:  # no such user: the other layers still hold
                self._ids = None
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        _LIVE.add(self)

    def __enter__(self) -> CodeExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def features(self) -> dict[str, Any]:
        return self._all[0].features if self._all else {}

    def _start(self) -> None:
        with self._lock:
            if self._pool is None:
                for _ in range(self.n_workers):
                    w = _Worker(self.limits, self._ids)
                    self._all.append(w)
                    self._idle.put(w)
                self._pool = ThreadPoolExecutor(self.n_workers, thread_name_prefix="code-exec")

    def run(self, programs: Sequence[Program]) -> list[ExecResult]:
        for p in programs:
            if p.kind not in KINDS:
                raise ValueError(f"program kind must be one of {KINDS}, got {p.kind!r}")
        if not programs:
            return []
        self._start()
        assert self._pool is not None
        return list(self._pool.map(self._grade_one, programs))

    def _grade_one(self, program: Program) -> ExecResult:
        worker = self._idle.get()
        if worker is _DEAD:   # the pool lost a worker for good: every grader after it fails, none hangs
            self._idle.put(_DEAD)
            raise ExecutorError("the code executor lost a worker that could not be replaced; see the error before "
                                "this one")
        try:
            result = worker.grade(program)
        except ExecutorError as e:
            if str(e).startswith("the checker failed"):
                self._idle.put(worker)
                raise
            # The worker hung or died: replace it; this program alone gets the verdict.
            worker.kill()
            with self._lock:
                self._all.remove(worker)
                try:
                    worker = _Worker(self.limits, self._ids)
                except Exception as start_error:   # noqa: BLE001 - said, and the pool never waits on it
                    self._idle.put(_DEAD)   # wakes a grader waiting for a worker that will never come
                    raise ExecutorError(f"a code worker died ({e}) and its replacement did not start: "
                                        f"{start_error}") from start_error
                self._all.append(worker)
            # A verdict, not a tamper flag: a worker killed for hanging under load (or lost to the
            # machine) says nothing of gaming, and one flag makes the branch invalid (grader_gaming).
            # What a program does to its worker on purpose is flagged by the guard before it can act.
            result = ExecResult([{"verdict": "worker_died", "error": str(e)} for _ in program.tests], [])
        self._idle.put(worker)
        return result

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
            if pool is not None:
                pool.shutdown(wait=True)
            for w in self._all:
                w.kill()
            self._all = []
            self._idle = queue.Queue()
