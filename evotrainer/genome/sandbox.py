"""Sandbox: runs a harness genome's hooks in a separate, locked-down worker process.

Harness code written by an LLM never runs in the engine's process. One worker per genome is kept
alive across calls; a call is one round trip carrying the whole batch. Whatever goes wrong in the
worker (time, CPU, memory, a crash, a forbidden operation, a malformed result, too much output)
becomes a ``SandboxFailure`` raised as ``SandboxError``; the worker is then killed and a fresh one
starts on the next call, so the engine always carries on.

The engine side enforces: the wall-clock timeout of each call (SIGKILL to the worker's whole process
group, then reaping it), the size of the result, and the shape and finiteness of every result
(``results.validate_result``). The worker side (``sandbox_worker.py``) enforces the OS limits and
the in-process guards; see its docstring.
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import pwd
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .contract import DEFAULT_ALLOWED_IMPORTS, check_contract
from .errors import ContractError
from .program import HOOK_PARAMS, REFERENCE_PATH, HarnessProgram
from .results import BadResult, validate_result

WORKER = Path(__file__).with_name("sandbox_worker.py")
HEADER_SIZE = 8  # big-endian length prefix of each reply
KINDS = ("timeout", "memory", "cpu", "crashed", "exit", "exception", "recursion", "forbidden",
         "bad_result", "output_limit", "contract")
_SIGNAL_KINDS = {signal.SIGXCPU: "cpu", signal.SIGXFSZ: "output_limit"}
# The worker sees only this environment: no secrets, one BLAS thread (RLIMIT_NPROC counts threads).
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}


_LIVE: weakref.WeakSet = weakref.WeakSet()  # sandboxes with a worker, closed at exit


@atexit.register
def _close_all() -> None:
    """No worker or scratch directory outlives the engine (``__del__`` may not run at exit)."""
    for sandbox in list(_LIVE):
        sandbox.close()


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0          # wall clock per call (engine kills the process group)
    # worker start + loading the harness: a fresh interpreter's imports, which on a loaded node (a
    # population's training processes on two cores) took over 20 s and failed a healthy continuation
    start_timeout_s: float = 60.0
    cpu_s: int = 10                  # CPU seconds per call (RLIMIT_CPU soft limit, SIGXCPU)
    cpu_lifetime_s: int = 3600       # RLIMIT_CPU hard limit over the worker's life
    memory_mb: int = 2048            # RLIMIT_AS
    nofile: int = 64                 # RLIMIT_NOFILE
    nproc: int = 1                   # RLIMIT_NPROC: no forks, no threads (as a non-root uid)
    fsize_mb: int = 16               # RLIMIT_FSIZE: largest file the harness may write in scratch
    output_bytes: int = 64_000       # captured harness prints per call
    result_bytes: int = 256 << 20    # largest response accepted
    drop_privileges: bool = True     # run as `nobody` when the engine is root
    isolate_network: bool = True     # a fresh network namespace


@dataclass(frozen=True)
class SandboxFailure:
    kind: str
    message: str
    output: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class SandboxError(RuntimeError):
    def __init__(self, failure: SandboxFailure):
        super().__init__(str(failure))
        self.failure = failure

    @property
    def kind(self) -> str:
        return self.failure.kind


def _fail(kind: str, message: str, output: str = "") -> SandboxError:
    return SandboxError(SandboxFailure(kind, message, output))


class Sandbox:
    """One worker process for one genome. ``call(hook, *args)`` -> validated result."""

    def __init__(self, program: HarnessProgram, limits: SandboxLimits | None = None, check: bool = True,
                 allowed_imports: tuple[str, ...] = DEFAULT_ALLOWED_IMPORTS):
        self.program = program
        self.limits = limits or SandboxLimits()
        self.allowed_imports = tuple(allowed_imports)
        if check:  # check=False exists to test the sandbox itself with hostile code
            try:
                check_contract(program, allowed_imports=self.allowed_imports)
            except ContractError as e:
                raise _fail("contract", str(e)) from None
        self._proc: subprocess.Popen | None = None
        self.features: dict[str, Any] = {}
        self.last_output = ""
        self.starts = 0
        self.last_pid: int | None = None
        self._lock = threading.Lock()

    # ---- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._kill()
        except Exception:
            pass

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        with self._lock:
            if self._proc is None:
                self._spawn()

    def close(self) -> None:
        with self._lock:
            self._kill()

    def _spawn(self) -> None:
        lim = self.limits
        self._scratch = tempfile.mkdtemp(prefix="evotrainer-sandbox-")
        ids = None
        if lim.drop_privileges and os.geteuid() == 0:
            try:
                nobody = pwd.getpwnam("nobody")
                ids = (nobody.pw_uid, nobody.pw_gid)
            except KeyError:  # no such user: run as root, with the other layers only
                ids = None
            if ids:
                os.chown(self._scratch, *ids)
        req_r, self._req = os.pipe()
        self._resp, resp_w = os.pipe()
        out_r, out_w = os.pipe()
        for fd in (self._req, self._resp):
            _bigger_pipe(fd)
        os.set_blocking(self._req, False)  # a stalled worker must not block the engine's write
        env = dict(_ENV, HOME=self._scratch, TMPDIR=self._scratch)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", str(WORKER), str(req_r), str(resp_w)], stdin=subprocess.DEVNULL,
                stdout=out_w, stderr=out_w, pass_fds=(req_r, resp_w), cwd=self._scratch, env=env,
                start_new_session=True)  # its own process group: one killpg ends it all
        finally:
            for fd in (req_r, resp_w, out_w):
                os.close(fd)
        self.starts += 1
        _LIVE.add(self)
        self.last_pid = self._proc.pid  # kept after the worker ends, for diagnostics and tests
        self._out = bytearray()
        self._drain = threading.Thread(target=_drain, args=(out_r, self._out, lim.output_bytes), daemon=True)
        self._drain.start()
        init = {"source": self.program.source, "name": self.program.name, "reference": REFERENCE_PATH.read_text(),
                "allowed": list(self.allowed_imports), "limits": asdict(lim), "engine_pid": os.getpid(),
                "pdeathsig": threading.current_thread() is threading.main_thread(),
                "isolate_network": lim.isolate_network, "uid": ids and ids[0], "gid": ids and ids[1]}
        try:
            ready = self._roundtrip(init, lim.start_timeout_s, "starting the worker")
        except SandboxError:
            self._kill()
            raise
        if not ready.get("ok"):
            failure = _reported(ready)
            self._kill()
            raise SandboxError(failure)
        self.features = ready.get("features", {})

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()  # reap: no zombie stays behind
        for fd in (self._req, self._resp):
            try:
                os.close(fd)
            except OSError:
                pass
        self._drain.join(timeout=1.0)
        shutil.rmtree(self._scratch, ignore_errors=True)

    # ---- calls -------------------------------------------------------------------------------
    def call(self, hook: str, *args: Any, timeout: float | None = None) -> Any:
        """Runs ``hook(*args)`` in the worker; raises SandboxError on any failure."""
        if hook not in HOOK_PARAMS:
            raise ValueError(f"unknown hook {hook!r}; hooks: {', '.join(HOOK_PARAMS)}")
        if len(args) != len(HOOK_PARAMS[hook]):
            raise TypeError(f"{hook} takes ({', '.join(HOOK_PARAMS[hook])})")
        with self._lock:
            if self._proc is None:
                self._spawn()
            try:
                reply = self._roundtrip({"op": "call", "hook": hook, "args": args},
                                        self.limits.timeout_s if timeout is None else timeout, hook)
            except SandboxError:
                self._kill()
                raise
            self.last_output = str(reply.get("output", ""))[: self.limits.output_bytes]
            if not reply.get("ok"):
                self._kill()  # the worker's state is suspect after any failure: start afresh
                raise SandboxError(_reported(reply))
            try:
                return validate_result(hook, reply.get("result"), args)
            except BadResult as e:
                self._kill()
                raise _fail("bad_result", str(e), self.last_output) from None

    def _roundtrip(self, message: dict, timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        try:
            # Streamed: the worker unpickles frame by frame while we are still pickling.
            _PlainPickler(_Writer(self, deadline, what, timeout), protocol=5).dump(message)
        except BrokenPipeError:
            raise self._death(what) from None
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            self._kill()  # the worker holds half a message: start afresh
            raise TypeError(f"{what}: arguments must be plain data ({e})") from None
        try:
            size = int.from_bytes(self._read(HEADER_SIZE, deadline, what, timeout), "big")
            if size > self.limits.result_bytes:
                raise _fail("output_limit",
                            f"{what}: the result is {size} bytes; the limit is {self.limits.result_bytes}")
            raw = self._read(size, deadline, what, timeout)
        except BrokenPipeError:
            raise self._death(what) from None
        try:
            reply = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise _fail("bad_result", f"{what}: the worker's reply is not JSON ({e})") from None
        if not isinstance(reply, dict):
            raise _fail("bad_result", f"{what}: the worker's reply is not a JSON object")
        return reply

    def _write(self, data: bytes, deadline: float, what: str, timeout: float) -> None:
        view = memoryview(data)
        while view:
            self._wait(self._req, select.POLLOUT, deadline, what, timeout)
            try:
                view = view[os.write(self._req, view[: 1 << 20]):]
            except BlockingIOError:
                continue

    def _read(self, n: int, deadline: float, what: str, timeout: float) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            self._wait(self._resp, select.POLLIN, deadline, what, timeout)
            chunk = os.read(self._resp, min(n - len(buf), 1 << 22))
            if not chunk:
                raise self._death(what)
            buf += chunk
        return bytes(buf)

    def _wait(self, fd: int, event: int, deadline: float, what: str, timeout: float) -> None:
        poller = select.poll()
        poller.register(fd, event)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._kill()
                raise _fail("timeout", f"{what} took longer than {timeout:.3g} s; the worker was killed",
                            self._output())
            if poller.poll(min(left, 1.0) * 1000):
                return

    def _death(self, what: str) -> SandboxError:
        """The worker went away mid-call: say why, from its exit status."""
        proc = self._proc
        try:
            code = proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            code = None
        self._kill()
        output = self._output()
        if code is None:
            return _fail("crashed", f"{what}: the worker closed its channel and was killed", output)
        if code < 0:
            sig = signal.Signals(-code)
            kind = _SIGNAL_KINDS.get(sig, "crashed")
            detail = f"the CPU limit ({self.limits.cpu_s} s per call)" if kind == "cpu" else sig.name
            return _fail(kind, f"{what}: the worker was killed by {detail}", output)
        return _fail("exit", f"{what}: the worker exited with status {code}", output)

    def _output(self) -> str:
        return bytes(self._out).decode("utf-8", "replace")


_PLAIN_TYPES = (bool, int, float, complex, str, list, dict)


class _PlainPickler(pickle.Pickler):
    """Sends plain data only: the worker must never need engine classes to read a request.

    Only objects other than None/bool/int/float/str/bytes/list/tuple/dict/set reach this hook, so it
    costs nothing for plain batches; numpy values (rewards computed with numpy) become plain ones."""

    def reducer_override(self, obj: Any) -> Any:
        if any(obj is t for t in _PLAIN_TYPES):  # the constructors named by the reductions below
            return NotImplemented
        if type(obj).__module__ == "numpy" and hasattr(obj, "tolist"):
            value = obj.tolist()
            return type(value), (value,)
        if isinstance(obj, (str, int, float, list, dict)):  # subclasses (e.g. IntEnum, defaultdict)
            base = next(t for t in _PLAIN_TYPES if isinstance(obj, t))
            return base, (base(obj),)
        raise TypeError(f"a {type(obj).__name__} cannot be sent to a harness (hooks take plain JSON data)")


class _Writer:
    """A file-like sink for the Pickler that writes to the worker within the call's deadline."""

    def __init__(self, sandbox: Sandbox, deadline: float, what: str, timeout: float):
        self.args = (deadline, what, timeout)
        self.sandbox = sandbox

    def write(self, data: bytes) -> int:
        self.sandbox._write(data, *self.args)
        return len(data)


def _reported(reply: dict) -> SandboxFailure:
    """A failure as the worker reported it; the worker is untrusted, so kinds are checked."""
    kind = reply.get("kind")
    kind = kind if kind in KINDS else "crashed"
    return SandboxFailure(kind, str(reply.get("message", ""))[:2000], str(reply.get("output", ""))[:64_000])


def _drain(fd: int, buf: bytearray, cap: int) -> None:
    """Reads the worker's stdout/stderr until EOF, keeping the first ``cap`` bytes."""
    try:
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            if len(buf) < cap:
                buf += chunk[: cap - len(buf)]
    finally:
        os.close(fd)


def _bigger_pipe(fd: int) -> None:
    try:
        # Linux-only (F_SETPIPE_SZ): a platform without it keeps the default pipe size
        import fcntl

        fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ: fewer wake-ups for big batches
    except OSError:
        pass
