"""Between stages a run hands freed heap pages back to the OS (loop/compute/runtime.py): glibc keeps
them otherwise, and a SWE run's resident size ratcheted to its largest batch (12.8 GB, stopped by the
kernel's OOM killer beside a second run)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import sys
from evotrainer.loop.compute import runtime
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) // 1024
assert runtime._LIBC is not None, "no glibc found on a Linux machine"
blocks = [bytearray(4000) for _ in range(50_000)]   # 200 MB from malloc's heap, not mmap
keep = blocks[::64]                                 # one block in 64 stays: the heap cannot shrink from its top
del blocks
before = rss()
runtime.Runtime.return_freed_memory(None)
print(before, rss())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux only")
def test_freed_heap_pages_go_back_to_the_os():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True)
    before, after = map(int, out.stdout.split())
    assert before - after > 100, f"resident {before} MB before the trim, {after} MB after: nothing was returned"
