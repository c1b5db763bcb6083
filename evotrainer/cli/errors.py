"""The command line's one error policy: a person sees one or two lines, never a traceback.

Every command runs through :func:`run_command`. A *user's* error (a bad config field, a directory
that is not a run, a harness that breaks the contract, a missing data file, a model path that does
not exist) prints ``error: <what and where>`` and exits 2; the lower layers raise these with
messages that name the file or field and say how to fix it. Anything else (a harness that fails
while training, a bug) prints ``error: <kind>: <message>`` with a pointer to ``--debug`` and exits 1.
``--debug`` or ``EVOTRAINER_DEBUG=1`` lets the traceback through instead. Output cut short by a
reader that went away (``evotrainer status RUN | head``) ends the command quietly.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable

from evotrainer.config import ConfigError
from evotrainer.records.run_dir import RunDirError

# Errors raised in the user's terms, by module: looked up only in modules already imported, so that
# the policy never imports torch (an error of a module that was never imported cannot have happened).
USER_ERRORS = {
    "evotrainer.genome.errors": ("GenomeError",),
    "evotrainer.domains.math.loaders": ("TaskFormatError",),
    "evotrainer.policy.base_model": ("ModelNotFoundError",),
    "evotrainer.loop.knowledge.skills": ("SkillLibraryError",),
    "evotrainer.fitness.labels": ("LabelStoreError",),
    "evotrainer.records.rollout": ("RolloutFileError",),
    "evotrainer.loop.compute.train_branch": ("InitAdapterError",),
}


def debug_enabled(flag: bool = False) -> bool:
    return flag or os.environ.get("EVOTRAINER_DEBUG", "").strip() not in ("", "0", "false", "no")


def _user_error_types() -> tuple[type, ...]:
    # A file the user named that is missing or unreadable is theirs to fix; the message names it.
    found: list[type] = [ConfigError, RunDirError, FileNotFoundError, IsADirectoryError, NotADirectoryError,
                         PermissionError]
    for module, names in USER_ERRORS.items():
        mod = sys.modules.get(module)
        found += [getattr(mod, n) for n in names if mod is not None and hasattr(mod, n)]
    return tuple(found)


def describe(err: BaseException) -> tuple[str, int]:
    """(the lines shown, the exit code) for an error that ended a command."""
    text = str(err).strip() or type(err).__name__
    if isinstance(err, _user_error_types()):
        return f"error: {text}", 2
    if isinstance(err, KeyError) and err.args:   # KeyError's str() is the repr of its key
        text = str(err.args[0])
    return (f"error: {type(err).__name__}: {text}\n"
            "(rerun with --debug or EVOTRAINER_DEBUG=1 for the traceback)"), 1


def run_command(func: Callable[[Any], Any], args: Any, debug: bool = False) -> int:
    """Runs one command under the policy; returns its exit code."""
    try:
        code = int(func(args) or 0)
        sys.stdout.flush()   # here, not at exit, so that a closed pipe is caught like any other
        return code
    except BrokenPipeError:
        _silence_stdout()
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except Exception as err:  # noqa: BLE001 - this is the one place every failure is turned into lines
        if debug_enabled(debug):
            raise
        text, code = describe(err)
        try:
            print(text, file=sys.stderr)
        except BrokenPipeError:
            pass
        return code


def _silence_stdout() -> None:
    """The reader of our output is gone: later writes (and the interpreter's final flush) go nowhere."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def number(kind: type = float, low: float | None = None, high: float | None = None, low_open: bool = False):
    """An argparse ``type`` that refuses numbers outside [low, high] (``low_open``: low excluded), so
    ``--timeout -5`` or ``--events 0`` is a usage error instead of being accepted."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if low is not None and (value <= low if low_open else value < low):
            raise argparse.ArgumentTypeError(f"{value} must be {'>' if low_open else '>='} {low}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{value} must be <= {high}")
        return value
    parse.__name__ = kind.__name__   # argparse names the type in its messages
    return parse
