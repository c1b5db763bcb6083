"""What an episode's records say about its calls and its handed-in patch. Training
(``policy/imitation.py``: which guided turns to imitate) and the engine's judgement
(``fitness/episodes.py``: valid calls, progress, vandalism) read them the same way, so one module
below both says it once."""

from __future__ import annotations

from typing import Any


def accepted(call: object) -> bool:
    """A call record the environment took: a known tool with arguments it accepted (``error`` None)."""
    return isinstance(call, dict) and bool(call.get("name")) and call.get("error") is None


def broke_passing_tests(grade: dict[str, Any]) -> bool:
    """The graded patch applied and a test that passed before it (PASS_TO_PASS) fails after: the
    vandalism a credit for any applied edit taught (a function's ``def`` line replaced by ``...``)."""
    return bool(grade.get("patch_applied")) and any(
        isinstance(t, dict) and not t.get("passed") for t in (grade.get("pass_to_pass") or {}).values())
