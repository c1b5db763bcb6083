"""Programs verified per second: the executor's warm worker pool vs a plain subprocess per program.

The workload is generated code tasks (levels 1-3, 7 tests each): half the programs are the
reference solution, half a wrong one, so both paths grade real passes and failures. Both sides run
with the same parallelism (one worker / one subprocess at a time per CPU core). The pool's figure
includes its start-up; the subprocess side is the usual `python -c program+asserts` with a timeout
(no isolation at all, so it is a lower bound on what an isolated per-program subprocess costs).

    python benchmarks/code_execution.py [--programs 1000] [--subprocess-programs 200] [--workers N]

Measured on 2 shared CPU cores (benchmarks/results/code_execution_cpu2.txt): 171 programs/s
(11 ms mean, 19 ms p95 per program) for the isolated pool vs 29 programs/s (68 ms) for a bare
subprocess per program: 5.9x.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from evotrainer.domains.code.executor import CodeExecutor, Program
from evotrainer.domains.code.generated import make_splits
from evotrainer.domains.code.tasks import display_test


def workload(n: int) -> list[Program]:
    tasks = [t for s in make_splits(120, 0, 0, [1, 2, 3], seed=0).values() for t in s]
    out = []
    for i in range(n):
        t = tasks[i % len(tasks)]
        entry = t.visible["entry"]
        source = t.answer if i % 2 == 0 else f"def {entry}(*args):\n    return None\n"
        tests = tuple({"code": c} for c in t.visible["tests"] + t.hidden["tests"])
        out.append(Program(source, "function", tests, entry))
    return out


def plain_subprocess(p: Program) -> tuple[bool, float]:
    asserts = "\n".join(display_test(t["code"], p.entry) for t in p.tests)
    start = time.perf_counter()
    try:
        rc = subprocess.run([sys.executable, "-I", "-c", p.source + "\n" + asserts], capture_output=True,
                            timeout=10).returncode
    except subprocess.TimeoutExpired:
        rc = -1
    return rc == 0, time.perf_counter() - start


def summary(name: str, n: int, wall: float, latencies: list[float], passed: int) -> str:
    lat = sorted(latencies)
    p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))]
    return (f"{name:<22} {n:>8} {passed:>7} {wall:>8.2f} {n / wall:>10.1f} {1000 * statistics.mean(lat):>9.1f} "
            f"{1000 * statistics.median(lat):>8.1f} {1000 * p95:>8.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=1000, help="programs graded by the worker pool")
    ap.add_argument("--subprocess-programs", type=int, default=200, help="programs graded one subprocess each")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()

    pool_work, sub_work = workload(args.programs), workload(args.subprocess_programs)
    start = time.perf_counter()
    with CodeExecutor(args.workers) as ex:
        results = ex.run(pool_work)
        features = ex.features
    pool_wall = time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(args.workers) as threads:
        sub = list(threads.map(plain_subprocess, sub_work))
    sub_wall = time.perf_counter() - start

    print(f"{args.workers} workers; isolation in the pool: {features}")
    print(f"{'method':<22} {'programs':>8} {'passed':>7} {'wall s':>8} {'programs/s':>10} "
          f"{'mean ms':>9} {'p50 ms':>8} {'p95 ms':>8}")
    print(summary("warm pool (isolated)", len(results), pool_wall, [r.seconds for r in results],
                  sum(r.all_passed for r in results)))
    print(summary("subprocess/program", len(sub), sub_wall, [s for _, s in sub], sum(ok for ok, _ in sub)))
    print(f"speed-up: {len(results) / pool_wall / (len(sub) / sub_wall):.1f}x programs/s")


if __name__ == "__main__":
    main()
