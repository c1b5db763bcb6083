"""Code execution worker: the only process that grades policy-written programs. Started by ``executor``.

Run as ``python -I exec_worker.py REQ_FD RESP_FD``. Standard library only; its parts are sibling
modules: ``exec_protocol`` (messages, values), ``exec_program`` (the program's confined process),
``exec_checker`` (forking and grading). Messages both ways: an 8-byte big-endian length + JSON.

The grading rule that makes results unforgeable: **the program never sees an expected value and
never judges itself.** For each job the worker forks the program's processes *first* (they inherit
nothing of the tests, which have not arrived yet), then receives the tests and runs the trusted
checker code here, where ``candidate`` is a proxy: each call sends its arguments to the program's
process and gets back the return value as tagged JSON of exact builtin types only. So an object that
overrides ``__eq__``, a patched ``AssertionError`` or ``builtins``, a ``sys.exit(0)`` before the
asserts, a forged reply on the pipe: none of them reaches the comparison, which happens here on
plain data. A program that exits early leaves its remaining tests ``not_run`` (never a pass).

The worker itself sits in a fresh network namespace (every program inherits it), is not dumpable
(a same-uid program could not ptrace it or read its memory) and dies with the engine.
"""

import gc
import os
import shutil
import sys
import traceback

# `python -I` keeps this folder off sys.path; the worker's own sibling modules (standard library
# only) are imported from it, and the folder is dropped again before any program code runs.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from exec_checker import grade_calls, grade_stdio, reap, spawn  # noqa: E402
from exec_program import LIBC, PR_SET_DUMPABLE, PR_SET_PDEATHSIG, PRELOAD  # noqa: E402
from exec_protocol import recv, send  # noqa: E402

del sys.path[0]
CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWNS = 0x10000000, 0x40000000, 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 1, 2, 4, 1 << 14, 1 << 18


def hide(paths):
    """A mount namespace of our own in which each of ``paths`` is an empty read-only tmpfs: the
    engine's code, site-packages (datasets such as HumanEval's), run folders and temp folders are
    not there at all for a program, whatever it does to the in-process guards. Needs root."""
    if os.geteuid() != 0 or LIBC.unshare(CLONE_NEWNS) != 0:
        return 0
    if LIBC.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:  # nothing propagates back
        return 0
    hidden = 0
    for path in paths:
        if os.path.isdir(path) and LIBC.mount(b"tmpfs", os.fsencode(path), b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV,
                                              b"size=16k,mode=755") == 0:
            hidden += 1
    return hidden


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
    features["hidden_paths"] = hide(init.get("hide", []))  # after the imports: site-packages goes too
    if features["hidden_paths"]:
        # Scratch on a tmpfs of bounded size (a program could otherwise fill the disk with files,
        # each under RLIMIT_FSIZE); mounted over our own hidden /tmp, gone with the namespace.
        size = f"size={init['limits']['scratch_mb']}m,mode=755".encode()
        if LIBC.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, size) == 0:
            os.chdir("/tmp")
            features["scratch_tmpfs_mb"] = init["limits"]["scratch_mb"]
    features["uid"] = init.get("uid")
    return features



def make_scratch(n, init):
    """A fresh folder for one program, relative to our cwd: the engine's temp folder may be hidden
    under a tmpfs now, but the cwd still reaches it."""
    path = f"p{n}"
    os.mkdir(path, 0o700)
    if init.get("uid") is not None and os.geteuid() == 0:
        os.chown(path, init["uid"], init["gid"])
    return path


def main():
    req_fd, resp_fd = int(sys.argv[1]), int(sys.argv[2])
    init = recv(req_fd)
    features = isolate(init)
    gc.collect()
    gc.freeze()  # the preloaded modules never need collecting: keeps per-job collections short
    send(resp_fd, {"ok": True, "features": features, "pid": os.getpid()})
    n = 0
    while True:
        job = recv(req_fd)
        if job is None or job.get("op") == "close":
            return
        n += 1
        scratch = make_scratch(n, init)
        stdio = job["kind"] == "stdio"
        job["nonce"] = os.urandom(8).hex()   # the load reply echoes it (the checker's calls carry their own)
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
        traceback.print_exc()
        os._exit(70)
    os._exit(0)
