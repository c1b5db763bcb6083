"""The program's process: a fork of the worker, confined, that runs policy code (standard library only).

``child`` never returns. Before any program code it takes its own process group, closes every
inherited descriptor, moves to a fresh scratch directory, drops to ``nobody`` (when the engine is
root), sets no-new-privs, a parent-death signal and rlimits (CPU, address space, no processes or
threads, open files, file size, no core), and installs an audit hook that refuses, and records as
tamper flags, reading outside the standard library, writing outside scratch, processes, signals,
sockets, ctypes and heap introspection. Function programs then serve calls (arguments in, a tagged
return value out); stdin/stdout programs run once per test. What this process reports is never
trusted for a verdict (see exec_worker's docstring): only its return values are compared, by the
checker, against values it never saw.
"""

import builtins
import ctypes
import os
import resource
import sys

from exec_protocol import Unplain, recv, send, tag

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
# Imported by the worker before any fork, so programs get them warm (and need not read files to
# import them; on some hosts the standard library is not readable by ``nobody`` at all).
PRELOAD = ("math", "cmath", "string", "re", "collections", "collections.abc", "itertools", "functools",
           "heapq", "bisect", "typing", "statistics", "fractions", "decimal", "random", "operator", "copy",
           "array", "datetime", "hashlib", "textwrap", "unicodedata", "dataclasses", "enum", "numbers", "io",
           "json", "time", "queue", "pprint", "struct", "base64", "calendar", "abc", "contextlib", "threading")
DENIED = {"subprocess.Popen": "process", "os.system": "process", "os.exec": "process", "os.posix_spawn": "process",
          "os.spawn": "process", "os.fork": "process", "os.forkpty": "process", "pty.spawn": "process",
          "os.kill": "signal", "os.killpg": "signal", "signal.pthread_kill": "signal",
          "socket.__new__": "network", "socket.connect": "network", "socket.bind": "network",
          "socket.getaddrinfo": "network", "ctypes.dlopen": "ctypes", "ctypes.dlsym": "ctypes",
          "ctypes.cdata": "ctypes", "ctypes.call_function": "ctypes", "ctypes.string_at": "ctypes",
          "gc.get_objects": "introspection", "gc.get_referrers": "introspection",
          "gc.get_referents": "introspection", "sys._current_frames": "introspection",
          "resource.setrlimit": "rlimit", "resource.prlimit": "rlimit", "sys.addaudithook": "introspection"}
# Importing these is refused outright (they exist to reach the network, other processes or raw memory).
DENIED_MODULES = {"socket": "network", "_socket": "network", "ssl": "network", "urllib": "network", "http": "network",
                  "requests": "network", "subprocess": "process", "multiprocessing": "process", "pty": "process",
                  "_posixsubprocess": "process", "ctypes": "ctypes", "_ctypes": "ctypes"}
PATCH_WATCH = ("builtins", "sys", "os", "math", "operator", "json", "io", "unittest")
FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"})
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
LIBC = ctypes.CDLL(None, use_errno=True)  # opened once in the worker, not in every forked child


class Guard:
    active = False
    flags = []
    scratch = "/"
    read_roots = ()
    deny_roots = ()


def flag(kind, detail):
    if len(Guard.flags) < 32:
        Guard.flags.append(f"{kind}: {detail}"[:200])
    raise PermissionError(f"{detail} is not allowed when grading")


def readable(path):
    return _under(path, Guard.read_roots) and not _under(path, Guard.deny_roots)


def _under(path, roots):
    real = os.path.realpath(os.fsdecode(path))
    return any(real == r or real.startswith(r + os.sep) for r in roots)


class FrameDenied(ValueError):
    """sys._getframe refused. A ValueError, which the standard library's callers (namedtuple, enum,
    typing) already catch, so honest code keeps working; no flag for it, for the same reason."""


def audit(event, args):
    if not Guard.active:
        return
    kind = DENIED.get(event)
    if kind:
        flag(kind, event)
    if event == "sys._getframe":
        raise FrameDenied("frames are not available when grading")
    if event == "object.__getattr__":
        if len(args) > 1 and args[1] in FRAME_ATTRS:
            flag("introspection", f"reading .{args[1]}")
    elif event == "import":
        top = str(args[0]).split(".")[0]
        if top in DENIED_MODULES:
            flag(DENIED_MODULES[top], f"import {top}")
    elif event == "open":
        path, mode, flags = args
        if isinstance(path, int):
            if path > 2:
                flag("file_read", f"opening descriptor {path}")
            return
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
            (isinstance(flags, int) and flags & WRITE_FLAGS)
        if writing and not _under(path, (Guard.scratch,)):  # scratch is the program's own: no flag
            flag("file_write", f"writing {os.fsdecode(path)} outside scratch")
        elif not readable(path):
            flag("file_read", f"reading {os.fsdecode(path)}")
    elif event in ("os.listdir", "os.scandir", "glob.glob", "os.chdir"):
        path = args[0] if args and args[0] is not None else "."
        if not isinstance(path, int) and not readable(path):
            flag("file_read", f"listing {os.fsdecode(path)}")
    elif event in ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.truncate", "shutil.rmtree"):
        if not _under(args[0], (Guard.scratch,)):
            flag("file_write", f"{event} on {args[0]!r}")


def module_snapshot():
    # A few modules only: copying every preloaded module's dict touches (and so copies, after the
    # fork) thousands of pages; these are the ones a checker-patching trick goes for.
    mods = {n: sys.modules[n] for n in PATCH_WATCH if n in sys.modules}
    return mods, {n: dict(vars(m)) for n, m in mods.items()}


def patched(snap):
    """Names of preloaded modules whose attributes the program replaced (monkeypatching)."""
    mods, saved = snap
    return sorted(n for n, m in mods.items()
                  if sys.modules.get(n) is not m or any(vars(m).get(k, vars(m)) is not v for k, v in saved[n].items()))


def confine(init, scratch):
    """In the forked child, before any program code: group, descriptors, user, limits, audit hook."""
    os.setpgid(0, 0)
    os.chdir(scratch)
    if init.get("uid") is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setgid(init["gid"])
        os.setuid(init["uid"])
    LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    LIBC.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    lim, mb = init["limits"], 1 << 20
    for res, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_AS, lim["memory_mb"] * mb),
                       (resource.RLIMIT_NOFILE, lim["nofile"]), (resource.RLIMIT_NPROC, 1 if os.geteuid() else 0),
                       (resource.RLIMIT_FSIZE, lim["fsize_mb"] * mb)):
        resource.setrlimit(res, (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu_s"], lim["cpu_s"] + 1))
    for name in [m for m in sys.modules if m.split(".")[0] in DENIED_MODULES or m.startswith("exec_")]:
        del sys.modules[name]  # importing them again reaches the audit hook (and the worker's own: nothing)
    import _thread
    import threading

    def no_threads(*args, **kwargs):  # no audit event covers threads; RLIMIT_NPROC refuses them anyway
        flag("process", "starting a thread")
    _thread.start_new_thread = threading._start_new_thread = no_threads
    Guard.scratch = os.getcwd()  # the folder we just entered (its path may be under a hidden mount)
    Guard.read_roots = tuple(init["read_roots"]) + (Guard.scratch,)
    Guard.deny_roots = tuple(init["deny_roots"])
    Guard.flags = []
    sys.addaudithook(audit)


def child(init, job, scratch, ctl_r, rep_w, stdin_r, stdout_w):
    """The program's process (never returns). Function jobs serve calls; stdio jobs run once."""
    try:
        keep = {ctl_r, rep_w}
        null = os.open("/dev/null", os.O_RDWR)
        os.dup2(stdin_r if stdin_r is not None else null, 0)
        os.dup2(stdout_w if stdout_w is not None else null, 1)
        os.dup2(null, 2)
        lo, hi = sorted(keep)
        os.closerange(3, lo)  # every descriptor of the worker (the engine's pipe included) but ours
        os.closerange(lo + 1, hi)
        os.closerange(hi + 1, 1 << 16)
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        confine(init, scratch)
        if job["kind"] == "stdio":
            serve_stdio(job, ctl_r, rep_w)
        else:
            serve_calls(job, ctl_r, rep_w)
    except BaseException:
        os._exit(71)
    os._exit(0)


def _error(e):
    Guard.active = True  # str() of the program's exception runs the program's code: still guarded
    try:
        msg = str(e)[:300]
    except BaseException:
        msg = "(the exception could not be printed)"
    Guard.active = False
    return {"ok": False, "etype": type(e).__name__, "msg": msg, "flags": Guard.flags}


def _load(source):
    """Compiles and runs the program's module code; (globals, None) or (None, error reply)."""
    try:
        code = compile(source, "solution.py", "exec")
    except (SyntaxError, ValueError) as e:
        return None, {"ok": False, "etype": "SyntaxError", "msg": str(e)[:300], "flags": [], "syntax": True}
    g = {"__name__": "solution", "__builtins__": builtins}
    snap = module_snapshot()
    Guard.active = True
    try:
        exec(code, g)
    except BaseException as e:  # anything the program raises is its verdict, never the worker's
        Guard.active = False
        return None, _error(e)
    Guard.active = False
    for name in patched(snap):
        Guard.flags.append(f"monkeypatch: {name}")
    return g, None


def serve_calls(job, ctl_r, rep_w):
    g, err = _load(job["program"])
    if err is None and not callable(g.get(job["entry"])) and isinstance(g.get("Solution"), type):
        Guard.active = True   # Solution() and its attributes are the program's code: guarded like any call
        try:  # LeetCode-style starter code: the function is a method of class Solution
            g[job["entry"]] = getattr(g["Solution"](), job["entry"])
            Guard.active = False
        except BaseException as e:  # its failure is the program's verdict
            Guard.active = False
            err = _error(e)
    if err is None and not callable(g.get(job["entry"])):
        err = {"ok": False, "etype": "NameError", "msg": f"the program defines no function {job['entry']!r}",
               "flags": Guard.flags}
    send(rep_w, {**(err or {"ok": True, "flags": Guard.flags}), "nonce": job.get("nonce")})
    if err:
        return
    fn = g[job["entry"]]
    snap = module_snapshot()
    while True:
        msg = recv(ctl_r)
        if msg is None:
            return
        if msg.get("done"):  # the last call is over: look for patched modules once, not per call
            Guard.flags.extend(f"monkeypatch: {name}" for name in patched(snap))
            send(rep_w, {"ok": True, "flags": Guard.flags, "nonce": msg.get("nonce")})
            return
        Guard.active = True
        try:
            value = fn(*msg["args"])
            Guard.active = False
            reply = {"ok": True, "value": tag(value), "flags": Guard.flags}
        except Unplain as e:
            Guard.active = False
            reply = {"ok": False, "etype": "BadReturn", "msg": f"returned a {e.tname}, not plain data",
                     "eq": e.eq, "flags": Guard.flags}
        except BaseException as e:
            Guard.active = False
            reply = _error(e)
        reply["nonce"] = msg.get("nonce")   # echoed: the checker knows this reply answers its request
        send(rep_w, reply)


def serve_stdio(job, ctl_r, rep_w):
    if recv(ctl_r) is None:  # wait for "go": the clock starts with the input
        return
    g, err = _load(job["program"])
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    if err and err["etype"] == "SystemExit":
        err = None  # exit() ends a stdin/stdout program normally
    send(rep_w, err or {"ok": True, "flags": Guard.flags})
