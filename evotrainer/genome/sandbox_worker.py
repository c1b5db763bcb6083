"""Sandbox worker: the only process that runs harness code. Started by ``sandbox.Sandbox``.

Run as ``python -I sandbox_worker.py REQ_FD RESP_FD``. It imports nothing from evotrainer (only the
standard library), so it runs the same wherever the engine lives. It is one file on purpose: ``-I``
keeps the script's folder off ``sys.path``, so the worker cannot import a sibling module, and
everything it holds serves one concept, the isolated process (set up isolation, then serve calls).
Protocol: two dedicated pipes of its own (never stdout, so harness prints cannot corrupt it).
Requests are pickles streamed by the engine (trusted data); replies are an 8-byte big-endian length
+ JSON (the engine never unpickles what this process says).

Layers, outermost first (the engine adds the wall-clock kill of the whole process group):
  1. OS: a fresh network namespace (no interfaces but a down loopback), privileges dropped to
     ``nobody`` when started as root, no-new-privs, parent-death signal, rlimits (CPU, address
     space, files, processes, file size, no core), a scrubbed environment, scratch cwd.
  2. An audit hook that, while harness code runs, refuses process creation, signals, ctypes,
     sockets, rlimit changes, frame introspection, new imports outside the allow-list, writes
     outside scratch and reading other processes' /proc entries. Every refusal is recorded, so a
     harness that swallows the exception is still reported as ``forbidden``.
  3. The harness module gets its own builtins (guarded ``__import__``, no open/eval/exec/...) and
     is re-executed for every call; allow-listed modules and builtins are restored after each call,
     so monkeypatching cannot leak into later calls.
"""

import _signal
import builtins
import ctypes
import gc
import io
import json
import math
import os
import pickle
import resource
import struct
import sys
import traceback

HEADER = struct.Struct(">Q")
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
# Builtins a harness has no business with (the static check rejects them too).
REMOVED_BUILTINS = ("open", "eval", "exec", "compile", "breakpoint", "input", "exit", "quit", "help",
                    "globals", "locals", "vars", "memoryview")
DENIED_EVENTS = frozenset({
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill",
    "os.killpg", "os.chdir", "os.putenv", "os.unsetenv", "subprocess.Popen", "pty.spawn",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function", "ctypes.addressof",
    "ctypes.string_at", "ctypes.wstring_at", "ctypes.PyObj_FromPtr", "ctypes.get_errno",
    "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
    "socket.getaddrinfo", "socket.gethostbyname", "resource.setrlimit", "resource.prlimit",
    "sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile", "sys.addaudithook",
    "object.__setattr__", "object.__delattr__", "code.__new__", "function.__new__", "mmap.__new__",
    "sqlite3.connect", "gc.get_referrers", "gc.get_objects", "gc.get_referents", "builtins.input",
})
# "object.__getattr__" also fires for func.__code__ (read by numpy while importing): refuse frames only.
FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"})
PATH_EVENTS = frozenset({"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
                         "os.utime", "os.chflags", "os.lchflags", "os.mkfifo", "os.mknod", "shutil.rmtree"})
TWO_PATH_EVENTS = frozenset({"os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.move"})
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class OutputLimit(BaseException):
    """Raised from print() once the call's output cap is reached (BaseException: hard to swallow)."""


class Forbidden(PermissionError):
    pass


# ---- protocol -------------------------------------------------------------------------------------
def recv(reader):
    """One request: a pickle streamed by the engine (no GC passes while building big batches:
    they would scan every new object for nothing)."""
    gc.disable()
    try:
        return pickle.load(reader)
    finally:
        gc.enable()


def send(fd, obj):
    data = json.dumps(obj, allow_nan=True).encode()
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


# ---- state shared by the audit hook and the call loop ----------------------------------------------
class State:
    active = False          # harness code is running
    scratch = "/"
    allowed = frozenset()
    known_code = ()         # code objects the worker itself executes
    violations = []
    read_roots = ()
    sources = {}            # file name -> source lines, for tracebacks (the worker's own copy)


def violation(message):
    State.violations.append(message)
    raise Forbidden(message)


def _under(path, roots):
    if isinstance(path, int):
        return False
    real = os.path.realpath(os.fsdecode(path))
    return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def _inside_scratch(path):
    return _under(path, (State.scratch,))


def _check_read(path):
    """Reads only from the Python installation, system libraries, scratch and this process."""
    if not _under(path, State.read_roots):
        violation(f"reading {os.fsdecode(path)} (outside the Python installation and scratch) is not allowed")


def audit(event, args):
    if not State.active:
        return
    if event in DENIED_EVENTS:
        violation(f"{event} is not allowed in a harness")
    elif event == "object.__getattr__":
        if len(args) > 1 and args[1] in FRAME_ATTRS:
            violation(f"reading .{args[1]} (interpreter frames) is not allowed in a harness")
    elif event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
            (isinstance(flags, int) and flags & WRITE_FLAGS)
        if isinstance(path, int):
            violation("opening a file descriptor is not allowed")
        if writing and not _inside_scratch(path):
            violation(f"writing {os.fsdecode(path)} (outside the scratch directory) is not allowed")
        _check_read(path)
    elif event in ("os.listdir", "os.scandir"):
        _check_read(args[0] if args and args[0] is not None else ".")
    elif event in PATH_EVENTS:
        if not _inside_scratch(args[0]) or (len(args) > 2 and args[-1] not in (None, -1)):
            violation(f"{event} on {args[0]!r} (outside the scratch directory) is not allowed")
    elif event in TWO_PATH_EVENTS:
        if not (_inside_scratch(args[0]) and _inside_scratch(args[1])):
            violation(f"{event} outside the scratch directory is not allowed")
    elif event == "exec":
        code = args[0] if args else None
        # The worker's own harness modules, or a module of the Python installation being imported
        # lazily (e.g. numpy.polynomial); never code the harness made itself.
        if not (code in State.known_code or (getattr(code, "co_name", "") == "<module>"
                                             and _under(getattr(code, "co_filename", ""), State.read_roots)
                                             and not _inside_scratch(code.co_filename))):
            violation("exec() is not allowed in a harness")
    elif event == "compile":
        violation("compile() is not allowed in a harness")
    elif event == "import":
        if str(args[0]).split(".")[0] not in State.allowed:
            violation(f"import of {args[0]!r} is not allowed (allowed: {', '.join(sorted(State.allowed))})")


def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level or name.split(".")[0] not in State.allowed:
        violation(f"import of {name!r} is not allowed (allowed: {', '.join(sorted(State.allowed))})")
    return __import__(name, globals, locals, fromlist, level)


class ImportGuard:
    """First meta-path finder: refuses new imports outside the allow-list while harness code runs.

    The "import" audit event does not fire for ``importlib.import_module``; this does."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if State.active and name.split(".")[0] not in State.allowed:
            violation(f"import of {name!r} is not allowed (allowed: {', '.join(sorted(State.allowed))})")
        return None


# ---- process set-up -----------------------------------------------------------------------------
def isolate(init):
    """Namespaces, privileges and rlimits; returns the features that took effect."""
    features = {}
    libc = ctypes.CDLL(None, use_errno=True)
    if init["isolate_network"]:
        if libc.unshare(CLONE_NEWNET) == 0:
            features["netns"] = True
        elif os.geteuid() != 0 and libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
            uid, gid = os.getuid(), os.getgid()
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
            features["netns"] = "userns"
        else:
            features["netns"] = False
    # Import what harness code may use while we can still read every file (before the uid drop).
    for mod in sorted(State.allowed) + ["numpy.random", "numpy.linalg", "numpy.fft"]:
        try:
            __import__(mod)
        except Exception:
            pass
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if init.get("uid") is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setgid(init["gid"])
        os.setuid(init["uid"])
        features["uid"] = init["uid"]
    # After the uid change (which clears it): die with the engine. The signal follows the engine
    # *thread* that spawned us, so it is only armed for the main thread; otherwise the worker
    # still ends on EOF of its request pipe, or by its CPU limit.
    if init["pdeathsig"]:
        libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    if os.getppid() != init["engine_pid"]:
        os._exit(70)
    lim = init["limits"]
    mb = 1 << 20
    for res, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_AS, lim["memory_mb"] * mb),
                       (resource.RLIMIT_NOFILE, lim["nofile"]), (resource.RLIMIT_NPROC, lim["nproc"]),
                       (resource.RLIMIT_FSIZE, lim["fsize_mb"] * mb)):
        resource.setrlimit(res, (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu_s"] + 1, lim["cpu_lifetime_s"]))
    features["rlimits"] = True
    return features


def cpu_budget(seconds, hard):
    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(used.ru_utime + used.ru_stime) + seconds
    resource.setrlimit(resource.RLIMIT_CPU, (min(soft, hard), hard))


# ---- running harness code ----------------------------------------------------------------------
class Capture(io.TextIOBase):
    def __init__(self, cap):
        self.cap, self.parts, self.size, self.overflow = cap, [], 0, False

    def write(self, s):
        s = str(s)
        if self.size + len(s) > self.cap:
            self.parts.append(s[: self.cap - self.size])
            self.size = self.cap
            self.overflow = True
            raise OutputLimit()
        self.parts.append(s)
        self.size += len(s)
        return len(s)

    def text(self):
        return "".join(self.parts)


class NotJSON(TypeError):
    pass


def plain(x, depth=0):
    """Harness result -> plain JSON data (numpy values via tolist); raises NotJSON otherwise."""
    if depth > 32:
        raise NotJSON("the result is nested too deeply")
    t = type(x)
    if x is None or t in (bool, int, float, str):
        return x
    if t in (list, tuple):
        if all(type(v) is float for v in x):
            return list(x)  # the common case (rewards, advantages), at C speed
        return [plain(v, depth + 1) for v in x]
    if t is dict:
        if not all(type(k) is str for k in x):
            raise NotJSON("the result has a dict key that is not a string")
        return {k: plain(v, depth + 1) for k, v in x.items()}
    if (getattr(t, "__module__", "") or "").split(".")[0] == "numpy" and hasattr(x, "tolist"):
        return plain(x.tolist(), depth + 1)
    raise NotJSON(f"the result holds a {t.__name__}, which is not JSON data")


# The worker's own modules: a harness that patches them (after an escape) must not get its code
# run by the worker outside harness mode, when the audit hook is off.
OWN_MODULES = ("builtins", "json", "json.encoder", "json.decoder", "pickle", "io", "os", "posixpath", "struct",
               "resource", "traceback", "gc", "_signal", "_thread", "math", "linecache")


def snapshot():
    names = [n for n in sys.modules if n.split(".")[0] in State.allowed or n in OWN_MODULES]
    mods = {n: sys.modules[n] for n in names}
    handlers = {s: _signal.getsignal(s) for s in _signal.valid_signals() if s not in (9, 19)}
    return mods, {n: dict(vars(m)) for n, m in mods.items()}, handlers


def restore(snap):
    """Undoes what a call may have changed: module attributes, signal handlers, timers; whether a
    module had changed."""
    mods, dicts, handlers = snap
    changed = False
    for name, mod in mods.items():
        if sys.modules.get(name) is not mod:
            sys.modules[name] = mod
            changed = True
        d, saved = vars(mod), dicts[name]
        if len(d) != len(saved) or any(d.get(k, d) is not v for k, v in saved.items()):
            d.clear()
            d.update(saved)
            changed = True
    _signal.alarm(0)
    for timer in (_signal.ITIMER_REAL, _signal.ITIMER_VIRTUAL, _signal.ITIMER_PROF):
        _signal.setitimer(timer, 0)
    for sig, handler in handlers.items():
        if _signal.getsignal(sig) is not handler and handler is not None:
            _signal.signal(sig, handler)
    return changed


def load(code, harness_builtins):
    g = {"__name__": "harness", "__builtins__": dict(harness_builtins)}
    exec(code, g)
    return g


def failure(kind, message, output=""):
    return {"ok": False, "kind": kind, "message": message, "output": output}


KINDS = ((MemoryError, "memory"), (RecursionError, "recursion"), (SystemExit, "exit"), (OutputLimit, "output_limit"))


def described(exc):
    """What the report needs from a harness's exception, read while the guard is on: its kind, type
    name, message and traceback. Each read may run harness code (``__str__``, a metaclass's
    ``__name__``, a ``__getattribute__``); after this, only C objects and exact strings are left."""
    kind = next((k for cls, k in KINDS if issubclass(type(exc), cls)), "exception")
    try:
        text = str.__str__(repr(exc.code) if kind == "exit" else str(exc))   # an exact str: no harness methods
    except BaseException:  # noqa: BLE001 - the harness's __str__ raised (a violation is counted already)
        text = "(its message could not be formatted)"
    try:
        tname = str.__str__(type(exc).__name__)
    except BaseException:  # noqa: BLE001
        tname = "Exception"
    try:
        tb = BaseException.__traceback__.__get__(exc)   # the slot itself, past any __getattribute__
    except BaseException:  # noqa: BLE001
        tb = None
    return kind, tname, text, tb


def classify(kind, tname, text, tb, name, sources):
    """(kind, message, traceback text). Runs off the guard (reading frames is forbidden under it), so
    it calls nothing a harness could have patched: no traceback or linecache module, only traceback,
    frame and code objects (C types) and the worker's own copies of the harness sources."""
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append((str.__str__(code.co_filename), tb.tb_lineno, str.__str__(code.co_name)))
        tb = tb.tb_next
    frames = [f for f in frames if f[0] != __file__][-20:]
    shown = []
    for filename, lineno, fn in frames:
        shown.append(f'  File "{filename}", line {lineno}, in {fn}\n')
        lines = sources.get(filename)
        if lines and 0 < lineno <= len(lines):
            shown.append(f"    {lines[lineno - 1].strip()}\n")
    trace = "Traceback (most recent call last, harness frames):\n" + "".join(shown) + f"{tname}: {text}\n"
    where = [lineno for filename, lineno, _ in frames if filename == name]
    at = f" (line {where[-1]})" if where else ""
    if kind == "memory":
        return "memory", f"MemoryError{at}: the address-space limit was reached", trace
    if kind == "recursion":
        return "recursion", f"RecursionError{at}: {text}", trace
    if kind == "exit":
        return "exit", f"the harness called exit({text}){at}", trace
    if kind == "output_limit":
        return "output_limit", "the harness printed more than the output cap", ""
    return "exception", f"{tname}{at}: {text}", trace


def guarded_run(thunk, init, snap):
    """Runs harness code under the guards; returns the response (never raises)."""
    capture = Capture(init["limits"]["output_bytes"])
    State.violations = []
    cpu_budget(init["limits"]["cpu_s"], init["limits"]["cpu_lifetime_s"])
    sys.stdout = sys.stderr = capture
    result, about, report = None, None, None
    State.active = True
    try:
        result = plain(thunk())
    except NotJSON as e:
        report = ("bad_result", str(e), "")
    except BaseException as e:  # everything the harness does is reported, never fatal here
        about = described(e)
    State.active = False
    if about is not None:   # the worker's own code reads the frames: off the guard, which forbids that
        report = classify(*about, init["name"], State.sources)
    State.active = True
    try:
        # Harness code runs after the call too: the __del__ of its frames' locals as the traceback
        # goes, of what it left in modules as they are restored, of cycles as they are collected. A
        # finaliser that changes a module again is undone by the next round.
        about = None
        restore(snap)
        for _ in range(3):
            gc.collect()
            if not restore(snap):
                break
        else:
            State.violations.append("a finaliser kept changing modules after the call")
    except BaseException:  # noqa: BLE001 - a violation raised in a finaliser is counted in State.violations
        pass
    finally:
        State.active = False
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    if len(os.listdir(f"/proc/{os.getpid()}/task")) > 1:  # threads would outlive the call, audit hook off
        State.violations.append("starting threads is not allowed in a harness")
    output = capture.text()
    if capture.overflow:
        return failure("output_limit", f"the harness printed more than {capture.cap} characters", output)
    if State.violations:
        return failure("forbidden", State.violations[0], output)
    if report is not None:
        kind, message, trace = report
        return failure(kind, message, (output + "\n" + trace).strip())
    return {"ok": True, "result": result, "output": output}


def main():
    req_fd, resp_fd = int(sys.argv[1]), int(sys.argv[2])
    reader = os.fdopen(req_fd, "rb", buffering=1 << 20)
    init = recv(reader)
    State.scratch = os.path.realpath(os.getcwd())
    State.allowed = frozenset(init["allowed"])
    pid = os.getpid()
    State.read_roots = tuple(sorted({os.path.realpath(p) for p in (
        State.scratch, sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path, "/usr/lib", "/usr/share",
        "/lib", "/lib64", "/dev/null", "/dev/urandom", f"/proc/{pid}") if p}))
    features = isolate(init)
    try:
        codes = [compile(init["source"], init["name"], "exec"),
                 compile(init["reference"], "reference_harness.py", "exec")]
    except SyntaxError as e:
        send(resp_fd, failure("contract", f"syntax error at line {e.lineno}: {e.msg}"))
        return
    State.known_code = tuple(codes)
    # Source lines for the report's traceback, kept by the worker itself (linecache is a module a
    # harness could patch, and the traceback is formatted with the guard off).
    State.sources = {init["name"]: init["source"].splitlines(), "reference_harness.py": init["reference"].splitlines()}
    harness_builtins = {k: v for k, v in vars(builtins).items() if k not in REMOVED_BUILTINS}
    harness_builtins["__import__"] = guarded_import
    sys.addaudithook(audit)
    sys.meta_path.insert(0, ImportGuard)
    snap = snapshot()
    gc.freeze()  # the imported modules never need collecting: keeps later GC passes short

    def hook(name):
        own = load(codes[0], harness_builtins)  # a fresh module per call: no state leaks between calls
        if callable(own.get(name)):
            return own[name]
        ref = load(codes[1], harness_builtins)
        if isinstance(own.get("KNOBS"), dict):  # a fallback hook follows the genome's knobs
            ref["KNOBS"] = {**ref["KNOBS"], **own["KNOBS"]}
        return ref[name]

    # Import the harness once up front: a module that fails to load breaks the contract.
    ready = guarded_run(lambda: load(codes[0], harness_builtins) and None, init, snap)
    if not ready["ok"]:
        if ready["kind"] == "exception":
            ready["kind"], ready["message"] = "contract", "loading the harness failed: " + ready["message"]
        send(resp_fd, ready)
        return
    send(resp_fd, {"ok": True, "features": features, "pid": os.getpid()})
    while True:
        try:
            req = recv(reader)
        except EOFError:
            return
        if req.get("op") == "close":
            return
        send(resp_fd, guarded_run(lambda req=req: hook(req["hook"])(*req["args"]), init, snap))


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        traceback.print_exc()
        os._exit(70)
    os._exit(0)  # no atexit handlers or finalizers: a harness may have registered some
