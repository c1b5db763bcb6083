"""What one harness call in the sandbox worker gives back: its captured output (capped), its result
as plain JSON data, or a failure with its kind, message and a traceback of harness frames only.

``described`` reads a harness's exception under the guard; ``classify`` formats it off the guard
from C objects and exact strings alone (it calls nothing a harness could have patched). Standard
library only: the worker imports this file as a sibling module (see ``sandbox_worker.py``).
"""

import io


class OutputLimit(BaseException):
    """Raised from print() once the call's output cap is reached (BaseException: hard to swallow)."""


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


def classify(kind, tname, text, tb, name, sources, worker_files):
    """(kind, message, traceback text). Runs off the guard (reading frames is forbidden under it), so
    it calls nothing a harness could have patched: no traceback or linecache module, only traceback,
    frame and code objects (C types) and the worker's own copies of the harness sources. Frames of
    ``worker_files`` (the worker's own modules) are left out of the traceback."""
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append((str.__str__(code.co_filename), tb.tb_lineno, str.__str__(code.co_name)))
        tb = tb.tb_next
    frames = [f for f in frames if f[0] not in worker_files][-20:]
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
