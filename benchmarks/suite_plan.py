"""What a suite draw has left to run, and what it costs: `python benchmarks/suite.py plan [--draw N]`.

For each setting and mode: the seeds with a row, the seeds still missing, and an estimate of the time
left from the wall times the rows record (``wall_s``, one run each; the untrained model's test score,
once a setting, too). An estimate names where it comes from: the same draw's rows of that setting and
mode, else that setting and mode on other draws (``suite_ds<N>`` folders only), else the setting's other
modes; a setting no run has finished is unmeasured, and the total says so rather than counting it as
free. The walls are as recorded here, at whatever load each run had (rows since draw 53 record
``torch_threads``; most ran at one thread beside a second suite process), so the total is for this
machine, in process-hours and in hours at two processes. A fresh draw runs what its script asks, which
the folder does not record: its plan covers the settings it has a file for, every mode, unless
``--settings`` and ``--modes`` say otherwise.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from suite import MODES, RESULTS, SETTINGS


def _data(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _rows(path: Path) -> dict[str, list[dict]]:
    return _data(path).get("runs", {})


def _walls(rows: dict[str, list[dict]], mode: str | None) -> list[float]:
    picked = rows.get(mode, []) if mode else [r for rs in rows.values() for r in rs]
    return [float(r["wall_s"]) for r in picked if isinstance(r.get("wall_s"), (int, float))]


def _other_draws(results: Path, setting: str) -> list[Path]:
    """The setting's file in every other draw's folder (``suite_ds<N>``; not variant folders such as
    ``suite_ds52_prior_null``, whose runs are one draw's again)."""
    return [p / f"{setting}.json" for p in sorted(results.parent.glob("suite_ds*"))
            if p.is_dir() and p != results and re.fullmatch(r"suite_ds\d+", p.name)]


def estimate(results: Path, setting: str, mode: str) -> tuple[float | None, str]:
    """(seconds a run of ``setting`` in ``mode`` takes, where that figure comes from)."""
    here = _walls(_rows(results / f"{setting}.json"), mode)
    if here:
        return statistics.mean(here), f"this draw, {len(here)} run(s)"
    others = _other_draws(results, setting)
    same_mode = [w for p in others for w in _walls(_rows(p), mode)]
    if same_mode:
        return statistics.mean(same_mode), f"other draws, {len(same_mode)} run(s)"
    any_mode = [w for p in [results / f"{setting}.json", *others] for w in _walls(_rows(p), None)]
    if any_mode:
        return statistics.mean(any_mode), f"its other modes, {len(any_mode)} run(s)"
    return None, "unmeasured: no run of this setting has finished"


def _untrained_wall(path: Path) -> float | None:
    w = (_data(path).get("untrained") or {}).get("wall_s")
    return float(w) if isinstance(w, (int, float)) else None


def plan(results: Path, settings: list[str], modes: list[str]) -> dict:
    """Per (setting, mode): seeds done, seeds missing, the estimate per run and for what is left; and
    the totals (recorded and left, the unmeasured runs counted apart; a setting's untrained score, run
    once before its first run, in both)."""
    lines, recorded, left, unmeasured = [], 0.0, 0.0, 0
    for name in settings:
        path = results / f"{name}.json"
        rows = _rows(path)
        if (w := _untrained_wall(path)) is not None:
            recorded += w
        else:   # not scored yet: as long as on other draws (seconds to minutes: HumanEval's took 10)
            left += statistics.mean([x for p in _other_draws(results, name) if (x := _untrained_wall(p)) is not None]
                                    or [0.0])
        for mode in modes:
            planned = SETTINGS[name].seeds
            done = sorted({r["seed"] for r in rows.get(mode, []) if r.get("seed") in planned})
            missing = [s for s in planned if s not in done]
            recorded += sum(_walls(rows, mode))
            per_run, source = estimate(results, name, mode) if missing else (None, "")
            if missing and per_run is None:
                unmeasured += len(missing)
            else:
                left += (per_run or 0.0) * len(missing)
            lines.append({"setting": name, "mode": mode, "done": done, "missing": missing,
                          "per_run_s": per_run, "source": source,
                          "left_s": per_run * len(missing) if per_run is not None else None})
    return {"results": str(results), "lines": lines, "recorded_s": recorded, "left_s": left,
            "unmeasured_runs": unmeasured, "runs_done": sum(len(x["done"]) for x in lines),
            "runs_planned": sum(len(SETTINGS[x["setting"]].seeds) for x in lines)}


def _minutes(s: float | None) -> str:
    return "-" if s is None else f"{s / 60:.0f} min"


def plan_table(p: dict) -> str:
    out = [f"{p['results']}: {p['runs_done']} of {p['runs_planned']} runs done "
           f"({p['recorded_s'] / 3600:.1f} process-hours recorded)",
           f"{'setting':16} {'mode':15} {'done':6} {'missing seeds':14} {'per run':9} {'left':9} estimate from"]
    for x in p["lines"]:
        n = len(SETTINGS[x["setting"]].seeds)
        out.append(f"{x['setting']:16} {x['mode']:15} {len(x['done'])}/{n:<4} "
                   f"{','.join(map(str, x['missing'])) or '-':14} {_minutes(x['per_run_s']):9} "
                   f"{_minutes(x['left_s']):9} {x['source']}")
    total = (f"left: {sum(len(x['missing']) for x in p['lines'])} runs; the measured ones about "
             f"{p['left_s'] / 3600:.1f} process-hours ({p['left_s'] / 7200:.1f} h at two processes)")
    if p["unmeasured_runs"]:
        total += f", plus {p['unmeasured_runs']} run(s) of settings no run has timed yet"
    return "\n".join([*out, total])


def main(draw_results: Path | None, settings: str | None, modes: str | None) -> None:
    """``draw_results``: a fresh draw's folder (None: the suite's own draw, whose plan is every setting)."""
    results = draw_results or RESULTS
    if not results.is_dir():
        raise SystemExit(f"no rows at {results}: no run of that draw has started (`suite.py run --draw N` starts one)")
    if settings:
        names = settings.split(",")
    elif draw_results is not None:   # a fresh draw runs what its script asks: the settings it has a file for
        names = [n for n in SETTINGS if (results / f"{n}.json").exists()]
        print(f"a fresh draw: the settings it has rows for, every mode ({', '.join(names)}); "
              "--settings and --modes narrow it to what its script runs")
    else:
        names = list(SETTINGS)
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        raise SystemExit(f"--settings: unknown {unknown}; the suite's settings are {', '.join(SETTINGS)}")
    chosen = modes.split(",") if modes else list(MODES)
    if bad := [m for m in chosen if m not in MODES]:
        raise SystemExit(f"--modes: unknown {bad}; the suite's modes are {', '.join(MODES)}")
    print(plan_table(plan(results, names, chosen)))
