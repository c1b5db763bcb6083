"""Run inspection commands of the CLI: ``lineage`` and ``skills``.

    evotrainer lineage RUN_DIR [--plot]        the version tree of a run (and its genealogy plots)
    evotrainer skills [--run RUN_DIR] [--user] the skill library of a run and/or of the user

Both only read the run directory (and, for ``--plot``, write RUN_DIR/plots/): they are safe on a live run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.tree import Tree
from evotrainer.loop.knowledge.skills import SkillLibrary, user_library_path

console = Console(highlight=False)


def _label(v, score: float | None, invalid: bool) -> str:
    parts = [f"[bold]{v.id}[/bold]", f"gen {v.generation}",
             f"{v.operator}/{v.factor or '?'}" if v.operator else "seed",
             f"held-out {score:.3f}" if score is not None else "held-out —"]
    if len(v.parents) > 1:
        parts.append("crossover × " + ", ".join(v.parents[1:]))
    if v.hypothesis:
        parts.append(f"hypothesis {v.hypothesis.get('verdict')}")
    if invalid:
        why = "; ".join(str(x.get("name") or x) for x in v.violations) or "invalid"
        parts.append(f"[bold red]✗ INVALID ({why})[/bold red]")
    else:
        parts.append({"promoted": "[green]promoted[/green]", "rejected": "[yellow]rejected[/yellow]",
                      "pruned": "[dim]pruned[/dim]"}.get(v.status, v.status))
    return " · ".join(parts)


def lineage_tree(run_dir: str | Path) -> Tree:
    """Each version under its first parent (the branch it forked from); a crossover names its others."""
    from evotrainer.tracking.plots import load_versions

    versions = load_versions(run_dir)
    root = Tree(f"[bold]{Path(run_dir).resolve().name}[/bold] ({len(versions)} versions, "
                f"{sum(v.is_invalid for v in versions)} invalid)")
    nodes = {}
    for v in versions:                      # parents come first: load_versions sorts by generation
        under = nodes.get(v.parents[0], root) if v.parents else root
        nodes[v.id] = under.add(_label(v, v.heldout_accuracy, v.is_invalid))
    return root


def cmd_lineage(args: argparse.Namespace) -> int:
    if not (Path(args.run_dir) / "versions").is_dir():
        console.print(f"[red]error:[/red] {args.run_dir} has no versions/ directory (not a run directory)")
        return 2
    console.print(lineage_tree(args.run_dir))
    if args.plot:
        from evotrainer.tracking.plots import fitness_plot, genealogy_plot

        png, page = genealogy_plot(args.run_dir)
        console.print(f"genealogy: {png}  {page}\nfitness:   {fitness_plot(args.run_dir)}")
    from evotrainer.tracking.view import local_experiment_id, ui_url

    if eid := local_experiment_id(args.run_dir):    # read-only: the run's store is not opened by MLflow
        console.print(f"in MLflow: mlflow ui --backend-store-uri sqlite:///{Path(args.run_dir).resolve()}/mlflow.db"
                      f"\n  then {ui_url(eid)}", soft_wrap=True)
    return 0


def skills_table(library, title: str) -> Table:
    table = Table(title=f"{title} ({len(library)} skills)", show_lines=True)
    table.add_column("id", no_wrap=True)
    table.add_column("state")
    table.add_column("n", justify="right")
    table.add_column("factor", overflow="fold")
    table.add_column("when → expect", overflow="fold")
    table.add_column("effect", justify="right", no_wrap=True)
    for s in library:
        p = s.prompt_dict()
        effect = s.mean_effect
        state = ("[green]validated[/green]" if s.validated else "candidate") + f"\n{s.scope}: {', '.join(s.domains)}"
        table.add_row(s.id, state, str(s.confirmations), s.factor, f"{p['trigger']}\n→ {p['expected_outcome']}",
                      f"{effect:+.3f}" if effect is not None else "—")
    return table


def cmd_skills(args: argparse.Namespace) -> int:

    sources = []
    if args.run:
        path = Path(args.run) / "skills.json"
        if not Path(args.run).is_dir():
            console.print(f"[red]error:[/red] {args.run} is not a run directory")
            return 2
        sources.append((path, f"run {Path(args.run).resolve().name}"))
    if args.user or not args.run:
        sources.append((user_library_path(), "user library"))
    for path, title in sources:
        try:
            library = SkillLibrary(path)
        except ValueError as e:
            console.print(f"[red]error:[/red] {e}")
            return 2
        console.print(skills_table(library, title))
        console.print(f"[dim]{path}[/dim]")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lineage", help="print the version tree of a run")
    p.add_argument("run_dir", help="run directory (holds versions/)")
    p.add_argument("--plot", action="store_true", help="also write the genealogy PNG/HTML and fitness plot")
    p.set_defaults(func=cmd_lineage)
    p = sub.add_parser("skills", help="list skill libraries (the user's by default)")
    p.add_argument("--run", metavar="RUN_DIR", help="show the skills of this run")
    p.add_argument("--user", action="store_true", help="show the user-level library too ($EVOTRAINER_HOME)")
    p.set_defaults(func=cmd_skills)
