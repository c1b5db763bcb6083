"""Named crash points for the resume tests: ``EVOTRAINER_CRASH_AT=<label>`` makes the process die
(``os._exit(137)``, like ``kill -9``: no cleanup, no state save) the first time it reaches that point.

The kill -9 test used to land by timing (sleep after a log line), which hit each window only by
luck; a named point hits exactly the window between one effect and the save that records it.
Unset (always, outside tests), a point costs one environment lookup.
"""

from __future__ import annotations

import os

ENV = "EVOTRAINER_CRASH_AT"


def crash_point(label: str) -> None:
    if os.environ.get(ENV) == label:
        _die()


def _die() -> None:
    os._exit(137)
