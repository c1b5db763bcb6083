"""Sandbox throughput: round-trip latency of a hook call and rollouts re-scored per second.

Backtests re-score cached rollouts through a candidate harness's reward hook, so the sandbox must
move whole batches cheaply. This prints, for the reference harness:
  - the median round-trip latency of one hook call (a batch of one rollout),
  - rollouts re-scored per second through the sandboxed ``reward`` hook, batches of 1k and 10k
    (goal: >= 50,000/s), the same in-process for comparison, and through the ``Harness`` facade
    with ``Rollout`` objects (what the trainer does: conversion + sandbox),
  - the worker start time.

    python benchmarks/sandbox_throughput.py [--calls 200] [--repeats 5] [--batches 1000 10000]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

from evotrainer.genome import Harness, Sandbox, reference_program
from evotrainer.records.rollout import Rollout

GOAL = 50_000


def make_batch(n: int, group_size: int = 4, tokens: int = 64, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Rollout dicts shaped like ``Rollout.for_harness()`` (64-token completions with logprobs)."""
    rng = random.Random(seed)
    rollouts, tasks = [], []
    for i in range(n):
        g = i // group_size
        prompt = f"Tom has {g % 17} apples and buys {g % 5 + 2} more, then gives away 3. How many now?"
        rollouts.append({
            "task_id": f"task-{g}", "messages": [{"role": "user", "content": prompt}],
            "completion": "Let me think step by step. " * 6 + f"The answer is {rng.randint(0, 20)}.",
            "prompt_ids": list(range(40)), "completion_ids": [rng.randrange(50_000) for _ in range(tokens)],
            "logprobs": [round(-rng.random(), 4) for _ in range(tokens)], "truncated": rng.random() < 0.1,
            "stop_reason": "eos", "turns": 1, "tool_calls": [], "gen_seconds": 0.5, "seed": i, "group": g,
            "step": 0, "split": "train",
            "visible": {"correct": rng.random() < 0.3, "format_ok": rng.random() < 0.9, "extracted": "7"}})
        if i % group_size == 0:  # tasks align with rollouts: one task dict per group, repeated
            task = {"id": f"task-{g}", "prompt": prompt, "split": "train", "domain": "math", "difficulty": 1,
                    "visible": {}}
        tasks.append(task)
    return rollouts, tasks


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process (from /proc; the worker is not our waited child)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls for the latency median")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per batch size")
    parser.add_argument("--batches", type=int, nargs="+", default=[1000, 10000])
    args = parser.parse_args()

    program = reference_program()
    t0 = time.perf_counter()
    sandbox = Sandbox(program)
    sandbox.start()
    start_s = time.perf_counter() - t0
    print(f"worker start (spawn, isolate, import numpy, load harness): {start_s * 1000:.1f} ms; "
          f"features: {sandbox.features}")

    one, one_task = make_batch(1)
    latency = median_seconds(lambda: sandbox.call("reward", one, one_task), args.calls)
    print(f"round-trip latency of one hook call (reward, 1 rollout): median {latency * 1e3:.3f} ms "
          f"over {args.calls} calls")

    local = Harness(program, sandbox=False)
    facade = Harness(program)
    print("rollouts re-scored per second by the reward hook (median of timed repeats):")
    print(f"{'batch':>8} {'sandboxed/s':>13} {'cpu-bound/s':>12} {'in-process/s':>13} {'overhead':>9} "
          f"{'Harness+Rollout/s':>18}   goal >= {GOAL:,}/s sandboxed")
    worst = None
    for n in args.batches:
        rollouts, tasks = make_batch(n)
        objects = [Rollout.from_dict(dict(r, hidden={"correct": False})) for r in rollouts]
        sandbox.call("reward", rollouts, tasks)  # warm up
        cpu0, worker0 = time.process_time(), cpu_seconds(sandbox.pid)
        boxed = n / median_seconds(lambda r=rollouts, t=tasks: sandbox.call("reward", r, t), args.repeats)
        # Engine + worker CPU per call: the rate on two free cores without any overlap (load-independent).
        cpu = (time.process_time() - cpu0 + cpu_seconds(sandbox.pid) - worker0) / args.repeats
        inproc = n / median_seconds(lambda r=rollouts, t=tasks: local.reward(r, t), args.repeats)
        via_facade = n / median_seconds(lambda o=objects, t=tasks: facade.reward(o, t), args.repeats)
        worst = boxed if worst is None else min(worst, boxed)
        print(f"{n:>8,} {boxed:>13,.0f} {n / cpu:>12,.0f} {inproc:>13,.0f} {inproc / boxed:>8.1f}x "
              f"{via_facade:>18,.0f}")
    sandbox.close()
    facade.close()
    print(f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores: wall-clock rates drop on a busy machine)")
    print(f"slowest sandboxed rate {worst:,.0f} rollouts/s: {'meets' if worst >= GOAL else 'MISSES'} the goal")


if __name__ == "__main__":
    main()
