"""The executor's wire format, shared by the worker and the program's process (standard library only).

Messages: an 8-byte big-endian length + JSON. Values: JSON with tags for what JSON lacks (tuple,
set, dict with non-string keys, bytes, non-finite floats), built from **exact** builtin types only,
so a subclass of int or str that overrides ``__eq__`` is refused like any other object.
"""

import json
import math
import os
import select
import struct
import time

HEADER = struct.Struct(">Q")
MAX_DEPTH = 64


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
