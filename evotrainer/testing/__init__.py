"""Planted scenarios the validity checks must catch: fixtures for the tests and benchmarks, not part of the loop.

A run never uses this package. It builds version directories with a known reward hack or leak in them,
so that a test or a benchmark can assert the engine's checks and gates flag it:

* ``planted.py`` — the math planted leak: an honest branch, a branch under a format-only reward, and
  its twin that copies the leaked reference note (``build_scenario``, ``planted_leak_scenario``).
* ``swe_planted.py`` — the SWE git-history leak: an honest scripted branch and one that copies the fix
  from the repository's history (``build_swe_leak_scenario``).
* ``learning_harness.py`` — the reference harness with a length tie-break reward, under which a random
  model's every step trains (``always_learns``).
* ``fixtures/`` — the hand-written harness files those scenarios train or backtest (data, not imported).

Why a package of its own, named ``testing`` (as ``optuna.testing``): the scenarios train real branches
through ``loop`` and read them through ``fitness``, so they sit above the loop; kept inside ``loop/``
they read as one of its stages. Shipping them in the package (rather than under ``tests/``) lets
``benchmarks/`` and downstream tests build the same scenarios. It is a top layer beside ``cli``:
it may import every other part, and no module of ``evotrainer`` imports it (``tests/test_layers.py``).
"""
