"""The tool environment of an SWE episode: tools over a scratch copy of one repository.

Tool-call format. SmolLM2's chat template is ChatML: it carries plain text per message and has no
tool role, so a call is a fenced block in the assistant's text, holding one JSON object::

    ```tool
    {"name": "read_file", "args": {"path": "pkg/stats.py", "start": 1, "end": 40}}
    ```

The first such block of a turn is the call; its result comes back as the next user message. A
turn without a block, a block that is not a JSON object, an unknown tool or bad arguments get an
error message back (and cost the turn), never an exception.

Tools: ``list_files``, ``read_file`` (line ranges), ``search`` (regex), ``edit`` (search/replace of
a unique text; an empty ``search`` creates a file), ``run_tests`` (all, or ids/paths given),
``view_diff``, ``git_log`` (the repository's history with diffs) and ``submit`` (hands in the
current diff, ends the episode). The file tools work on an in-memory copy, so no host path is
reachable from them; the only tool that runs code, ``run_tests``, runs it in the code domain's
sandbox. ``history_calls`` counts ``git_log`` calls: the diagnostic that exposed the history leak.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from evotrainer.domains.code.executor import CodeExecutor
from evotrainer.domains.swe.patching import PatchError, clean_path, diff_files
from evotrainer.domains.swe.runner import collect_tests, run_many, runner_program
from evotrainer.domains.swe.token_edits import EDIT_FORMS, quoted_texts, token_variants

TOOL_RE = re.compile(r"```[ \t]*tool[ \t]*\n(.*?)```", re.S)
TOOL_DOCS = {
    "list_files": '{"path": "optional folder prefix"}: the repository\'s files',
    "read_file": '{"path": "pkg/mod.py", "start": 1, "end": 40}: numbered lines (start/end optional)',
    "search": '{"pattern": "regex", "path": "optional prefix"}: matching lines as path:line: text',
    "edit": '{"path": "pkg/mod.py", "search": "exact old text", "replace": "new text"}: replaces the one '
            'occurrence of search (empty search: create the file)',
    "run_tests": '{"tests": ["tests/test_x.py", "tests/test_x.py::test_y"]}: runs those tests (none given: all)',
    "view_diff": "{}: your changes so far, as a unified diff",
    "git_log": "{}: the repository's commit history with diffs",
    "submit": "{}: hands in your changes and ends the episode",
}


@dataclass(frozen=True)
class EnvLimits:
    max_turns: int = 30              # model turns per episode
    max_turn_tokens: int = 1024      # a longer turn is cut to this many tokens
    max_context_tokens: int = 16384  # the conversation may not grow beyond this
    wall_s: float = 300.0            # the whole episode's own generation and tool time
    max_result_chars: int = 4000     # one tool result, cut beyond this
    max_file_chars: int = 200_000    # an edit may not grow a file beyond this


def approx_tokens(text: str) -> int:
    """A tokenizer-free estimate (about 4 characters a token) for the limits; a real count can be
    passed to the episode instead."""
    return (len(text) + 3) // 4


def tool_prompt() -> str:
    lines = "\n".join(f"- {name} {doc}" for name, doc in TOOL_DOCS.items())
    return ("You fix bugs in a Python repository using tools. Call one tool per turn with a fenced block:\n"
            '```tool\n{"name": "read_file", "args": {"path": "pkg/mod.py"}}\n```\n'
            f"Tools:\n{lines}\nWhen the tests pass, call submit.")


# The order a fix takes: look at the code, change it, check it, hand it in. A guided episode of the
# ``plan`` kind (``guided_plan_share``) decodes its turns under these tools in turn, then any tool.
TOOL_PLAN = ("read_file", "edit", "run_tests", "submit")
MAX_SEARCH_LINES = 400   # per file: bounds the grammar of a large file (level-1 files hold tens of lines)


def is_test_path(path: str) -> bool:
    return path.startswith("tests/") or path.rsplit("/", 1)[-1].startswith("test_")


def unique_lines(text: str) -> list[str]:
    """The lines of ``text`` an edit can name as its search text: not blank, occurring once in the
    whole text (as a substring, so ``return x`` is out when ``return x + 1`` is there too)."""
    seen = [ln for ln in dict.fromkeys(text.splitlines()) if ln.strip() and text.count(ln) == 1]
    return seen[:MAX_SEARCH_LINES]


def call_grammar(files: Sequence[str] | Mapping[str, str], tool: str | None = None, edit: str = "line",
                 issue: str = "") -> str:
    """The form of one valid tool call, as a grammar (Lark with llguidance's ``%json``): the fenced
    block, a JSON object naming one tool with that tool's arguments, every path one of ``files``
    (the repository's) and every test path one of its test files. What a guided turn is decoded
    under (``policy/guided_decoding.py``): it fixes the form and the choice of file, never what an
    edit says. ``files`` given with their texts: an edit names a source file (never a test) and one
    of that file's :func:`unique_lines` as its search text, so a guided edit applies (unless its
    replacement is the line itself: the environment refuses an edit that changes nothing).
    ``tool``: that tool only (a ``plan`` turn); else any. ``edit``: what the replacement may be, given
    the texts: ``line`` any one line, ``token`` one of the search line's one-token variants
    (``token_edits.py``; only lines that have one can be named), ``quoted`` as ``token`` with the
    search line one that ``issue`` quotes where it quotes any (level 0's issue quotes the wrong line:
    the rung gives the line, so the policy learns the change), else as ``token``."""
    if edit not in EDIT_FORMS:
        raise ValueError(f"edit must be one of {EDIT_FORMS}, not {edit!r}")
    paths = sorted(files)
    tests = [p for p in paths if is_test_path(p)] or paths
    # Strings are unbounded (the turn's token budget bounds them): a maxLength makes llguidance's lexer
    # 20-100x slower per token. Whitespace is fixed to the prompt's example (", " and ": "): free
    # whitespace lets a weak policy spin in blanks until the turn's budget runs out.
    path = {"enum": paths} if paths else {"type": "string"}
    text = {"type": "string"}
    line = {"type": "integer", "minimum": 1, "maximum": 9999}
    edits: list[dict] = [{"path": path, "search": text, "replace": text}]
    if isinstance(files, Mapping):
        line["maximum"] = max([len(t.splitlines()) for t in files.values()] + [1])
        # one line replaces one line: a guided edit keeps the file's line structure
        one_line = {"type": "string", "pattern": "^[^\\n]*$"}
        sources = [(p, unique_lines(files[p])) for p in paths if not is_test_path(p)]
        if edit in ("token", "quoted"):   # one alternative per Python line: its replacement is one of its variants
            forms = [{"path": {"const": p}, "search": {"const": ln}, "replace": {"enum": variants}}
                     for p, lines in sources if p.endswith(".py") for ln in lines if (variants := token_variants(ln))]
            quoted = quoted_texts(issue) if edit == "quoted" else set()
            forms = [f for f in forms if f["search"]["const"].strip() in quoted] or forms
        else:
            forms = [{"path": {"const": p}, "search": {"enum": lines}, "replace": one_line}
                     for p, lines in sources if lines]
        edits = forms or edits
    args = {
        "list_files": [({}, [])],
        "read_file": [({"path": path, "start": line, "end": line}, ["path"])],
        "search": [({"pattern": text, "path": path}, ["pattern"])],
        "edit": [(props, ["path", "search", "replace"]) for props in edits],
        "run_tests": [({"tests": {"type": "array", "items": {"enum": tests}, "maxItems": 4}}, [])],
        "view_diff": [({}, [])], "git_log": [({}, [])], "submit": [({}, [])],
    }
    assert set(args) == set(TOOL_DOCS), "every tool has its arguments' schema"
    if tool is not None and tool not in args:
        raise ValueError(f"no tool {tool!r}; tools: {', '.join(TOOL_DOCS)}")
    schema = {
        "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
        "oneOf": [{"type": "object", "additionalProperties": False, "required": ["name", "args"],
                   "properties": {"name": {"const": name},
                                  "args": {"type": "object", "properties": props, "required": required,
                                           "additionalProperties": False}}}
                  for name, forms in args.items() if tool in (None, name) for props, required in forms],
    }
    return 'start: "```tool\\n" call "\\n```"\ncall: %json ' + json.dumps(schema)


class ToolError(Exception):
    """A tool call the environment refuses; its message goes back to the model."""


class SWEEnvironment:
    def __init__(self, files: dict[str, str], history: list[dict[str, str]] | None = None,
                 executor: CodeExecutor | None = None, limits: EnvLimits | None = None, issue: str = "") -> None:
        self.base = dict(files)
        self.issue = issue   # the issue's text: what a ``quoted`` guided edit may name (call_grammar)
        self.files = dict(files)
        self.history = list(history or [])
        self.limits = limits or EnvLimits()
        self._executor, self._own_executor = executor, executor is None
        self.history_calls = 0
        self.submitted: str | None = None
        self.calls: list[dict[str, Any]] = []

    @property
    def done(self) -> bool:
        return self.submitted is not None

    @property
    def quotes_a_line(self) -> bool:
        """Whether the issue quotes a line of a source file that a one-token edit can change: where
        ``guided_edit: quoted`` differs from ``token`` (a level-0 issue quotes the wrong line; level 1
        quotes calls and names, never such a line). The report reads it: a change between the two
        edit forms is a change only on such issues."""
        quoted = quoted_texts(self.issue)
        return bool(quoted) and any(
            ln.strip() in quoted and token_variants(ln)
            for path, text in self.base.items() if path.endswith(".py") and not is_test_path(path)
            for ln in unique_lines(text))

    @property
    def executor(self) -> CodeExecutor:
        if self._executor is None:
            self._executor = CodeExecutor(1)
        return self._executor

    def close(self) -> None:
        if self._own_executor and self._executor is not None:
            self._executor.close()
            self._executor = None

    def call_grammar(self, tool: str | None = None, edit: str = "line") -> str:
        """:func:`call_grammar` over this repository's files as they are now (``tool``: that tool only;
        ``edit``: the form of an edit's replacement)."""
        return call_grammar(self.files, tool, edit, self.issue)

    def diff(self) -> str:
        return diff_files(self.base, self.files)

    # -- one turn --------------------------------------------------------------------------------
    def step(self, text: str) -> tuple[str, dict[str, Any]]:
        """The result message for one model turn, and a record of the call."""
        start = time.perf_counter()
        record: dict[str, Any] = {"name": None, "args": None, "error": None}
        try:
            name, args = parse_call(text)
            record.update(name=name, args=args)
            result = self.call(name, args)
        except ToolError as e:
            record["error"] = str(e)
            result = f"error: {e}"
        if len(result) > self.limits.max_result_chars:
            result = result[: self.limits.max_result_chars] + f"\n[... cut at {self.limits.max_result_chars} characters]"
        record["seconds"] = time.perf_counter() - start
        self.calls.append(record)
        return result, record

    def call(self, name: str, args: dict[str, Any]) -> str:
        handler = getattr(self, f"_tool_{name}", None)
        if name not in TOOL_DOCS or handler is None:
            raise ToolError(f"unknown tool {name!r}; tools: {', '.join(TOOL_DOCS)}")
        if self.done:
            raise ToolError("the episode is over (submitted)")
        try:
            return handler(**args)
        except (TypeError, AttributeError) as e:   # a missing, unknown or mistyped argument
            raise ToolError(f"bad arguments for {name}: {e}; expected {TOOL_DOCS[name]}") from None

    # -- tools -----------------------------------------------------------------------------------
    def _path(self, path: Any, must_exist: bool = True) -> str:
        if not isinstance(path, str) or not path.strip():
            raise ToolError("path must be a non-empty string")
        try:
            clean = clean_path(path)
        except PatchError as e:
            raise ToolError(str(e)) from None
        if clean is None or (must_exist and clean not in self.files):
            raise ToolError(f"no file {path!r} (list_files shows the files)")
        return clean

    def _tool_list_files(self, path: str = "") -> str:
        shown = [p for p in sorted(self.files) if p.startswith(path.strip("/"))]
        return "\n".join(shown) if shown else f"no files under {path!r}"

    def _tool_read_file(self, path: str, start: int = 1, end: int | None = None) -> str:
        lines = self.files[self._path(path)].splitlines()
        if not isinstance(start, int) or (end is not None and not isinstance(end, int)):
            raise ToolError("start and end must be integers")
        start = max(1, start)
        end = len(lines) if end is None else min(end, len(lines))
        if start > max(end, 1):
            raise ToolError(f"{path} has {len(lines)} lines; start {start} is past its end")
        return "\n".join(f"{i:4d} | {lines[i - 1]}" for i in range(start, end + 1))

    def _tool_search(self, pattern: str, path: str = "") -> str:
        try:
            rx = re.compile(pattern)
        except (re.error, TypeError) as e:
            raise ToolError(f"bad pattern {pattern!r}: {e}") from None
        hits = [f"{p}:{i}: {ln.strip()}" for p in sorted(self.files) if p.startswith(path.strip("/"))
                for i, ln in enumerate(self.files[p].splitlines(), 1) if rx.search(ln)]
        more = f"\n[{len(hits) - 50} more]" if len(hits) > 50 else ""
        return "\n".join(hits[:50]) + more if hits else f"no match for {pattern!r}"

    def _tool_edit(self, path: str, search: str, replace: str) -> str:
        if not isinstance(search, str) or not isinstance(replace, str):
            raise ToolError("search and replace must be strings")
        if search == "":
            clean = self._path(path, must_exist=False)
            if clean in self.files:
                raise ToolError(f"{clean} exists; give the text to replace in search")
            new = replace
        else:
            clean = self._path(path)
            count = self.files[clean].count(search)
            if count != 1:
                raise ToolError(f"search text found {count} times in {clean}; it must occur exactly once "
                                "(add surrounding lines)" if count else f"search text not found in {clean}")
            if replace == search:   # accepted, it would count as an edit and change nothing (a 135M policy's habit)
                raise ToolError("replace is the same as search: the edit changes nothing; write the corrected text")
            new = self.files[clean].replace(search, replace, 1)
        if len(new) > self.limits.max_file_chars:
            raise ToolError(f"the edit would make {clean} longer than {self.limits.max_file_chars} characters")
        self.files[clean] = new
        return f"edited {clean}"

    def _tool_run_tests(self, tests: list[str] | str | None = None) -> str:
        broken: list[str] = []
        every = collect_tests(self.files, broken)
        wanted = [] if tests is None else [tests] if isinstance(tests, str) else tests
        if not isinstance(wanted, list) or not all(isinstance(t, str) for t in wanted):
            raise ToolError("tests must be a list of test ids or file paths")
        ids = [t for t in every if not wanted or any(t == w or t.startswith(w.rstrip(":") + "::") for w in wanted)]
        broken = [b for b in broken if not wanted or any(b.startswith(w.split("::")[0] + ":") for w in wanted)]
        if not ids:
            raise ToolError("; ".join(broken) if broken else f"no tests match {wanted}" if wanted
                            else "the repository has no tests")
        (res,) = run_many(self.executor, [(runner_program(self.files, ids), ids)])
        # wrong_answer carries the test's own failure text; other verdicts (timeout, ...) are named
        failed = [f"{tid}: {r['detail'] if r['verdict'] == 'wrong_answer' else r['verdict'] + ': ' + r['detail']}"
                  for tid, r in res.items() if not r["passed"]]
        summary = f"{len(ids) - len(failed)} passed, {len(failed)} failed"
        return summary + "".join("\n" + line for line in failed + broken)

    def _tool_view_diff(self) -> str:
        return self.diff() or "no changes"

    def _tool_git_log(self) -> str:
        self.history_calls += 1
        out = []
        for c in reversed(self.history):
            out.append(f"commit {c['commit']}\n\n    {c['message']}\n" + (f"\n{c['diff']}" if c.get("diff") else ""))
        return "\n".join(out) or "no history"

    def _tool_submit(self) -> str:
        self.submitted = self.diff()
        return "submitted" + ("" if self.submitted else " (no changes)")


def parse_call(text: str) -> tuple[str, dict[str, Any]]:
    """(tool name, arguments) of the first ```tool block; ToolError with the reason otherwise."""
    m = TOOL_RE.search(text)
    if not m:
        raise ToolError('no tool call found; write one fenced block: ```tool\n{"name": ..., "args": {...}}\n```')
    try:
        obj = json.loads(m.group(1))
    except json.JSONDecodeError as e:
        raise ToolError(f"the tool block is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ToolError('the tool block must be a JSON object with a "name" string')
    args = obj.get("args", {})
    if not isinstance(args, dict):
        raise ToolError('"args" must be a JSON object')
    return obj["name"], args
