"""The command line: one module per command group, assembled by :mod:`evotrainer.cli.app`."""

from evotrainer.cli.app import main

__all__ = ["main"]
