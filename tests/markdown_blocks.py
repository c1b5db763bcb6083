"""What the README and docs tests read out of Markdown: the Python quickstart block and the
`evotrainer ...` command lines, each parsed by the real CLI parser."""

import re
import shlex

import pytest


def python_quickstart(text: str) -> str:
    """The Python quickstart block: the one that opens with `from evotrainer import`."""
    found = re.search(r"```python\n(from evotrainer import [^(\n]*\n.*?)```", text, re.S)
    assert found, "no ```python block starting with `from evotrainer import` (not parenthesised)"
    return found.group(1)


def command_lines(text: str) -> list[str]:
    """Every `evotrainer ...` line of the ```bash blocks of a Markdown text."""
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip().startswith("evotrainer ")]


def assert_commands_parse(text: str, where: str) -> list[list[str]]:
    """Each command line parses with the real parser (a renamed command or flag fails here)."""
    from evotrainer.cli.app import build_parser

    parsed = []
    for line in command_lines(text):
        argv = shlex.split(line, comments=True)[1:]
        try:
            build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"{where}: `{line}` does not parse with evotrainer's CLI")
        parsed.append(argv)
    return parsed
