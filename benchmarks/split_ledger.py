"""Every variant ever scored on each test split, read from the committed raw results.

A test split is for the final report only: a variant chosen, or a rule changed, after seeing a split's
scores is measured again on a fresh draw. This lists, per split (domain, levels, test size, domain
seed: what decides which tasks it holds), every variant any committed benchmark scored on it and the
files that hold those scores. ``docs/benchmarks/archive.md`` shows the table; a test holds it to this output.

    python benchmarks/split_ledger.py
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def split_of(config: str, sets: list[str]) -> tuple:
    """(domain, levels, n_test, domain seed) of a benchmark's config after its overrides."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from compare_modes import override
    from evotrainer.config import load_config

    cfg = load_config(ROOT / config)
    for item in sets:
        if item.startswith("domain."):
            override(cfg, item)
    d = cfg.domain
    levels = tuple(d.difficulty) if isinstance(d.difficulty, list) else (d.difficulty,)
    return d.name, levels, d.n_test, d.seed


def ledger() -> dict[tuple, dict[str, set[str]]]:
    """split -> variant -> the result files that scored it on that split."""
    out: dict[tuple, dict[str, set[str]]] = {}

    def add(split, variant, file):
        out.setdefault(split, {}).setdefault(variant, set()).add(file)

    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            continue
        args = data.get("args") or {}
        results = data.get("results")
        if isinstance(results, dict) and args.get("config") and not args.get("no_test"):
            split = split_of(args["config"], args.get("set") or [])
            for name, rows in results.items():
                if any("test_scores" in r for r in rows if isinstance(r, dict)):
                    add(split, name.partition("@")[0], path.name)
        elif isinstance(data.get("runs"), list) and data.get("config"):
            split = split_of(data["config"], [f"domain.n_test={data['n_test']}"] if data.get("n_test") else [])
            for r in data["runs"]:
                if "test_scores" in r or "test_accuracy" in r:
                    add(split, r["variant"], path.name)
    for path in sorted((RESULTS / "suite").glob("*.json")):
        data = json.loads(path.read_text())
        split = split_of(data["config"], data.get("overrides") or [f"domain.seed={data['domain_seed']}"])
        for v in data["scored_on_test"]:
            add(split, v["variant"], f"suite/{path.name}")
    return out


def table() -> str:
    lines = ["| split (domain, levels, test tasks, domain seed) | variants scored on it | files |", "|---|---|---|"]
    for split, variants in sorted(ledger().items(), key=lambda kv: str(kv[0])):
        name, levels, n, seed = split
        files = sorted({f for fs in variants.values() for f in fs})
        lines.append(f"| {name}, {'/'.join(map(str, levels))}, {n}, {seed} | {len(variants)}: "
                     f"{', '.join(sorted(variants))} | {len(files)}: {', '.join(files)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
