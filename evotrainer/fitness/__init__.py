"""Fitness: judging branch versions on evidence before and after training compute is spent.

    cache.py           CachedVersion: a version dir's rollouts, genome and the engine's own task data
    engine_metrics.py  engine metrics and alerts read off the cache (no genome code)
    episodes.py        what the engine reads off multi-turn episodes: calls, edits, test runs, progress
    health.py          health_report → HealthReport: harness diagnostics (sandboxed) + engine metrics
    backtest.py        backtest → BacktestResult: replay a candidate genome on a parent's cache
    labels.py          labelled history (LabelStore, DiagnosticGap) and score_diagnostics
    gate_config.py     GateConfig: validity thresholds, the paired test's level and margin; gate_config
    gates.py           gate → GateDecision: engine validity checks, the harness's validity, paired stats
    validity.py        engine_checks: the validity checks no harness can disable
    leak.py            the leak check's statistics (copying on planted-leak prompts vs clean ones)
    prompt_leak.py     whether a harness's ``prompt`` hook put the answer or hidden data into the prompt
    paired_stats.py    paired per-task deltas, bootstrap CI, decide_promotion
    hypothesis.py      judge_effect: an intervention's claim confirmed, refuted or untestable

The planted-leak scenario is ``testing/planted.py``; the `report`, `backtest` and `gate` commands are
``cli/fitness.py``.

Import the submodules directly; this package imports nothing so that the CLI starts fast.
"""
