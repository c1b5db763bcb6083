"""The sandbox worker's guard while harness code runs (``sandbox_worker.py`` turns it on and off).

An audit hook refuses process creation, signals, ctypes, sockets, rlimit changes, frame
introspection, new imports outside the allow-list, writes outside scratch and reading other
processes' /proc entries. Every refusal is recorded in ``State.violations``, so a harness that
swallows the exception is still reported as ``forbidden``. A first meta-path finder refuses imports
outside the allow-list too (as does the harness's own ``__import__``, in ``sandbox_worker.py``).
Standard library only: the worker imports this file as a sibling module (see ``sandbox_worker.py``).
"""

import os

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


class Forbidden(PermissionError):
    pass


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


class ImportGuard:
    """First meta-path finder: refuses new imports outside the allow-list while harness code runs.

    The "import" audit event does not fire for ``importlib.import_module``; this does."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if State.active and name.split(".")[0] not in State.allowed:
            violation(f"import of {name!r} is not allowed (allowed: {', '.join(sorted(State.allowed))})")
        return None
