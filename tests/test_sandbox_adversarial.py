"""Adversarial suite: hostile harness genomes, each contained and reported with a clear kind.

The genomes skip the static contract check (``check=False``) because the sandbox itself is the
boundary under test. Many reach the real ``os`` module through the classic
``().__class__.__base__.__subclasses__()`` escape, so they test the worker's audit hook and OS
limits rather than the (bypassable) guarded ``__import__``. After every failure: the worker process
and its process group are gone, the scratch directory is removed, nothing was written outside it,
and the engine (this process) is unaffected.
"""

from __future__ import annotations

import os
import socket
import textwrap
import threading

import pytest

from evotrainer.cli.genome import sample_batch
from evotrainer.genome.program import HarnessProgram
from evotrainer.genome.sandbox import Sandbox, SandboxError, SandboxLimits

LIMITS = SandboxLimits(timeout_s=3.0, start_timeout_s=10.0, cpu_s=2, memory_mb=768, output_bytes=10_000)

# Reaches the real os module's globals without importing anything.
ESCAPE = '''
def _os():
    for c in ().__class__.__base__.__subclasses__():
        if c.__name__ == "_wrap_close":
            return c.__init__.__globals__
'''

ROLLOUTS, TASKS = sample_batch()
RDS = [r.for_harness() for r in ROLLOUTS]
N = len(RDS)


def hostile(body: str, limits: SandboxLimits = LIMITS) -> Sandbox:
    return Sandbox(HarnessProgram(ESCAPE + textwrap.dedent(body), name="hostile.py"), limits, check=False)


def procs_in_group(pgid: int) -> list[int]:
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid or int(fields[3]) == pgid:  # process group or session
            found.append(int(d))
    return found


def assert_contained(pid: int, scratch: str) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not a zombie
    assert procs_in_group(pid) == []
    assert not os.path.exists(scratch)


def expect_failure(sb: Sandbox, kind: str, hook: str = "reward", args: tuple = (RDS, TASKS)) -> SandboxError:
    """The call fails with ``kind`` (at start for module-level hostility, else in the call)."""
    with pytest.raises(SandboxError) as info:
        sb.call(hook, *args)
    assert info.value.kind == kind, info.value
    assert sb.pid is None  # the worker is gone; the next call starts a fresh one
    assert_contained(sb.last_pid, sb._scratch)
    sb.close()
    return info.value


# ---- table of hostile genomes: (name, body, expected kind, limits) -------------------------------------
CASES = [
    ("fork_bomb", """
        def reward(rollouts, tasks):
            while True:
                _os()["fork"]()
        """, "forbidden", LIMITS),
    ("os_system", """
        def reward(rollouts, tasks):
            _os()["system"]("touch /tmp/evotrainer-pwned")
            return [0.0] * len(rollouts)
        """, "forbidden", LIMITS),
    ("subprocess_import", """
        import subprocess
        def reward(rollouts, tasks):
            subprocess.run(["sleep", "100"])
        """, "forbidden", LIMITS),
    ("subprocess_via_sys_modules", """
        def reward(rollouts, tasks):
            m = _os()["sys"].modules
            sp = m.get("subprocess") or m["importlib"].import_module("subprocess")
            sp.Popen(["sleep", "100"])
        """, "forbidden", LIMITS),
    ("posix_spawn", """
        def reward(rollouts, tasks):
            _os()["posix_spawn"]("/bin/sleep", ["sleep", "100"], {})
        """, "forbidden", LIMITS),
    ("dunder_import_os", """
        def reward(rollouts, tasks):
            return __import__("os").system("true")
        """, "forbidden", LIMITS),
    ("importlib", """
        import importlib
        def reward(rollouts, tasks):
            return importlib.import_module("os").system("true")
        """, "forbidden", LIMITS),
    ("swallowed_violation", """
        def reward(rollouts, tasks):
            try:
                import socket
            except BaseException:
                pass
            return [1.0] * len(rollouts)
        """, "forbidden", LIMITS),
    ("kill_parent", """
        def reward(rollouts, tasks):
            o = _os()
            o["kill"](o["getppid"](), 9)
            return [0.0] * len(rollouts)
        """, "forbidden", LIMITS),
    ("ctypes", """
        def reward(rollouts, tasks):
            ctypes = _os()["sys"].modules["ctypes"]
            ctypes.CDLL(None).kill(0, 9)
        """, "forbidden", LIMITS),
    ("raise_own_rlimit", """
        def reward(rollouts, tasks):
            r = _os()["sys"].modules["resource"]
            r.setrlimit(r.RLIMIT_CPU, (-1, -1))
        """, "forbidden", LIMITS),
    ("eval_via_real_builtins", """
        def reward(rollouts, tasks):
            real = _os()["__builtins__"]
            return real["eval"]("[0.0] * 12")
        """, "forbidden", LIMITS),
    ("frame_walk", """
        def reward(rollouts, tasks):
            f = _os()["sys"]._getframe(1)
            f.f_globals["State"].active = False
        """, "forbidden", LIMITS),
    ("read_parent_environ", """
        def reward(rollouts, tasks):
            o = _os()
            fd = o["open"]("/proc/%d/environ" % o["getppid"](), o["O_RDONLY"])
            return [float(len(o["read"](fd, 100000)))] * len(rollouts)
        """, "forbidden", LIMITS),
    ("memory_bomb", """
        def reward(rollouts, tasks):
            hog = []
            while True:
                hog.append(bytes(128 * 2 ** 20))
        """, "memory", SandboxLimits(timeout_s=10.0, memory_mb=768)),
    ("numpy_memory_bomb", """
        import numpy as np
        def reward(rollouts, tasks):
            return np.ones((10 ** 6, 10 ** 4)).sum(axis=1).tolist()
        """, "memory", LIMITS),
    ("infinite_loop_cpu", """
        def reward(rollouts, tasks):
            while True:
                pass
        """, "cpu", SandboxLimits(timeout_s=10.0, cpu_s=1)),
    ("busy_loop_ignoring_signals", """
        def reward(rollouts, tasks):
            sig = _os()["sys"].modules["_signal"]
            for s in (sig.SIGTERM, sig.SIGINT, sig.SIGXCPU, sig.SIGHUP):
                sig.signal(s, sig.SIG_IGN)
            x = 0
            while True:
                x += 1
        """, "timeout", SandboxLimits(timeout_s=2.5, cpu_s=1)),
    ("sleeping_forever", """
        def reward(rollouts, tasks):
            _os()["sys"].modules["time"].sleep(1000)
        """, "timeout", SandboxLimits(timeout_s=1.0)),
    ("recursion_bomb", """
        def reward(rollouts, tasks):
            def f(n):
                return f(n + 1) + 1
            return f(0)
        """, "recursion", LIMITS),
    ("huge_stdout", """
        def reward(rollouts, tasks):
            while True:
                print("spam " * 1000)
        """, "output_limit", LIMITS),
    ("sys_exit", """
        import sys
        def reward(rollouts, tasks):
            sys.exit(3)
        """, "forbidden", LIMITS),  # `import sys` is outside the allow-list
    ("raise_system_exit", """
        def reward(rollouts, tasks):
            raise SystemExit(3)
        """, "exit", LIMITS),
    ("os_exit", """
        def reward(rollouts, tasks):
            _os()["_exit"](7)
        """, "exit", LIMITS),
    ("segfault", """
        def reward(rollouts, tasks):
            _os()["sys"].modules["_signal"].raise_signal(11)
        """, "crashed", LIMITS),
    ("not_serialisable", """
        def reward(rollouts, tasks):
            return [object() for _ in rollouts]
        """, "bad_result", LIMITS),
    ("wrong_length", """
        def reward(rollouts, tasks):
            return [1.0] * (len(rollouts) - 1)
        """, "bad_result", LIMITS),
    ("nan_rewards", """
        def reward(rollouts, tasks):
            return [float("nan")] * len(rollouts)
        """, "bad_result", LIMITS),
    ("strings_not_numbers", """
        def reward(rollouts, tasks):
            return ["1.0"] * len(rollouts)
        """, "bad_result", LIMITS),
    ("plain_exception", """
        def reward(rollouts, tasks):
            return [r["no_such_key"] for r in rollouts]
        """, "exception", LIMITS),
]


@pytest.mark.parametrize("name,body,kind,limits", CASES, ids=[c[0] for c in CASES])
def test_hostile_genome_is_contained(name, body, kind, limits):
    err = expect_failure(hostile(body, limits), kind)
    assert err.failure.message  # one line that says what happened
    assert not os.path.exists("/tmp/evotrainer-pwned")


def test_at_least_twenty_hostile_genomes():
    assert len(CASES) >= 20


def test_syntax_error_and_load_failures_are_contract_failures():
    for body, needle in (("def reward(rollouts, tasks)\n    return []\n", "syntax error at line"),
                         ("raise ValueError('boom')\n", "loading the harness failed")):
        sb = Sandbox(HarnessProgram(body), LIMITS, check=False)
        with pytest.raises(SandboxError) as info:
            sb.call("reward", RDS, TASKS)
        assert info.value.kind == "contract" and needle in info.value.failure.message
        assert sb.pid is None


def test_infinite_loop_at_import_times_out_at_start():
    sb = Sandbox(HarnessProgram("while True:\n    pass\n"), SandboxLimits(start_timeout_s=1.5), check=False)
    with pytest.raises(SandboxError) as info:
        sb.start()
    assert info.value.kind == "timeout"


def test_contract_check_is_on_by_default():
    with pytest.raises(SandboxError) as info:
        Sandbox(HarnessProgram("import os\n"))
    assert info.value.kind == "contract" and "'os'" in info.value.failure.message


def test_socket_to_loopback_listener_gets_nothing():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    sb = hostile(f"""
        def reward(rollouts, tasks):
            m = _os()["sys"].modules
            for name in ("socket", "_socket"):
                try:
                    s = (m.get(name) or __import__(name)).socket()
                    s.connect(("127.0.0.1", {port}))
                except BaseException:
                    pass
            return [0.0] * len(rollouts)
        """)
    expect_failure(sb, "forbidden")
    with pytest.raises(socket.timeout):
        listener.accept()
    listener.close()


def test_worker_runs_in_its_own_network_namespace_as_nobody_with_limits():
    with hostile("") as sb:
        pid = sb.pid
        if sb.features.get("netns"):
            assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f)
        if os.geteuid() == 0:
            assert status["Uid"].split()[0] == "65534"  # nobody: cannot touch engine files or kill it
        with open(f"/proc/{pid}/limits") as f:
            limits = {line[:26].strip(): line[26:].split()[:2] for line in f.readlines()[1:]}
        assert limits["Max processes"] == [str(LIMITS.nproc)] * 2
        assert limits["Max address space"] == [str(LIMITS.memory_mb << 20)] * 2
        assert limits["Max open files"] == [str(LIMITS.nofile)] * 2
        assert limits["Max file size"] == [str(LIMITS.fsize_mb << 20)] * 2
        assert limits["Max core file size"] == ["0", "0"]
        assert limits["Max cpu time"][1] == str(LIMITS.cpu_lifetime_s)
        with open(f"/proc/{pid}/environ", "rb") as f:
            assert set(k.split(b"=")[0] for k in f.read().split(b"\0") if k) <= {
                b"PATH", b"LANG", b"HOME", b"TMPDIR", b"OPENBLAS_NUM_THREADS", b"OMP_NUM_THREADS",
                b"MKL_NUM_THREADS", b"PYTHONDONTWRITEBYTECODE"}
        assert os.getpgid(pid) == pid and os.getsid(pid) == pid  # its own session and process group


def test_writes_outside_scratch_are_refused_and_scratch_works(tmp_path):
    target = tmp_path / "owned-by-test.txt"
    sb = hostile(f"""
        def reward(rollouts, tasks):
            o = _os()
            fd = o["open"]("scratch.txt", o["O_WRONLY"] | o["O_CREAT"])
            o["write"](fd, b"fine")
            o["close"](fd)
            fd = o["open"]({str(target)!r}, o["O_WRONLY"] | o["O_CREAT"])
            o["write"](fd, b"pwned")
            return [0.0] * len(rollouts)
        """)
    expect_failure(sb, "forbidden")
    assert not target.exists()


def test_environment_secret_is_not_visible(monkeypatch):
    monkeypatch.setenv("EVO_FAKE_SECRET", "hunter2")
    with hostile("""
        def reward(rollouts, tasks):
            env = _os()["environ"]
            seen = any("hunter2" in v for v in env.values()) or "EVO_FAKE_SECRET" in env
            return [1.0 if seen else 0.0] * len(rollouts)
        """) as sb:
        assert sb.call("reward", RDS, TASKS) == [0.0] * N
    assert os.environ["EVO_FAKE_SECRET"] == "hunter2"


def test_reading_files_outside_the_python_installation_is_refused(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    secret.chmod(0o600)
    sb = hostile(f"""
        def reward(rollouts, tasks):
            o = _os()
            try:  # a swallowed refusal is still reported
                fd = o["open"]({str(secret)!r}, o["O_RDONLY"])
                return [1.0 if b"hunter2" in o["read"](fd, 100) else 0.0] * len(rollouts)
            except OSError:
                return [0.0] * len(rollouts)
        """)
    err = expect_failure(sb, "forbidden")
    assert "outside the Python installation" in err.failure.message


def test_harness_may_read_and_write_its_scratch_directory():
    with hostile("""
        def reward(rollouts, tasks):
            o = _os()
            fd = o["open"]("notes.txt", o["O_WRONLY"] | o["O_CREAT"])
            o["write"](fd, b"0.25")
            o["close"](fd)
            fd = o["open"]("notes.txt", o["O_RDONLY"])
            return [float(o["read"](fd, 10))] * len(rollouts)
        """) as sb:
        assert sb.call("reward", RDS, TASKS) == [0.25] * N
        scratch = sb._scratch
        assert os.listdir(scratch) == ["notes.txt"]
    assert not os.path.exists(scratch)


def test_fd_level_stdout_cannot_corrupt_the_protocol():
    with hostile("""
        def reward(rollouts, tasks):
            o = _os()
            for _ in range(200):
                o["write"](1, b"\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x05{bad}" * 1000)
            print("hello from the harness")
            return [0.5] * len(rollouts)
        """) as sb:
        assert sb.call("reward", RDS, TASKS) == [0.5] * N
        assert sb.last_output.strip() == "hello from the harness"
        assert len(sb._out) <= LIMITS.output_bytes


def test_monkeypatching_does_not_leak_into_later_calls_or_the_engine():
    import math

    sb = hostile("""
        import math
        PATCHED = []
        def reward(rollouts, tasks):
            if rollouts and rollouts[0].get("patch"):
                math.sqrt = lambda x: -1.0
                _os()["sys"].modules["builtins"].len = lambda x: 0
                __builtins__["sum"] = lambda xs: -1
                PATCHED.append(1)
                return [0.0] * len(rollouts)
            return [math.sqrt(4.0) + len(PATCHED) + sum([0.0]) + float(len(rollouts) == 12)] * len(rollouts)
        """)
    with sb:
        patch = [dict(r, patch=True) for r in RDS]
        assert sb.call("reward", patch, TASKS) == [0.0] * N
        pid = sb.pid
        assert sb.call("reward", RDS, TASKS) == [3.0] * N  # sqrt ok, fresh module state, len/sum ok
        assert sb.pid == pid  # the same worker served both calls
    assert math.sqrt(4.0) == 2.0 and len([1]) == 1


def test_timers_and_signal_handlers_do_not_outlive_the_call(tmp_path):
    """The worker's state is read, not waited on: a timer still pending after the call (the kernel's
    ``getitimer``) or the harness's handler still installed fails the test whenever the next call comes."""
    marker = tmp_path / "alarm-ran"
    with hostile(f"""
        def reward(rollouts, tasks):
            sig = _os()["sys"].modules["_signal"]
            if rollouts[0].get("arm"):
                def later(*a):  # would run while the worker idles, with the audit hook off
                    _os()["system"]("touch {marker}")
                sig.signal(sig.SIGALRM, later)
                sig.setitimer(sig.ITIMER_REAL, 60.0)
                sig.signal(sig.SIGXCPU, sig.SIG_IGN)
            state = {{"xcpu_default": sig.getsignal(sig.SIGXCPU) == sig.SIG_DFL,
                     "timer_pending": sig.getitimer(sig.ITIMER_REAL)[0] > 0,
                     "alarm_is_ours": getattr(sig.getsignal(sig.SIGALRM), "__name__", "") == "later"}}
            return [float(sum(v << i for i, v in enumerate(state.values())))] * len(rollouts)
        """) as sb:
        # Within the arming call all three took effect: SIGXCPU ignored (0), a timer pending (2), ours (4).
        assert sb.call("reward", [dict(RDS[0], arm=True)], TASKS[:1]) == [6.0]
        # The next call finds SIGXCPU's default back, no timer left and the old SIGALRM handler.
        assert sb.call("reward", RDS, TASKS) == [1.0] * N
    assert not marker.exists()


@pytest.mark.parametrize("limits", [LIMITS, SandboxLimits(drop_privileges=False)], ids=["nobody", "same-uid"])
def test_threads_are_refused(limits):
    sb = hostile("""
        def reward(rollouts, tasks):
            t = _os()["sys"].modules["_thread"]
            def spin():
                while True:
                    pass
            t.start_new_thread(spin, ())
            return [0.0] * len(rollouts)
        """, limits)
    with pytest.raises(SandboxError) as info:
        sb.call("reward", RDS, TASKS)
    # Refused by RLIMIT_NPROC (as nobody) or reported after the call.
    assert info.value.kind in ("forbidden", "exception"), info.value
    assert_contained(sb.last_pid, sb._scratch)


def test_a_fresh_worker_starts_after_a_failure():
    with hostile("""
        def reward(rollouts, tasks):
            if len(rollouts) == 1:
                raise RuntimeError("only batches of one fail")
            return [1.0] * len(rollouts)
        """) as sb:
        first = sb.pid
        with pytest.raises(SandboxError) as info:
            sb.call("reward", RDS[:1], TASKS[:1])
        assert info.value.kind == "exception" and "RuntimeError" in info.value.failure.message
        assert sb.call("reward", RDS, TASKS) == [1.0] * N
        assert sb.pid != first and sb.starts == 2


def test_engine_survives_and_stays_responsive_during_a_hang():
    sb = hostile("""
        def reward(rollouts, tasks):
            while True:
                pass
        """, SandboxLimits(timeout_s=1.0))
    done = threading.Event()
    threading.Thread(target=lambda: (pytest.raises(SandboxError, sb.call, "reward", RDS, TASKS), done.set())).start()
    assert done.wait(8.0)
    sb.close()


GUARDS_OFF = """
def _guards_off():
    g = __builtins__["__import__"].__globals__  # the worker's globals
    g["State"].active = False
    return g["__builtins__"].__import__  # the real one
"""


def test_os_layer_holds_even_with_the_in_process_guards_switched_off(tmp_path):
    """The audit hook lives in the worker's interpreter, so a determined harness can switch it off
    (here through the guarded ``__import__``'s globals). The OS layer must still hold: no fork
    (RLIMIT_NPROC as nobody), no writes to the engine's files, no signals to the engine."""
    if os.geteuid() != 0:
        pytest.skip("the uid drop needs root")
    target = tmp_path / "pwned.txt"
    with hostile(GUARDS_OFF + textwrap.dedent(f"""
        def reward(rollouts, tasks):
            _guards_off()
            o = _os()
            outcomes = []
            def attempt(fn):
                try:
                    fn()
                    outcomes.append(1.0)
                except Exception:
                    outcomes.append(0.0)
            def fork():
                if o["fork"]() == 0:
                    o["_exit"](0)
            attempt(fork)
            attempt(lambda: o["open"]({str(target)!r}, o["O_WRONLY"] | o["O_CREAT"]))
            attempt(lambda: o["kill"]({os.getpid()}, 0))
            attempt(lambda: o["setuid"](0))
            return outcomes + [0.0] * (len(rollouts) - len(outcomes))
        """)) as sb:
        assert sb.call("reward", RDS, TASKS)[:4] == [0.0, 0.0, 0.0, 0.0]
        assert procs_in_group(sb.pid) == [sb.pid]
    assert not target.exists()


def test_network_namespace_holds_even_with_the_guards_switched_off():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.3)
    port = listener.getsockname()[1]
    # Same uid as the engine, so that the socket module can still be imported from the stdlib.
    with hostile(GUARDS_OFF + textwrap.dedent(f"""
        def reward(rollouts, tasks):
            real_import = _guards_off()
            try:
                real_import("socket").create_connection(("127.0.0.1", {port}), timeout=0.2)
                return [1.0] * len(rollouts)
            except OSError:
                return [0.0] * len(rollouts)
        """), SandboxLimits(drop_privileges=False)) as sb:
        if not sb.features.get("netns"):
            pytest.skip("no network namespace on this machine")
        assert sb.call("reward", RDS, TASKS) == [0.0] * N
    with pytest.raises(socket.timeout):
        listener.accept()
    listener.close()


@pytest.mark.parametrize("where", ["exception_str", "finaliser_in_a_module", "finaliser_in_a_cycle"])
def test_harness_code_that_runs_after_the_call_is_still_guarded(tmp_path, where):
    """Harness code also runs after its hook returns: an exception's __str__ while the worker formats
    the report, the __del__ of an object left in a module as the worker restores it, and of a cycle
    as it is collected. The folder is world-writable, so only the worker's audit hook stands in the
    way (not the uid drop): the write is refused and reported as forbidden."""
    os.chmod(tmp_path, 0o777)
    target = tmp_path / f"{where}.txt"
    bodies = {
        "exception_str": f"""
            import numpy
            class Boom(Exception):
                def __str__(self):
                    numpy.savetxt({str(target)!r}, numpy.array([1.0]))
                    return "boom"
            def reward(rollouts, tasks):
                raise Boom()
            """,
        "finaliser_in_a_module": f"""
            import numpy
            class Later:
                def __del__(self, save=numpy.savetxt, arr=numpy.array):
                    save({str(target)!r}, arr([4.0]))
            def reward(rollouts, tasks):
                numpy.stash = Later()
                return [1.0] * len(rollouts)
            """,
        "finaliser_in_a_cycle": f"""
            import numpy
            class Later:
                def __del__(self, save=numpy.savetxt, arr=numpy.array):
                    save({str(target)!r}, arr([4.0]))
            def reward(rollouts, tasks):
                a = Later()
                a.me = a
                return [1.0] * len(rollouts)
            """,
    }
    with Sandbox(HarnessProgram(textwrap.dedent(bodies[where]), name="hostile.py"), LIMITS, check=False) as sb:
        with pytest.raises(SandboxError) as e:
            sb.call("reward", RDS, TASKS)
        assert e.value.kind == "forbidden", (e.value.kind, str(e.value))
        assert "outside the scratch directory" in str(e.value)
    assert not target.exists()


@pytest.mark.parametrize("how", ["patch_the_worker_traceback_module", "finaliser_patches_math_for_the_next_call",
                                 "exception_with_getattribute"])
def test_the_workers_own_code_after_a_call_runs_nothing_the_harness_planted(tmp_path, how):
    """The worker formats a failing hook's traceback with the guard off (reading frames is forbidden
    under it): it must call nothing the harness could have replaced (the traceback module, an
    exception's attributes), and a finaliser that patches a module for later is undone before the
    worker's own code uses it. Only the audit hook stands in the way here (a world-writable folder)."""
    os.chmod(tmp_path, 0o777)
    target = str(tmp_path / f"{how}.txt")
    bodies = {
        "patch_the_worker_traceback_module": f"""
            def reward(rollouts, tasks):
                g = _os()
                tb = g["sys"].modules["traceback"]
                def evil(t, limit=None, real=tb.extract_tb, g=g):
                    g["sys"].modules["io"].open({target!r}, "w").write("off-guard")
                    return real(t, limit)
                tb.extract_tb = evil
                raise ValueError("x")
            """,
        "finaliser_patches_math_for_the_next_call": f"""
            import math
            import numpy
            def _evil(x, save=numpy.savetxt, arr=numpy.array, real=math.ceil):
                try:
                    save({target!r}, arr([7.0]))
                except BaseException:
                    pass
                return real(x)
            class Later:
                def __del__(self, m=math, evil=_evil):
                    m.ceil = evil
            _keep = Later()
            def reward(rollouts, tasks):
                return [1.0] * len(rollouts)
            """,
        "exception_with_getattribute": f"""
            class Boom(Exception):
                def __getattribute__(self, name, g=_os()):
                    g["sys"].modules["io"].open({target!r}, "w").write(name)
                    return object.__getattribute__(self, name)
            def reward(rollouts, tasks):
                raise Boom("x")
            """,
    }
    with hostile(bodies[how]) as sb:
        for _ in range(2):   # the second call runs after whatever the first one left behind
            try:
                sb.call("reward", RDS, TASKS)
            except SandboxError as e:
                assert e.kind in ("exception", "forbidden"), (e.kind, str(e))
    assert not os.path.exists(target)
