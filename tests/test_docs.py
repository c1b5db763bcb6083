"""The docs site says what the code does: the generated references cover every config field and every
command, the quickstart and guide code runs, every command shown parses, and `make test` builds the
site with warnings as errors (so a broken link or a stale API name fails CI)."""

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

from tests.markdown_blocks import assert_commands_parse, python_quickstart

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
QUICKSTART = (DOCS / "getting-started" / "quickstart.md").read_text()


def _gen_reference():
    """docs/gen_reference.py, the mkdocs hook that writes the reference pages (not a package module)."""
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _config_rows() -> dict[str, list[str]]:
    rows = {}
    for line in _gen_reference().config_reference().splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        assert len(cells) == 4, f"a config reference row that is not 4 cells: {line!r}"
        rows[cells[0].strip("`")] = cells
    return rows


def _docs_pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def test_config_reference_defaults_are_the_models_and_the_seed_harnesses():
    from evotrainer.config import Config, GRPOSection
    from evotrainer.loop.seed import load_program

    rows = _config_rows()
    for name, field in Config.model_fields["train"].annotation.model_fields.items():
        assert repr(field.get_default(call_default_factory=True)) in rows[f"train.{name}"][2]
    # The grpo fields default to None in the model: their real defaults are each domain's seed harness knobs.
    for name in GRPOSection.model_fields:
        for domain in ("math", "code", "swe"):
            knob = load_program(None, domain).knobs.get(name)
            if knob is not None:
                assert repr(knob["value"]) in rows[f"grpo.{name}"][2], (name, domain)


def test_config_reference_notes_must_name_real_fields(monkeypatch):
    gen = _gen_reference()
    monkeypatch.setitem(gen.NOTES, "train.no_such_field", "a note left behind by a removed field")
    with pytest.raises(ValueError, match="train.no_such_field"):
        gen.config_reference()


def test_config_reference_escapes_the_pipes_of_union_types():
    rows = _config_rows()
    assert rows["harness"][1] == r"str \| None"
    assert "EpisodeConfig" not in "".join(cells[1] for cells in rows.values())


def test_cli_reference_covers_every_command_and_option():
    import argparse

    from evotrainer.cli.app import build_parser

    page = _gen_reference().cli_reference()

    def walk(name, parser):
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, subparser in action.choices.items():
                    yield from walk(f"{name} {sub}", subparser)

    for name, parser in walk("evotrainer", build_parser()):
        assert f"`{name}`" in page, f"the CLI reference lacks {name}"
        section = page.split(f"`{name}`\n", 1)[1]
        for action in parser._actions:
            for option in action.option_strings:
                assert option in section, f"the CLI reference lacks {name} {option}"


def test_quickstart_shows_every_command_and_each_parses():
    from evotrainer.cli.app import build_parser

    top = {a for a in build_parser()._actions if a.dest == "command"}.pop().choices
    shown = {argv[0] for argv in assert_commands_parse(QUICKSTART, "quickstart.md")}
    assert not set(top) - shown, f"the quickstart shows no example of: {sorted(set(top) - shown)}"


def test_every_command_in_the_docs_parses():
    for page in _docs_pages():
        assert_commands_parse(page.read_text(), str(page.relative_to(ROOT)))


def test_quickstart_python_is_the_readmes_and_the_pieces_underneath_run(tmp_path):
    """The loop block is the README's (run by test_readme); the lower-level block runs on the tiny model."""
    assert python_quickstart(QUICKSTART) == python_quickstart(README)
    code = re.search(r"```python\n(from evotrainer import \(.*?)```", QUICKSTART, re.S).group(1)
    assert code.count('load_base_model("smollm2-135m")') == 1
    scope: dict = {}
    exec(compile(code.replace('load_base_model("smollm2-135m")', 'load_base_model("tiny-random")'),
                 "quickstart.md", "exec"), scope)
    assert len(scope["outs"]) == 1 and scope["trainer"] is not None


def test_the_operator_guide_snippet_is_a_working_operator():
    from evotrainer.genome.program import reference_program
    from evotrainer.operators import Evidence, get_operator
    from evotrainer.operators import registry

    page = (DOCS / "guides" / "write-an-operator.md").read_text()
    code = re.search(r"```python\n(from evotrainer.operators import register_operator.*?)```", page, re.S).group(1)
    try:
        exec(compile(code, "write-an-operator.md", "exec"), {})
        iv = get_operator("double_lr").propose([reference_program()], Evidence())
        assert iv.factor == "knob:learning_rate" and iv.child().knob_values["learning_rate"] > 1e-4
    finally:
        registry._registered.pop("double_lr", None)  # leave the registry as other tests expect it


def test_the_harness_guide_edit_passes_the_contract_and_filters_groups(tmp_path, capsys):
    """The guide's edit, made as it says (copy the reference, replace keep_groups), is a valid harness
    whose keep_groups drops groups the reference keeps."""
    from evotrainer.cli.app import main
    from evotrainer.genome.program import REFERENCE_PATH

    page = (DOCS / "guides" / "write-a-harness.md").read_text()
    hook = re.search(r"```python\n(def keep_groups.*?)```", page, re.S).group(1)
    source = REFERENCE_PATH.read_text()
    edited = re.sub(r"def keep_groups\(groups\):\n.*?(?=# EVOLVE-BLOCK-END)", lambda _: hook, source, count=1, flags=re.S)
    assert edited != source
    path = tmp_path / "my_harness.py"
    path.write_text(edited)
    assert main(["genome", "check", str(path)]) == 0
    capsys.readouterr()
    assert main(["genome", "run", str(path), "--hook", "keep_groups"]) == 0
    kept = json.loads(capsys.readouterr().out)
    assert main(["genome", "run", str(REFERENCE_PATH), "--hook", "keep_groups"]) == 0
    assert all(json.loads(capsys.readouterr().out)) and not all(kept)


def test_benchmark_results_name_their_date_command_and_raw_file():
    """Every result on the benchmarks pages carries its date, command and raw file, and a raw file it
    names exists: a theme page's `##` sections, and the archive's `###` sections under their dates."""
    pages = DOCS / "benchmarks"
    results = [section for theme in ("substrate", "math", "code", "swe")
               for section in re.split(r"\n## ", (pages / f"{theme}.md").read_text())[1:]]
    results += re.split(r"\n### ", (pages / "archive.md").read_text())[1:]
    assert len(results) >= 10
    for result in results:
        title = result.splitlines()[0]
        assert "| date | command | raw |" in result, f"benchmark result {title!r} lacks its date/command/raw row"
        for row in re.findall(r"^\| (\d{4}-\d\d-\d\d) \| (.+?) \| (.+?) \|$", result, re.M):
            for raw in re.findall(r"`benchmarks/results/([^`]+)`", row[2]):
                stem, _, exts = raw.partition("{")
                names = [stem + ext for ext in exts.rstrip("}").split(",")] if exts else [stem]
                for name in names:
                    assert (ROOT / "benchmarks" / "results" / name).is_file(), f"{title}: no {name}"
        assert re.search(r"^\| \d{4}-\d\d-\d\d \|", result, re.M), f"benchmark result {title!r} is not dated"


def test_make_test_builds_the_site_with_warnings_as_errors():
    makefile = ROOT.joinpath("Makefile").read_text()
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    build = re.search(r"^DOCS_BUILD\s*:=\s*(.*)$", makefile, re.M).group(1)
    assert "$(DOCS_BUILD)" in recipe and recipe.index("$(DOCS_BUILD)") < recipe.index("pytest")
    assert "mkdocs build --strict" in build
    assert "--quiet" not in build and " -q" not in build, "--quiet drops the warnings --strict counts"
    assert "/site/" in ROOT.joinpath(".gitignore").read_text().splitlines()


def test_the_site_builds_strictly(tmp_path):
    """The build `make test` runs, here too, so pytest alone catches a broken link or stale API name."""
    import subprocess
    import sys

    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    assert mkdocs, "mkdocs is in the dev extra; reinstall with `make test`"
    done = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    config_page = (tmp_path / "site" / "reference" / "config" / "index.html").read_text()
    cli_page = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "evolution.budget.wall_time_s" in config_page and "generated: config reference" not in config_page
    assert "evotrainer genome run" in cli_page and "generated: cli reference" not in cli_page


def test_the_documents_the_package_cites_exist():
    """A module that points a reader at a page (``docs/...md``, or a top-level ``NAME.md``) points at one
    the repository has."""
    cited = {}
    for path in sorted((ROOT / "evotrainer").rglob("*.py")):
        for name in re.findall(r"(?<![\w/.-])(docs/[\w/.-]+\.md|[A-Z][A-Z_]+\.md)\b", path.read_text()):
            cited.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert "docs/concepts/one-generation.md" in cited
    missing = {name: where for name, where in cited.items() if not (ROOT / name).is_file()}
    assert not missing, f"documents cited but absent: {missing}"


def test_one_generation_lists_the_stages_the_state_machine_has():
    """docs/concepts/one-generation.md numbers the stages of a generation, in its list and its chart, and
    docs/architecture.md names them: the run state's STAGES, in order (sub-steps live inside a stage)."""
    from evotrainer.records.run_state import STAGES

    page = (DOCS / "concepts" / "one-generation.md").read_text().split("\n## ", 1)[0]
    listed = [m.lower() for m in re.findall(r"^\d+\. \*\*(\w+)\*\*", page, re.M)]
    charted = re.findall(r'\["\d+\. (\w+):', page)
    assert listed == list(STAGES) and charted == list(STAGES), (listed, charted)
    architecture = (DOCS / "architecture.md").read_text()
    assert f"`records/run_state.py::STAGES`: {', '.join(STAGES)};" in " ".join(architecture.split())
