"""Sandbox worker: the only process that runs harness code. Started by ``sandbox.Sandbox``.

Run as ``python -I sandbox_worker.py REQ_FD RESP_FD``. It imports nothing from evotrainer (only the
standard library), so it runs the same wherever the engine lives. Its parts are sibling modules:
``sandbox_guard`` (the audit hook and import guards that hold while harness code runs) and
``sandbox_outcome`` (a call's captured output, JSON result or failure report); this file sets up
the isolated process and serves calls.
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
     harness that swallows the exception is still reported as ``forbidden`` (``sandbox_guard``).
  3. The harness module gets its own builtins (guarded ``__import__``, no open/eval/exec/...) and
     is re-executed for every call; allow-listed modules and builtins are restored after each call,
     so monkeypatching cannot leak into later calls.
"""

import _signal
import builtins
import ctypes
import gc
import json
import math
import os
import pickle
import resource
import struct
import sys
import traceback

# `python -I` keeps this folder off sys.path; the worker's own sibling modules (standard library
# only) are imported from it, and the folder is dropped again before the read roots are taken and
# before any harness code runs.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sandbox_guard  # noqa: E402
import sandbox_outcome  # noqa: E402
from sandbox_guard import ImportGuard, State, audit, violation  # noqa: E402
from sandbox_outcome import Capture, NotJSON, classify, described, failure, plain  # noqa: E402

del sys.path[0]
# The worker's own files: their frames are left out of a failing hook's traceback.
WORKER_FILES = frozenset({__file__, sandbox_guard.__file__, sandbox_outcome.__file__})
HEADER = struct.Struct(">Q")
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
# Builtins a harness has no business with (the static check rejects them too).
REMOVED_BUILTINS = ("open", "eval", "exec", "compile", "breakpoint", "input", "exit", "quit", "help",
                    "globals", "locals", "vars", "memoryview")


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


# run by the worker outside harness mode, when the audit hook is off.
OWN_MODULES = ("builtins", "json", "json.encoder", "json.decoder", "pickle", "io", "os", "posixpath", "struct",
               "resource", "traceback", "gc", "_signal", "_thread", "math", "linecache", "sandbox_guard",
               "sandbox_outcome")


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


def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    """The harness's own ``__import__``: no relative imports, none outside the allow-list."""
    if level or name.split(".")[0] not in State.allowed:
        violation(f"import of {name!r} is not allowed (allowed: {', '.join(sorted(State.allowed))})")
    return __import__(name, globals, locals, fromlist, level)


def load(code, harness_builtins):
    g = {"__name__": "harness", "__builtins__": dict(harness_builtins)}
    exec(code, g)
    return g


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
        report = classify(*about, init["name"], State.sources, WORKER_FILES)
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
