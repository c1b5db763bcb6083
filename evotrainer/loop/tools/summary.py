"""What a person reads at the end of a run (or from ``evotrainer status``): the leaderboard, the
invalid branches and why, the budgets spent and where the wall time went."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from evotrainer.loop.budgets import TIME_LABELS
from evotrainer.tracking.view import local_experiment_id, ui_url
from evotrainer.records.history import Outcome, proposals
from evotrainer.records.version import Status

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment


def leaderboard(title: str, metas: list) -> Table:
    """Every version of a run, best gate-draw score first. Fits an 80-column terminal: short headers,
    one space and no border between columns (which leaves the factor room for the knob names of real
    runs, such as knob:num_generations), and only the factor (the one long cell) folds; a word never splits."""
    table = Table(title=title, box=None, padding=(0, 1, 0, 0), pad_edge=False, header_style="bold underline")
    # id = the version; gate = the gate draw (what promotions compared), sel = the selection draw (what
    # ranked); train = the mean training reward
    for col in ("id", "gen", "operator", "factor", "gate", "sel", "train", "hypothesis", "status"):
        table.add_column(col, overflow="fold", min_width=12) if col == "factor" else table.add_column(col, no_wrap=True)
    for m in sorted(metas, key=lambda m: -(m.metrics.get("heldout_accuracy") or -1)):
        style = "red" if m.status == Status.INVALID else "green" if m.status == Status.PROMOTED else None
        table.add_row(m.id, str(m.generation), m.operator or "-", m.factor or "-",
                      _fmt(m.metrics.get("heldout_accuracy")), _fmt(m.metrics.get("selection_accuracy")),
                      f"{m.metrics.get('train_reward_mean', float('nan')):.3f}",
                      (m.hypothesis or {}).get("verdict", "-"), m.status, style=style)
    return table


def _fmt(x: float | None) -> str:
    return f"{x:.3f}" if x is not None else "-"


def final_line(final: dict | None) -> str | None:
    """The final pick and its test-split score, beside the untrained model's, as the summary prints it."""
    if not final:
        return None
    if final.get("test_accuracy") is None:
        return f"final pick {final['version']}: no test score ({final.get('error', 'not measured')})"
    start = final.get("start_test_accuracy")
    if final["version"] == "start":
        return (f"final pick: the untrained model, test accuracy {final['test_accuracy']:.3f} on {final['test_tasks']} "
                "test task(s): training made the policy worse (no trained version reached the untrained model "
                f"on {final.get('bar', 'the selection draw')})")
    line = (f"final pick {final['version']}: test accuracy {final['test_accuracy']:.3f} on {final['test_tasks']} "
            f"test task(s), never seen by the loop (selection draw {_fmt(final.get('selection_accuracy'))}, "
            f"gate draw {_fmt(final.get('gate_heldout_accuracy'))})")
    if start is not None:
        delta = final["test_accuracy"] - start
        line += f"; the untrained model scores {start:.3f} ({delta:+.3f})"
        if delta < 0:
            line += ": training made the policy worse on the test split"
    return line


def print_summary(exp: Experiment, console: Console | None = None) -> None:
    console = console or Console()
    console.print(leaderboard(f"leaderboard — {exp.run_dir}", [exp.vdir(v).meta() for v in exp.versions()]))
    if (line := final_line(exp.state.final)) is not None:
        console.print(line)
    invalid = [exp.vdir(v).meta() for v in exp.versions() if exp.vdir(v).meta().status == Status.INVALID]
    if invalid:
        console.print("[red]invalid branches[/red]")
        for m in invalid:
            for r in (m.decision or {}).get("reasons", [])[:4]:
                console.print(f"  {m.id}: {r}")
    s = exp.state
    judged = [h.hypothesis_verdict for h in proposals(s.history) if h.hypothesis_verdict]
    if judged:
        console.print("hypotheses judged after training: " + ", ".join(
            f"{judged.count(v)} {v}" for v in ("confirmed", "refuted", "untestable") if judged.count(v)))
    rejected = sum(1 for h in proposals(s.history) if h.outcome == Outcome.OPERATOR_REJECTED)
    children = sum(1 for v in exp.versions() if exp.vdir(v).meta().operator is not None)
    if rejected and not children:
        console.print(f"[yellow]no child was made: all {rejected} proposal(s) were rejected by their operators; "
                      f"their reasons are in the event log (evotrainer status {exp.run_dir} --events 50)[/yellow]")
    elif rejected:
        console.print(f"proposals: {children} child(ren) made, {rejected} rejected by their operators")
    used = s.budget_used
    console.print(f"status: {s.status}" + (f" ({s.stop_reason})" if s.stop_reason else "")
                  + f"; train steps {used.get('train_steps', 0):.0f}, rollout tokens "
                  f"{used.get('rollout_tokens', 0):.0f}, LLM calls {used.get('llm_calls', 0):.0f}, "
                  f"wall {used.get('wall_time_s', 0):.0f} s")
    wall = used.get("wall_time_s", 0)
    parts = sorted(((TIME_LABELS.get(k[: -len("_seconds")], k[: -len("_seconds")]), v)
                    for k, v in used.items() if k.endswith("_seconds")), key=lambda kv: -kv[1])
    if wall and parts:
        console.print("where the time went: "
                      + ", ".join(f"{name} {v / wall:.1%}" for name, v in parts if v / wall >= 0.001))
    # The bare UI opens MLflow 3's GenAI overview; the URL opens the genealogy table (docs/mlflow.md).
    eid = local_experiment_id(exp.run_dir)
    console.print(f"open the lineage in MLflow: mlflow ui --backend-store-uri sqlite:///{exp.run_dir}/mlflow.db"
                  + (f"\n  then {ui_url(eid)}" if eid else ""), soft_wrap=True)
