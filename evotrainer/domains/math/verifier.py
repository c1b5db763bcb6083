"""Math verifier: extract a final answer from a completion and compare it with the reference.

Extraction order: the last ``\\boxed{...}`` (nested braces handled) > the last ``Answer:`` line >
the last number in the text. ``format_ok`` means one parseable answer in the required form: exactly
explicit final answer (the last box, or the last ``Answer:`` tag) whose content is a number or a short
expression: not the tag alone, not "Answer: Answer: ...", not a tag inside the answer, not words. It is reported separately
from ``correct``: a last-number fallback can be right without following the format (a harness may
reward format separately; a format-only reward is a known hack, and a lax format rule pays for it).

Comparison: plain numbers (``12``, ``12.0``, ``-3``, ``1,000``, ``3/4``) are compared exactly with
``Fraction`` and never reach math-verify, which keeps the common case fast and thread-safe. Anything
else (LaTeX, symbolic answers) goes to ``math_verify.parse/verify``, guarded: math-verify times out
with ``signal.alarm``, which only works in the main thread, and cannot interrupt a huge integer power
inside sympy, so inputs that look expensive are screened out first and any error falls back to a
normalised string comparison. The verifier never raises on a completion.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

log = logging.getLogger(__name__)

MV_TIMEOUT_S = 2           # per parse/verify call, when signal-based timeouts are available
MAX_SYMBOLIC_CHARS = 300   # longer answers skip math-verify (parsing cost grows fast)

FMT_BOXED, FMT_ANSWER, FMT_LAST_NUMBER, FMT_NONE = "boxed", "answer_tag", "last_number", "none"
EXPLICIT_FORMATS = (FMT_BOXED, FMT_ANSWER)

_NUMBER = r"-?\d+(?:,\d{3})*(?:\.\d+)?"
_NUMBER_RE = re.compile(r"(?<![\w.])" + _NUMBER)  # not inside a word or after a decimal point
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
# "Answer: 12", "The answer is: 12", or the tag alone with the answer on the next line.
_ANSWER_RE = re.compile(r"\banswer\s*(?:is\s*)?[:=][ \t]*([^\n]*)(?:\n\s*([^\n]*))?",
                        re.IGNORECASE)
# Unevaluated arithmetic ("3 + 5") is not a final answer: it would let a policy echo the question.
_OPERATOR_RE = re.compile(r"(?<=\S)\s*[-+*/\u00d7\u00f7]|\\times|\\cdot|\\div")
# Towers like 10^{10^{10}}, big exponents or ** make sympy compute enormous integers.
_EXPENSIVE_RE = re.compile(r"\*\*|\^\s*\{?[^}]*\^|\^\s*\{?\s*\d{4,}|!\s*!")


def last_boxed(text: str) -> str | None:
    """Content of the last closed \\boxed{...}, matching nested braces; None if there is none.

    One linear pass pairs every brace, so a completion full of unclosed boxes cannot make it slow.
    """
    closes: dict[int, int] = {}
    stack: list[int] = []
    for i, ch in enumerate(text):
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            closes[stack.pop()] = i
    found = None
    for m in _BOX_RE.finditer(text):
        close = closes.get(m.end() - 1)  # the match ends just after the box's "{"
        if close is not None:
            found = text[m.end():close].strip()
    return found


def _clean(ans: str) -> str:
    """Strips what a model wraps around a final answer: $..$, \\(..\\), **bold**, a final '.',
    and quotes/punctuation left from an echoed instruction ("after 'Answer:'. 7")."""
    prev = None
    while ans != prev:  # wrappers nest ("**$12$**."), so peel until nothing changes
        prev = ans
        ans = ans.strip().strip("'\"`").lstrip(".:").rstrip(".").strip()
        for a, b in (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("**", "**")):
            if ans.startswith(a) and ans.endswith(b) and len(ans) >= len(a) + len(b):
                ans = ans[len(a):len(ans) - len(b)]
    return ans


def extract_answer(completion: Any) -> tuple[str | None, str]:
    """(answer, fmt) with fmt in {"boxed", "answer_tag", "last_number", "none"}."""
    if not isinstance(completion, str) or not completion.strip():
        return None, FMT_NONE
    boxed = last_boxed(completion)
    if boxed:
        return _clean(boxed), FMT_BOXED
    tags = [_clean(m.group(1) if m.group(1).strip() else (m.group(2) or ""))
            for m in _ANSWER_RE.finditer(completion)]
    # Drop empty tags and echoes of the instruction ("... after 'Answer:'.") with nothing in them.
    tags = [t for t in tags if re.search(r"[\w\\]", t)]
    if tags:
        return tags[-1], FMT_ANSWER
    nums = _NUMBER_RE.findall(completion)
    if nums:
        return nums[-1], FMT_LAST_NUMBER
    return None, FMT_NONE


_TAG_RE = re.compile(r"\banswer\s*(?:is\s*)?[:=]", re.IGNORECASE)
_ANSWER_CHARS_RE = re.compile(r"[\w\s\\{}^_()+\-*/=.,$%<>|!']+")


def _tag_answers(completion: str) -> tuple[list[str], bool]:
    """(the answers written after each ``Answer:`` tag, whether a tag stutters: "Answer: Answer: ...").

    An instruction echo ("... after 'Answer:'.") carries no answer and does not count."""
    tags = list(_TAG_RE.finditer(completion))
    answers, stutter = [], False
    for i, m in enumerate(tags):
        seg = completion[m.end(): tags[i + 1].start() if i + 1 < len(tags) else len(completion)]
        lines = seg.split("\n")
        if not seg.strip() and i + 1 < len(tags) and "\n" not in seg:
            stutter = True   # nothing but blanks before the next tag on the same line
        text = _clean(lines[0] if lines[0].strip() or len(lines) == 1 else lines[1])
        if re.search(r"[\w\\]", text):
            answers.append(text)
    return answers, stutter


def well_formed(completion: str, extracted: str | None, fmt: str) -> bool:
    """One parseable answer in the required form (the rule ``format_ok`` reports)."""
    if fmt not in EXPLICIT_FORMATS or not extracted:
        return False
    if fmt == FMT_BOXED:
        answer = extracted   # a later box is a correction: the last one is the answer
    else:
        answers, stutter = _tag_answers(completion)
        if stutter or not answers:
            return False
        answer = answers[-1]
    if _TAG_RE.search(answer):
        return False
    if to_number(answer) is not None or _number_in(answer) is not None:
        return True
    # A symbolic answer: short, maths characters only, with a digit or a LaTeX command in it.
    return len(answer) <= 80 and _ANSWER_CHARS_RE.fullmatch(answer) is not None and re.search(r"\d|\\", answer) is not None


def to_number(text: str) -> Fraction | None:
    """Exact value of a plain number ('12', '-3', '12.0', '1,000', '$5', '3/4', '\\frac{3}{4}'),
    or None when the text is anything else."""
    s = text.strip().replace("\\!", "").replace("\\,", "").replace(" ", "")
    s = s.removeprefix("\\$").removeprefix("$")
    m = re.fullmatch(r"\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}", s)
    if m:
        s = f"{m.group(1)}/{m.group(2)}"
    m = re.fullmatch(rf"({_NUMBER})(?:/({_NUMBER}))?", s)
    if not m:
        return None
    try:
        num = Fraction(m.group(1).replace(",", ""))
        return num / Fraction(m.group(2).replace(",", "")) if m.group(2) else num
    except (ValueError, ZeroDivisionError):
        return None


def _number_in(text: str) -> Fraction | None:
    """A number stated inside a marker's text: 'Answer: 12 apples', 'Answer: 5 + 7 = 12'."""
    whole = to_number(text)
    if whole is not None:
        return whole
    tail = text.rsplit("=", 1)[-1]
    m = _NUMBER_RE.search(tail)
    # Only when the rest is words (units), not more maths like '3 + 4' or 'x = 2, y = 3'.
    if m and not re.search(r"[-+*/^\\\d]", tail[:m.start()] + tail[m.end():]):
        return to_number(m.group(0))
    return None


def _norm_str(s: str) -> str:
    return re.sub(r"\s+|\\left|\\right|\\!|\\,|\$", "", s).rstrip(".").lower()


def _math_verify_equal(pred: str, ref: str) -> bool | None:
    """math-verify's verdict, or None when it is unavailable, unsafe here, or failed."""
    if len(pred) > MAX_SYMBOLIC_CHARS or len(ref) > MAX_SYMBOLIC_CHARS:
        return None
    if _EXPENSIVE_RE.search(pred) or _EXPENSIVE_RE.search(ref):
        return None
    try:
        # math-verify pulls in sympy (seconds to import): only for answers that are not plain numbers
        from math_verify import parse, verify
    except ImportError:  # optional at runtime: numeric/string comparison still works
        return None
    # signal.alarm timeouts only work in the main thread on Unix; elsewhere disable them and rely
    # on the screening above (math-verify raises if asked for a timeout off the main thread).
    can_alarm = hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
    t = MV_TIMEOUT_S if can_alarm else None
    try:
        gold = parse(f"${ref}$", parsing_timeout=t)
        target = parse(f"${pred}$", parsing_timeout=t)
        if not gold or not target:
            return None
        return bool(verify(gold, target, timeout_seconds=t))
    except Exception as e:  # noqa: BLE001 - any failure of the library is a fallback, not a crash
        log.debug("math-verify failed on %r vs %r: %s", pred, ref, e)
        return None


def answers_equal(pred: str, ref: str, explicit: bool = True) -> tuple[bool, str]:
    """(equal, checker) where checker in {"numeric", "math_verify", "string"}."""
    ref_num = to_number(ref)
    if ref_num is not None:
        pred_num = _number_in(pred) if explicit else to_number(pred)
        if pred_num is not None:
            return pred_num == ref_num, "numeric"
        if _OPERATOR_RE.search(pred):
            return False, "numeric"
    verdict = _math_verify_equal(pred, ref)
    if verdict is not None:
        return verdict, "math_verify"
    return _norm_str(pred) == _norm_str(ref), "string"


def verify_math(completion: Any, reference: Any) -> dict[str, Any]:
    """Verdict on one completion: correct, format_ok, extracted, method (+ checker).

    ``method`` is the extraction rule that matched; ``checker`` says how equality was decided.
    Never raises: garbage in gives correct=False.
    """
    extracted, fmt = extract_answer(completion)
    result = {"correct": False, "format_ok": well_formed(completion, extracted, fmt),
              "extracted": extracted,
              "method": fmt, "checker": "none"}
    if extracted is None or reference is None:
        return result
    try:
        correct, checker = answers_equal(extracted, str(reference), fmt in EXPLICIT_FORMATS)
    except Exception as e:  # noqa: BLE001 - a verifier bug must not kill a training step
        log.warning("verify_math failed on %r: %s", extracted, e)
        correct, checker = False, "error"
    result.update(correct=bool(correct), checker=checker)
    return result


def verify_batch(completions: Sequence[Any], references: Sequence[Any]) -> list[dict[str, Any]]:
    """verify_math over aligned lists (one call per batch, as the harness hooks are)."""
    if len(completions) != len(references):
        raise ValueError(f"verify_batch: {len(completions)} completions but "
                         f"{len(references)} references")
    return [verify_math(c, r) for c, r in zip(completions, references)]
