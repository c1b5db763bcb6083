"""Named crash points for the resume tests: ``EVOTRAINER_CRASH_AT=<label>`` makes the process die
(``os._exit(137)``, like ``kill -9``: no cleanup, no state save) the first time it reaches that point.

A kill -9 timed by the test (a sleep after a log line) would hit each window only by luck; a named
point hits exactly the window between one effect and the save that records it.
Unset (always, outside tests), a point costs one environment lookup.

``EVOTRAINER_CRASH_ONCE=<file>`` makes the crash happen once across processes: the first process to
reach the point creates the file and dies, later ones (a retried Ray worker) go on.
"""

from __future__ import annotations

import os

ENV = "EVOTRAINER_CRASH_AT"
ONCE_ENV = "EVOTRAINER_CRASH_ONCE"


def crash_point(label: str) -> None:
    if os.environ.get(ENV) == label:
        once = os.environ.get(ONCE_ENV)
        if once:
            try:
                os.close(os.open(once, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return
        _die()


def _die() -> None:
    os._exit(137)
