"""Comments and docstrings say what the code does and why, not what it once did: a reader of the
package needs the rule, and the history is in git. ("used to" meaning "employed to" is fine.)"""

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HISTORY = re.compile(r"\b(previously|formerly|before the fix|no longer|used to (?:be|pass|surface|lose|land|leave|"
                     r"produce|reject|raise|default|save|drop|fail|say|give|read|write|run|crash))\b", re.I)


def _prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a module."""
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
           if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = node.body[0] if node.body else None
            if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str):
                out += [(doc.lineno + i, line) for i, line in enumerate(doc.value.value.splitlines())]
    return out


def test_no_comment_narrates_what_the_code_used_to_do():
    found = []
    for path in sorted((ROOT / "evotrainer").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for line, text in _prose(path.read_text()):
            if HISTORY.search(text):
                found.append(f"{rel}:{line}: {text.strip()}")
    assert not found, "comments that narrate history:\n" + "\n".join(found)


def test_the_check_finds_narration_and_leaves_employed_to_alone():
    src = '"""Module."""\n# a damaged file used to pass\nx = 1   # used to keep the README in step\n'
    assert [HISTORY.search(t) is not None for _, t in sorted(_prose(src))] == [False, True, False]
