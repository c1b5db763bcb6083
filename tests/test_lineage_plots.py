"""Genealogy/fitness plots and the `lineage` tree: drawn from version dirs, invalid branches marked."""

from __future__ import annotations

import argparse
import re

from rich.console import Console
from tests.loop_runs import build_run

from evotrainer.cli import run_views as run_commands
from evotrainer.tracking.plots import fitness_plot, genealogy_plot, layout, load_versions

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_genealogy_png_and_html(tmp_path):
    build_run(tmp_path)
    png, page = genealogy_plot(tmp_path)
    assert png.read_bytes().startswith(PNG_MAGIC) and png.stat().st_size > 5000
    text = page.read_text()
    # self-contained: inline SVG; no scripts, stylesheets or images, nothing fetched (http only in xmlns)
    assert "<svg" in text and not re.search(r"<script|<link|<img|(src|href)=\"https?:", text)
    row = re.search(r'<tr class="invalid"><td>v003</td>.*?</tr>', text)
    assert row and "INVALID" in row.group(0) and "answers copied from leaked prompts" in row.group(0)
    assert text.count('class="invalid"') == 1                  # only the invalid version is marked
    assert '<tr class="promoted"><td>v002</td>' in text
    assert "best valid v004 (0.350)" in text                   # the invalid 0.9 is not "best"
    assert "INVALID" in text.split("<table")[0] and "v003" in text.split("<table")[0]  # node label in the SVG


def test_layout_keeps_branches_on_lanes(tmp_path):
    build_run(tmp_path)
    pos = layout(load_versions(tmp_path))
    assert pos["v002"] == (1, pos["v000"][1]) and pos["v004"][1] == pos["v002"][1]
    assert len({pos[v] for v in pos}) == len(pos)               # no two nodes on one spot


def test_fitness_plot_and_empty_run(tmp_path):
    build_run(tmp_path / "run")
    assert fitness_plot(tmp_path / "run").read_bytes().startswith(PNG_MAGIC)
    (tmp_path / "empty" / "versions").mkdir(parents=True)
    png, page = genealogy_plot(tmp_path / "empty")
    assert png.stat().st_size > 0 and "0 versions" in page.read_text()
    assert fitness_plot(tmp_path / "empty").stat().st_size > 0


def _run_cli(monkeypatch, argv):
    parser = argparse.ArgumentParser()
    run_commands.register(parser.add_subparsers(dest="command"))
    monkeypatch.setattr(run_commands, "console", Console(width=160, record=True, highlight=False))
    args = parser.parse_args(argv)
    return args.func(args), run_commands.console.export_text()


def test_lineage_command_prints_tree(tmp_path, monkeypatch):
    build_run(tmp_path)
    rc, out = _run_cli(monkeypatch, ["lineage", str(tmp_path), "--plot"])
    assert rc == 0
    lines = out.splitlines()
    v003 = next(line for line in lines if "v003" in line)
    assert "INVALID (leak_used)" in v003 and "0.900" in v003 and "llm_diff/hook:reward" in v003
    v004 = next(line for line in lines if "v004" in line)
    assert "crossover × v001" in v004 and "gen 2" in v004
    # v004 sits under v002 (its first parent): deeper indentation than v002
    assert v004.index("v004") > next(line for line in lines if "v002" in line).index("v002")
    assert (tmp_path / "plots" / "genealogy.html").is_file()
    assert _run_cli(monkeypatch, ["lineage", str(tmp_path / "missing")])[0] == 2
