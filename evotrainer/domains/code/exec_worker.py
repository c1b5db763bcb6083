"""Code execution worker: the only process that grades policy-written programs. Started by ``executor``.

Run as ``python -I exec_worker.py REQ_FD RESP_FD``. Standard library only, one file on purpose
(``-I`` keeps its folder off ``sys.path``). Messages both ways: an 8-byte big-endian length + JSON.

The grading rule that makes results unforgeable: **the program never sees an expected value and
never judges itself.** For each job the worker forks the program's processes *first* (they inherit
nothing of the tests, which have not arrived yet), then receives the tests and runs the trusted
checker code here, where ``candidate`` is a proxy: each call sends its arguments to the program's
process and gets back the return value as tagged JSON of exact builtin types only. So an object that
overrides ``__eq__``, a patched ``AssertionError`` or ``builtins``, a ``sys.exit(0)`` before the
asserts, a forged reply on the pipe: none of them reaches the comparison, which happens here on
plain data. A program that exits early leaves its remaining tests ``not_run`` (never a pass).

Isolation of the program's process (the worker itself sits in a fresh network namespace):
process group of its own (the worker kills the group), every inherited descriptor closed, fresh
scratch cwd, uid ``nobody`` when the engine is root, no-new-privs, rlimits (CPU, address space,
processes: no forks, open files, file size, no core), the scrubbed environment of the worker, and an
audit hook that refuses (and records as tamper flags) reading outside the standard library, writing
outside scratch, processes, signals, sockets, ctypes and heap introspection.
"""

import builtins
import ctypes
import gc
import json
import math
import os
import resource
import select
import signal
import struct
import sys
import time

HEADER = struct.Struct(">Q")
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
# Imported before any fork, so programs get them warm (and need not read files to import them).
# (On some hosts the standard library is not readable by ``nobody`` at all: then these are all there is.)
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
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
MAX_DEPTH = 64
LIBC = ctypes.CDLL(None, use_errno=True)  # opened once here, not in every forked child


# ---- messages ------------------------------------------------------------------------------------
def send(fd, obj):
    data = json.dumps(obj).encode()
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def read_exact(fd, n, deadline=None):
    """n bytes from fd; None on EOF; raises TimeoutError past the deadline."""
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def recv(fd, deadline=None, cap=None):
    head = read_exact(fd, HEADER.size, deadline)
    if head is None:
        return None
    size = HEADER.unpack(head)[0]
    if cap is not None and size > cap:
        raise OverflowError(size)
    raw = read_exact(fd, size, deadline)
    return None if raw is None else json.loads(raw, object_hook=untag)


# ---- values: tagged JSON of exact builtin types ----------------------------------------------------
class Unplain(TypeError):
    def __init__(self, tname, eq):
        super().__init__(tname)
        self.tname, self.eq = tname, eq


def tag(x, depth=0):
    """x as JSON data with tags for tuple/set/dict/bytes/non-finite floats; exact types only, so a
    subclass of int or str that overrides __eq__ is refused like any other object."""
    t = type(x)
    if depth > MAX_DEPTH:
        raise Unplain("a structure nested too deeply", False)
    if x is None or t is bool or t is int or t is str:
        return x
    if t is float:
        return x if math.isfinite(x) else {"$f": repr(x)}
    if t is list:
        return [tag(v, depth + 1) for v in x]
    if t is tuple:
        return {"$t": [tag(v, depth + 1) for v in x]}
    if t is set or t is frozenset:
        return {"$s": [tag(v, depth + 1) for v in x]}
    if t is dict:
        return {"$d": [[tag(k, depth + 1), tag(v, depth + 1)] for k, v in x.items()]}
    if t is bytes:
        return {"$b": x.hex()}
    eq = any(name in vars(k) for k in t.__mro__ if k is not object for name in ("__eq__", "__ne__", "__hash__"))
    raise Unplain(t.__name__, eq)


def untag(d):
    if len(d) == 1:
        (k, v), = d.items()
        if k == "$t":
            return tuple(v)
        if k == "$s":
            return set(v)
        if k == "$d":
            return {(tuple(a) if type(a) is list else a): b for a, b in v}
        if k == "$f":
            return float(v)
        if k == "$b":
            return bytes.fromhex(v)
    return d


# ---- the program's process ---------------------------------------------------------------------
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


def audit(event, args):
    if not Guard.active:
        return
    kind = DENIED.get(event)
    if kind:
        flag(kind, event)
    if event == "import":
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
        if writing:
            if not _under(path, (Guard.scratch,)):
                flag("file_write", f"writing {os.fsdecode(path)} outside scratch")
            Guard.flags.append(f"file_write: {os.fsdecode(path)} (in scratch)"[:200])
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
    for name in [m for m in sys.modules if m.split(".")[0] in DENIED_MODULES]:
        del sys.modules[name]  # so that importing them again reaches the audit hook
    import _thread
    import threading

    def no_threads(*args, **kwargs):  # no audit event covers threads; RLIMIT_NPROC refuses them anyway
        flag("process", "starting a thread")
    _thread.start_new_thread = threading._start_new_thread = no_threads
    Guard.scratch = os.path.realpath(scratch)
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
    return {"ok": False, "etype": type(e).__name__, "msg": str(e)[:300], "flags": Guard.flags}


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
        try:  # LeetCode-style starter code: the function is a method of class Solution
            g[job["entry"]] = getattr(g["Solution"](), job["entry"])
        except BaseException:
            pass
    if err is None and not callable(g.get(job["entry"])):
        err = {"ok": False, "etype": "NameError", "msg": f"the program defines no function {job['entry']!r}",
               "flags": Guard.flags}
    send(rep_w, err or {"ok": True, "flags": Guard.flags})
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
            send(rep_w, {"ok": True, "flags": Guard.flags})
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


# ---- the worker ----------------------------------------------------------------------------------
def isolate(init):
    features = {}
    libc = LIBC
    if init["isolate_network"]:
        if libc.unshare(CLONE_NEWNET) == 0:
            features["netns"] = True
        elif os.geteuid() != 0 and libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
            uid, gid = os.getuid(), os.getgid()
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
            features["netns"] = "userns"
            init["uid"] = None  # inside a user namespace there is no other user to drop to
        else:
            features["netns"] = False
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # same-uid programs cannot ptrace or read our memory
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    for mod in PRELOAD:
        __import__(mod)
    features["uid"] = init.get("uid")
    return features


class Proc:
    """One forked process of the program and the worker's ends of its pipes."""

    def __init__(self, pid, ctl_w, rep_r, in_w, out_r):
        self.pid, self.ctl_w, self.rep_r, self.in_w, self.out_r = pid, ctl_w, rep_r, in_w, out_r
        self.status = None

    def close_input(self):
        if self.in_w is not None:
            os.close(self.in_w)
            self.in_w = None


def spawn(init, job, scratch, stdio):
    """Forks one process of the program."""
    ctl_r, ctl_w = os.pipe()
    rep_r, rep_w = os.pipe()
    in_r, in_w = os.pipe() if stdio else (None, None)
    out_r, out_w = os.pipe() if stdio else (None, None)
    pid = os.fork()
    if pid == 0:
        child(init, job, scratch, ctl_r, rep_w, in_r, out_w)
    try:
        os.setpgid(pid, pid)  # also here: the group exists before we might need to kill it
    except OSError:
        pass
    for fd in (ctl_r, rep_w, in_r, out_w):
        if fd is not None:
            os.close(fd)
    return Proc(pid, ctl_w, rep_r, in_w, out_r)


def reap(proc):
    """Kills the process group (once) and returns how the process ended: 'exit:N', 'signal:NAME'."""
    if proc.status is not None:
        return proc.status
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    _, status = os.waitpid(proc.pid, 0)
    proc.close_input()
    for fd in (proc.ctl_w, proc.rep_r, proc.out_r):
        if fd is not None:
            os.close(fd)
    if os.WIFSIGNALED(status):
        proc.status = "signal:" + signal.Signals(os.WTERMSIG(status)).name
    else:
        proc.status = f"exit:{os.WEXITSTATUS(status)}"
    return proc.status


def died(status):
    """A verdict for a process that ended without replying."""
    if status in ("signal:SIGXCPU", "signal:SIGKILL"):
        return {"verdict": "timeout", "error": "CPU time limit"}
    if status in ("signal:SIGSEGV", "signal:SIGABRT", "signal:SIGBUS"):
        return {"verdict": "memory", "error": status}
    if status == "signal:SIGXFSZ":
        return {"verdict": "runtime_error", "error": "file size limit"}
    return {"verdict": "exit", "error": f"the program ended ({status}) before its tests finished"}


# ---- the trusted checker -------------------------------------------------------------------------
class Fatal(BaseException):
    """The program's process is gone (timeout, exit, crash): no later test can run. BaseException,
    so no ``except Exception`` in test code can turn it into a pass."""


class ProgramError(BaseException):
    def __init__(self, reply):
        super().__init__(reply.get("etype"))
        self.reply = reply


class Proxy:
    """``candidate`` in the checker's namespace: a call runs in the program's process."""

    def __init__(self, proc, limits):
        self.proc, self.limits = proc, limits
        self.dead = None
        self.flags = []
        self.deadline = None

    def reply(self):
        try:
            msg = recv(self.proc.rep_r, self.deadline, self.limits["reply_bytes"])
        except TimeoutError:
            self.dead = {"verdict": "timeout", "error": f"no reply within {self.limits['timeout_s']} s"}
            raise Fatal() from None
        except OverflowError as e:
            self.dead = {"verdict": "output_limit", "error": f"a {e.args[0]}-byte return value"}
            raise Fatal() from None
        except Exception:  # bytes the program forged on its pipe: never data, a tamper
            self.flags = self.flags + ["channel: a malformed reply on the result pipe"]
            self.dead = {"verdict": "runtime_error", "error": "malformed reply"}
            raise Fatal() from None
        if msg is None:
            self.dead = died(reap(self.proc))
            raise Fatal()
        if not isinstance(msg, dict):
            self.dead = {"verdict": "runtime_error", "error": "malformed reply"}
            raise Fatal()
        flags = msg.get("flags")
        if isinstance(flags, list):
            self.flags = [str(f)[:200] for f in flags[:32]]
        return msg

    def __call__(self, *args):
        if self.dead:
            raise Fatal()
        try:
            send(self.proc.ctl_w, {"args": tag(list(args))})
        except OSError:
            self.dead = died(reap(self.proc))
            raise Fatal() from None
        msg = self.reply()
        if msg.get("ok") is True:
            return msg.get("value")
        raise ProgramError(msg)


def same(got, want):
    """Equality for data-driven tests (JSON has no tuples): tuples as lists, floats within 1e-6."""
    if isinstance(got, tuple):
        got = list(got)
    if isinstance(want, tuple):
        want = list(want)
    if type(got) is float or type(want) is float:
        return type(got) in (int, float) and type(want) in (int, float) and \
            math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-6)
    if type(got) is list and type(want) is list:
        return len(got) == len(want) and all(same(a, b) for a, b in zip(got, want))
    return type(got) is not bool and type(want) is not bool and got == want or \
        (type(got) is bool and type(want) is bool and got == want)


def program_error(reply):
    """The verdict of a call that raised inside the program."""
    etype = str(reply.get("etype"))[:80]
    v = {"verdict": "runtime_error", "error": f"{etype}: {str(reply.get('msg', ''))[:200]}", "etype": etype}
    if reply.get("syntax"):
        v["verdict"] = "syntax_error"
    elif etype == "MemoryError":
        v["verdict"] = "memory"
    elif etype == "BadReturn":
        v["verdict"] = "bad_return"
    return v


def grade_calls(proc, job, tests, limits):
    proxy = Proxy(proc, limits)
    proxy.deadline = time.monotonic() + limits["load_timeout_s"]
    verdicts, extra = [], []
    try:
        load = proxy.reply()
        load_fail = None if load.get("ok") is True else program_error(load)
    except Fatal:
        load_fail = proxy.dead
    ns = {"__builtins__": builtins, "__name__": "checker", "candidate": proxy, "_same": same}
    exec(compile(job.get("preamble") or "", "checker-preamble", "exec"), ns)
    if job.get("entry"):
        ns[job["entry"]] = proxy  # tests may call the function by its name (HumanEval/33)
    for t in tests:
        if load_fail:
            verdicts.append(dict(load_fail))
            continue
        if proxy.dead:
            verdicts.append({"verdict": "not_run", "error": "the program's process ended earlier"})
            continue
        proxy.deadline = time.monotonic() + limits["timeout_s"]
        try:
            exec(compile(t["code"], "test", "exec"), ns)
            verdicts.append({"verdict": "pass"})
        except Fatal:
            verdicts.append(dict(proxy.dead))
        except ProgramError as e:
            v = program_error(e.reply)
            if e.reply.get("eq"):
                extra.append("eq_override: returned an object that overrides __eq__/__ne__/__hash__")
            if v.get("etype") in ("SystemExit", "KeyboardInterrupt", "GeneratorExit"):
                extra.append(f"exit: raised {v['etype']} inside the function")
            verdicts.append(v)
        except AssertionError:
            verdicts.append({"verdict": "wrong_answer"})
        except Exception as e:  # the checker's own expression failed on the value (e.g. None < 1)
            verdicts.append({"verdict": "wrong_answer", "error": f"{type(e).__name__}: {str(e)[:200]}"})
    if not load_fail and not proxy.dead:
        try:  # the program's own report of what it patched (its flags; never its verdicts)
            send(proc.ctl_w, {"done": True})
            proxy.deadline = time.monotonic() + limits["timeout_s"]
            proxy.reply()
        except (Fatal, OSError):
            pass
    if load_fail and load_fail.get("etype") in ("SystemExit", "KeyboardInterrupt"):
        extra.append(f"exit: raised {load_fail['etype']} while loading")
    if load_fail and load_fail["verdict"] == "exit" or any(v["verdict"] == "exit" for v in verdicts):
        extra.append("early_exit: the process ended before all tests ran")
    reap(proc)
    return verdicts, proxy.flags + extra


def same_output(got, want):
    a, b = got.split(), want.split()
    if a == b:
        return True
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x != y:
            try:
                if not math.isclose(float(x), float(y), rel_tol=1e-6, abs_tol=1e-6):
                    return False
            except ValueError:
                return False
    return True


def _feed(proc, data, limits):
    """Writes the input and collects the output until EOF; a verdict when time or size ran out."""
    out, cap = bytearray(), limits["output_bytes"]
    deadline = time.monotonic() + limits["timeout_s"]
    os.set_blocking(proc.in_w, False)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return out, deadline, {"verdict": "timeout", "error": f"no exit within {limits['timeout_s']} s"}
        r, w, _ = select.select([proc.out_r], [proc.in_w] if proc.in_w is not None else [], [], left)
        if w:
            try:
                data = data[os.write(proc.in_w, data[:1 << 16]):]
            except BlockingIOError:
                pass
            except BrokenPipeError:  # the program stopped reading: what it printed still counts
                data = b""
            if not data:
                proc.close_input()
        if r:
            chunk = os.read(proc.out_r, 1 << 16)
            if not chunk:
                return out, deadline, None
            out += chunk
            if len(out) > cap:
                return out, deadline, {"verdict": "output_limit", "error": f"printed more than {cap} bytes"}


def run_stdio(proc, test, limits):
    """Feeds one input to one fresh process of the program and judges its output."""
    send(proc.ctl_w, {"go": True})
    out, deadline, verdict = _feed(proc, test["input"].encode(), limits)
    flags = []
    if verdict is None:
        try:
            msg = recv(proc.rep_r, deadline, limits["reply_bytes"])
        except TimeoutError:
            msg, verdict = None, {"verdict": "timeout", "error": f"no exit within {limits['timeout_s']} s"}
        except Exception:
            msg, verdict = None, {"verdict": "runtime_error", "error": "malformed reply"}
        if isinstance(msg, dict):
            if isinstance(msg.get("flags"), list):
                flags = [str(f)[:200] for f in msg["flags"][:32]]
            if msg.get("ok") is not True:
                verdict = program_error(msg)
        elif verdict is None and reap(proc) != "exit:0":  # os._exit(0) after printing is a normal end
            verdict = died(proc.status)
    if verdict is None:
        verdict = {"verdict": "pass"} if same_output(out.decode("utf-8", "replace"), test["output"]) \
            else {"verdict": "wrong_answer"}
    reap(proc)
    return verdict, flags


def grade_stdio(procs, tests, limits):
    verdicts, flags = [], []
    for proc, test in zip(procs, tests):
        v, f = run_stdio(proc, test, limits)
        verdicts.append(v)
        flags += [x for x in f if x not in flags]
    return verdicts, flags


def make_scratch(root, n, init):
    path = os.path.join(root, f"p{n}")
    os.mkdir(path, 0o700)
    if init.get("uid") is not None and os.geteuid() == 0:
        os.chown(path, init["uid"], init["gid"])
    return path


def main():
    import shutil

    req_fd, resp_fd = int(sys.argv[1]), int(sys.argv[2])
    init = recv(req_fd)
    features = isolate(init)
    root = os.getcwd()
    gc.collect()
    gc.freeze()  # the preloaded modules never need collecting: keeps per-job collections short
    send(resp_fd, {"ok": True, "features": features, "pid": os.getpid()})
    n = 0
    while True:
        job = recv(req_fd)
        if job is None or job.get("op") == "close":
            return
        n += 1
        scratch = make_scratch(root, n, init)
        stdio = job["kind"] == "stdio"
        # Fork before the tests arrive: the program's processes never hold a test in memory.
        procs = [spawn(init, job, scratch, stdio) for _ in range(job["n_tests"] if stdio else 1)]
        tests = recv(req_fd)
        if tests is None:
            return
        try:
            if stdio:
                verdicts, flags = grade_stdio(procs, tests["tests"], init["limits"])
            else:
                verdicts, flags = grade_calls(procs[0], job, tests["tests"], init["limits"])
            result = {"ok": True, "verdicts": verdicts, "flags": flags}
        except Exception as e:  # the checker (trusted test code) itself failed: the engine's problem
            result = {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}
            for p in procs:
                reap(p)
        send(resp_fd, result)
        shutil.rmtree(scratch, ignore_errors=True)
        del job, tests, procs, result
        gc.collect()


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        import traceback

        traceback.print_exc()
        os._exit(70)
    os._exit(0)
