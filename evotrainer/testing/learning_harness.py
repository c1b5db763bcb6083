"""A harness under which a random model learns: for tests and benchmarks on weights that answer nothing right.

A random (or tiny) model's rollouts are all wrong, so under the reference harness every group is dead and
the trainer skips every step. This harness adds a length tie-break to the reference's correctness reward,
so every group carries signal and every step trains: what a speed benchmark or a loop test that needs
trained children wants.
"""

from __future__ import annotations

from evotrainer.genome.edits import rewrite_hook
from evotrainer.genome.program import HarnessProgram, reference_program

ALWAYS_LEARNS = (
    "def reward(rollouts, tasks):\n"
    "    \"\"\"Correctness, plus a length tie-break: no group is dead, every step learns.\"\"\"\n"
    "    return [(1.0 if r['visible'].get('correct') else 0.0) + 0.001 * len(r['completion']) for r in rollouts]\n")


def always_learns() -> HarnessProgram:
    """The reference harness with the length tie-break reward."""
    return rewrite_hook(reference_program(), "reward", ALWAYS_LEARNS)
