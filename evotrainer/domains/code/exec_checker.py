"""The trusted checker: forks the program's processes and grades them (standard library only).

Test code (trusted: it comes from the task, never from the policy) runs here with ``candidate`` a
proxy whose calls run in the program's process; comparisons happen here, on plain values.
"""

import builtins
import math
import os
import select
import signal
import time

from exec_program import child
from exec_protocol import recv, send, tag


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
        self.child_flags = []   # what the program's process reported (best effort: it could lie)
        self.own_flags = set()  # what the checker saw itself
        self.deadline = None

    def reply(self, nonce=None):
        """The program process's reply; to a request that carried ``nonce``, it must echo it. The
        program can write to the pipe, but cannot read the request: a reply without the nonce was
        forged (whether or not the real one arrived yet: checking the pipe for more is a race)."""
        try:
            msg = recv(self.proc.rep_r, self.deadline, self.limits["reply_bytes"])
        except TimeoutError:
            self.dead = {"verdict": "timeout", "error": f"no reply within {self.limits['timeout_s']} s"}
            raise Fatal() from None
        except OverflowError as e:
            self.dead = {"verdict": "output_limit", "error": f"a {e.args[0]}-byte return value"}
            raise Fatal() from None
        except Exception:  # bytes the program forged on its pipe: never data, a tamper
            self.own_flags.add("channel: a malformed reply on the result pipe")
            self.dead = {"verdict": "runtime_error", "error": "malformed reply"}
            raise Fatal() from None
        if msg is None:
            self.dead = died(reap(self.proc))
            raise Fatal()
        if not isinstance(msg, dict):
            self.dead = {"verdict": "runtime_error", "error": "malformed reply"}
            raise Fatal()
        if nonce is not None and msg.get("nonce") != nonce:
            self.own_flags.add("channel: a reply that answers no request on the result pipe")
            self.dead = {"verdict": "runtime_error", "error": "forged reply"}
            raise Fatal()
        flags = msg.get("flags")
        if isinstance(flags, list):
            self.child_flags = [str(f)[:200] for f in flags[:32]]
        # One request, one reply: bytes already waiting behind it were forged (b"" is the pipe's end).
        if select.select([self.proc.rep_r], [], [], 0)[0] and os.read(self.proc.rep_r, 1):
            self.own_flags.add("channel: more replies than calls on the result pipe")
        return msg

    @property
    def flags(self):
        return self.child_flags + sorted(self.own_flags)

    def __call__(self, *args):
        if self.dead:
            raise Fatal()
        nonce = os.urandom(8).hex()
        try:
            send(self.proc.ctl_w, {"args": tag(list(args)), "nonce": nonce})
        except OSError:
            self.dead = died(reap(self.proc))
            raise Fatal() from None
        msg = self.reply(nonce)
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
        load = proxy.reply(job.get("nonce"))   # a load reply forged by the module's own code is flagged
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
            nonce = os.urandom(8).hex()
            send(proc.ctl_w, {"done": True, "nonce": nonce})
            proxy.deadline = time.monotonic() + limits["timeout_s"]
            proxy.reply(nonce)
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
