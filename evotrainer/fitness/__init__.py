"""Fitness: judging branch versions on evidence before and after training compute is spent.

    cache.py         CachedVersion: a version dir's rollouts, genome and the engine's own task data
    health.py        health_report → HealthReport: harness diagnostics (sandboxed) + engine metrics
    backtest.py      backtest → BacktestResult: replay a candidate genome on a parent's cache
    labels.py        labelled history (LabelStore, DiagnosticGap) and score_diagnostics
    gates.py         gate → GateDecision: engine validity checks, the harness's validity, paired stats
    paired_stats.py  paired per-task deltas, bootstrap CI, decide_promotion
    planted.py       the planted-leak scenario (tests and benchmarks/planted_leak.py)
    commands.py      the `report`, `backtest` and `gate` CLI commands

Import the submodules directly; this package imports nothing so that the CLI starts fast.
"""
