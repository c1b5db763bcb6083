"""Everything a config names is checked before any compute: ``validate_resources(cfg)``.

``train`` and ``run`` call it first, so a typo in an operator name, a missing harness or data file,
a level without enough problems, a model folder that does not exist, a device the machine lacks or
a LoRA target the model does not have is one ``ConfigError`` naming the field, not a traceback an
hour in (an unknown operator would otherwise surface only after generation 0 had trained).

It also holds the rule for ``sandbox: false``: hooks then run in the engine's own process with the
user's rights, so that is allowed only for a harness the user wrote and named (after the same
contract check), and never in a loop whose operators write code.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from typing import Callable

from evotrainer.config import MODE_OPERATORS, Config, ConfigError
from evotrainer.domains import Task, build_domain
from evotrainer.domains.sampling import heldout_draws
from evotrainer.fitness.gate_config import GateConfig
from evotrainer.genome.contract import check_contract
from evotrainer.genome.errors import GenomeError
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.seed import seed_program
from evotrainer.operators.registry import available_operators

CODE_WRITING = ("llm_",)   # operator name prefixes whose children are code written by an LLM


class InProcessHarnessWarning(UserWarning):
    """Harness hooks run without the sandbox (``sandbox: false``)."""


def validate_resources(cfg: Config, loop: bool, say: Callable[[str], None] | None = None) -> None:
    """Raises ConfigError for the first thing ``cfg`` names that cannot be used; ``loop`` adds the
    loop's own settings (operators). Loads no model weights and trains nothing. Warnings go to
    ``say`` (else Python's warnings)."""
    config_problems(cfg, loop, say, first_only=True)


def config_problems(cfg: Config, loop: bool, say: Callable[[str], None] | None = None,
                    first_only: bool = False) -> list[str]:
    """Every check's refusal, one message each (``evotrainer check``); with ``first_only`` the first
    is raised as the ConfigError it is. A check that needs what an earlier one refused is skipped."""
    found: list[str] = []
    refused = object()

    def run(check, *args):
        try:
            return check(*args)
        except ConfigError as e:
            if first_only:
                raise
            found.append(str(e))
            return refused

    if run(_harness, cfg, loop, say) is not refused:   # the overrides are written into that harness
        run(_knob_overrides, cfg)
    heldout = run(_domain, cfg)
    heldout = None if heldout is refused else heldout
    if cfg.domain.files and "test" not in cfg.domain.files:
        msg = ("warning: domain.files names no test file, so the test split is empty and the final pick gets "
               "no test score; add files.test (tasks no branch trains or is gated on)")
        say(msg) if say else warnings.warn(msg, UserWarning, stacklevel=3)
    if loop:
        run(_operators, cfg)
        run(_entry_prior, cfg)
        if heldout is not None:
            run(_heldout_draws, cfg, heldout, say)
    run(_device, cfg, say)
    run(_model_and_lora, cfg)
    run(_engine, cfg, say)
    run(_executor, cfg)
    return found


def ray_installed() -> bool:
    return importlib.util.find_spec("ray") is not None


def _executor(cfg: Config) -> None:
    """``executor: ray`` needs ray installed (checked before any compute, not at the first version), and
    workers that train on a GPU must reserve one: Ray hides the GPUs a worker did not reserve."""
    if cfg.executor != "ray":
        return
    if not ray_installed():
        raise ConfigError("field 'executor': executor: ray needs the ray package, which is not installed; "
                          "install the ray extra (pip install -c constraints.txt -e '.[ray]'), or set executor: local")
    share = cfg.ray.num_gpus_per_branch
    if cfg.device.startswith("cuda") and share == 0:
        raise ConfigError("field 'ray.num_gpus_per_branch': 0 with device: cuda, so every Ray worker would see no "
                          "GPU; set it to 1 (a GPU per worker) or a fraction such as 0.5 (two workers share one)")
    if cfg.device.startswith("cuda") and 0 < share < 1 and cfg.engine == "vllm":
        workers = int(1 / share)   # workers Ray places on one GPU
        taken = workers * cfg.vllm.gpu_memory_utilization
        if taken > 0.8:
            raise ConfigError(
                f"field 'vllm.gpu_memory_utilization': {workers} workers share a GPU (ray.num_gpus_per_branch "
                f"{share}), each with its own vLLM engine taking {cfg.vllm.gpu_memory_utilization:.0%} of it: "
                f"{taken:.0%} before any training memory; lower vllm.gpu_memory_utilization or raise "
                "ray.num_gpus_per_branch")


def _engine(cfg: Config, say: Callable[[str], None] | None) -> None:
    """``engine: vllm`` needs vllm installed; the engine chosen, and why, goes to the log."""
    # The training stack, only to look for vllm and say which engine runs (vllm itself is not imported)
    from evotrainer.policy.engine_choice import resolve_engine
    from evotrainer.policy.vllm_engine import VllmNotInstalledError

    try:
        engine, why = resolve_engine(cfg)
    except VllmNotInstalledError as e:
        raise ConfigError(f"field 'engine': {e}") from None
    if say:
        say(f"rollout engine: {engine} ({why})")
    _guided_calls(cfg, engine)


def _guided_calls(cfg: Config, engine: str) -> None:
    """``guided_call_share`` and ``guided_plan_share`` decode tool calls under the domain's call
    grammar: episodes only, and on the transformers engine (vLLM reports the masked distribution's
    logprobs)."""
    try:
        knobs = seed_program(cfg).knobs
    except (ConfigError, GenomeError, OSError, UnicodeDecodeError):
        return   # the harness check (_harness) says what is wrong with it
    shares = {}
    for name in ("guided_call_share", "guided_plan_share"):
        given = getattr(cfg.grpo, name)
        share = shares[name] = given if given is not None else (knobs.get(name) or {}).get("value") or 0.0
        if not share:
            continue
        if cfg.domain.name != "swe":
            raise ConfigError(f"field 'grpo.{name}': {share} guides tool calls, which only the swe domain's "
                              f"episodes make; set it to 0 for domain {cfg.domain.name!r}")
        if engine == "vllm":
            raise ConfigError(f"field 'grpo.{name}': {share} needs engine: transformers (vLLM's structured "
                              "outputs report the masked distribution's logprobs); set engine: transformers or the share to 0")
    if cfg.grpo.guided_edit in ("token", "quoted") and not any(shares.values()):   # else it changes nothing, silently
        raise ConfigError(f"field 'grpo.guided_edit': {cfg.grpo.guided_edit} shapes guided edits, and no episode is guided "
                          "(guided_call_share and guided_plan_share are 0); raise one of them or remove guided_edit")
    # Set here, it asks for imitation, which nothing guided would silently drop. The SWE harness's own
    # knob is on by default and inert until a child guides some episodes.
    imitation = cfg.grpo.guided_imitation
    if imitation and not any(shares.values()):
        raise ConfigError(f"field 'grpo.guided_imitation': {imitation} imitates guided calls, and no episode is guided "
                          "(guided_call_share and guided_plan_share are 0); raise one of them or set it to 0")


def _harness(cfg: Config, loop: bool, say: Callable[[str], None] | None) -> None:
    if cfg.harness:
        path = Path(cfg.harness)
        if not path.is_file():
            what = "is a directory" if path.is_dir() else "does not exist"
            where = f" (a relative path is read from the working directory, {Path.cwd()})" if not path.is_absolute() else ""
            raise ConfigError(f"field 'harness': {path} {what}{where}; give the path of a harness file "
                              "or remove the field for the reference harness")
        try:
            check_contract(HarnessProgram.from_file(path))
        except (GenomeError, OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"field 'harness': {path}: {e}") from None
    if cfg.sandbox:
        return
    if loop:
        writers = sorted(n for n, w in _weights(cfg).items() if w > 0 and n.startswith(CODE_WRITING))
        if writers:
            raise ConfigError(f"field 'sandbox': false is refused while code-writing operators are configured "
                              f"({', '.join(writers)}): their harnesses are untrusted and run only in the "
                              "sandbox; set sandbox: true or drop those operators")
    if cfg.harness:
        msg = (f"warning: sandbox: false: the hooks of {cfg.harness} run in this process with your rights, "
               "unsandboxed; use it only for a harness you wrote")
        say(msg) if say else warnings.warn(msg, InProcessHarnessWarning, stacklevel=5)


def _knob_overrides(cfg: Config) -> None:
    seed_program(cfg)   # a grpo override outside the harness's knob space is a ConfigError naming it


def _weights(cfg: Config) -> dict[str, float]:
    ev = cfg.evolution
    if ev.mode in MODE_OPERATORS:
        return MODE_OPERATORS[ev.mode]
    return {} if ev.mode == "reference" else dict(ev.operators)


def _operators(cfg: Config) -> None:
    weights = _weights(cfg)
    known = available_operators()
    unknown = [n for n in weights if n not in known]
    if unknown:
        raise ConfigError(f"field 'evolution.operators': unknown operator(s) {', '.join(map(repr, unknown))}; "
                          f"known operators: {', '.join(known)}")
    negative = [n for n, w in weights.items() if w < 0]
    if negative:
        raise ConfigError(f"field 'evolution.operators': negative weight for {', '.join(map(repr, negative))}; "
                          "weights are >= 0 (0 switches an operator off)")
    if weights and cfg.evolution.children_per_generation and not any(w > 0 for w in weights.values()):
        raise ConfigError("field 'evolution.operators': every weight is 0; give at least one operator a weight > 0")
    _local_llm(cfg, weights)


def _entry_prior(cfg: Config) -> None:
    """The entry prior the library and llm_choice read, loaded now rather than at the first proposal."""
    from evotrainer.operators.entry_prior import PriorError, load_prior

    prior = cfg.evolution.entry_prior
    if prior is not None:
        try:
            load_prior(None if prior == "shipped" else prior)
        except PriorError as e:
            raise ConfigError(f"field 'evolution.entry_prior': {e}") from None


def _local_llm(cfg: Config, weights: dict[str, float]) -> None:
    """An LLM operator without a server runs ``evolution.llm.model`` locally: it must be a model this
    machine has: checked here, before any training, because found only at the first proposal it would
    reject every proposal of the run with ModelNotFoundError."""
    from evotrainer.policy.base_model import EMBEDDED, TINY  # the training stack: validation loads it below anyway

    llm = cfg.evolution.llm
    if llm.base_url or not any(w > 0 and n.startswith("llm_") for n, w in weights.items()):
        return
    if llm.model not in (EMBEDDED, TINY) and not (Path(llm.model).expanduser() / "config.json").is_file():
        raise ConfigError(f"field 'evolution.llm.model': {llm.model!r} is not a local model ({EMBEDDED}, {TINY} or a "
                          "Hugging Face model folder with config.json), and evolution.llm.base_url is not set; name a "
                          "local model, or set base_url to an OpenAI-compatible server that serves it")


def _domain(cfg: Config) -> list[Task]:
    """The held-out tasks, once every split of the domain loads."""
    try:
        domain = build_domain(cfg.domain)
        for split in ("train", "heldout", "test"):
            domain.tasks(split)
        return domain.tasks("heldout")
    except (ValueError, OSError) as e:
        raise ConfigError(f"field 'domain': {e} (see domain.difficulty, domain.n_train/n_heldout/n_test "
                          "and domain.files)") from None


def _heldout_draws(cfg: Config, heldout: list[Task], say: Callable[[str], None] | None) -> None:
    """The held-out pool splits into a gate draw and a selection draw, each non-empty; a gate draw
    smaller than the paired test's minimum refuses every child, which is said before any compute."""
    full, heldout = heldout, heldout[: cfg.train.eval_size]
    try:
        gate, selection = heldout_draws(heldout, cfg.evolution.selection_share, cfg.seed)
    except ValueError as e:
        raise ConfigError(f"field 'domain.n_heldout': {e}") from None
    _race_pool(cfg, len(gate), len(full) - len(heldout))
    need = GateConfig().min_tasks
    if len(gate) < need:
        msg = (f"warning: the gate draw holds {len(gate)} of the {len(heldout)} held-out tasks (the selection "
               f"draw the other {len(selection)}, evolution.selection_share {cfg.evolution.selection_share}); "
               f"the paired gate needs {need}, so no child can be promoted: raise domain.n_heldout")
        say(msg) if say else warnings.warn(msg, UserWarning, stacklevel=5)


def _race_pool(cfg: Config, gate: int, pool: int) -> None:
    """A racing gate draws its further rounds from the held-out tasks beyond train.eval_size: there must
    be enough of them to reach its cap, and it races on the local executor (the driver verifies)."""
    cap = cfg.evolution.race_cap
    if cap is None:
        return
    if cap <= gate:
        raise ConfigError(f"field 'evolution.race_cap': {cap} leaves no second look after the gate draw's {gate} tasks; raise it "
                          f"(e.g. {4 * gate}: looks at {gate}, {2 * gate} and {4 * gate} tasks) or set it to null")
    if cfg.train.eval_size is None or pool < cap - gate:
        raise ConfigError(
            f"field 'evolution.race_cap': racing to {cap} tasks needs {cap - gate} held-out tasks beyond "
            f"train.eval_size (the gate draw holds {gate}), and the pool holds {pool}; set train.eval_size and "
            f"raise domain.n_heldout to at least {(cfg.train.eval_size or 0) + cap - gate}, or lower race_cap")
    if cfg.executor != "local":
        raise ConfigError("field 'evolution.race_cap': the racing gate verifies further rounds in the driver, "
                          "which only the local executor has loaded; set executor: local or race_cap: null")


def _device(cfg: Config, say: Callable[[str], None] | None = None) -> None:
    import torch  # heavy: only commands that train pay for it, and they need it anyway

    try:
        device = torch.device(cfg.device)
    except (RuntimeError, ValueError) as e:
        raise ConfigError(f"field 'device': {cfg.device!r} is not a torch device ({e}); use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and cfg.executor == "ray":
        return   # the workers train, on the cluster's GPUs (ray.num_gpus_per_branch), not this driver
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (device.index or 0) >= count:
            raise ConfigError(f"field 'device': {cfg.device!r} is not available here ({count} CUDA device(s)); "
                              "use cpu or an index below the device count")
        if count > 1:   # the local executor trains and samples on one device: the others would sit idle
            msg = (f"warning: {count} CUDA devices are visible and executor: local uses one of them ({cfg.device}); "
                   "to use them all set executor: ray with ray.num_gpus_per_branch: 1 (one version per GPU; the "
                   "population then no longer shares vLLM batches), or make one visible with CUDA_VISIBLE_DEVICES")
            say(msg) if say else warnings.warn(msg, UserWarning, stacklevel=4)
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"field 'device': {cfg.device!r} is not available on this machine; use cpu")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"field 'device': {cfg.device!r} is not supported; use cpu, cuda, cuda:N or mps")


def _model_and_lora(cfg: Config) -> None:
    """The model folder exists, and every LoRA target names a module of its architecture (checked on
    an empty model on the meta device: no weights are read)."""
    # The training stack, only to check a model folder or LoRA targets on an empty (meta) model
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from evotrainer.policy.base_model import EMBEDDED, TINY, ModelNotFoundError, embedded_model_dir, tiny_config

    try:
        if cfg.model == TINY:
            arch = tiny_config(49152)
        else:
            folder = embedded_model_dir() if cfg.model == EMBEDDED else Path(cfg.model).expanduser()
            if not (folder / "config.json").is_file():
                raise ConfigError(f"field 'model': {cfg.model!r} is not a known name ({EMBEDDED}, {TINY}) nor a "
                                  "local Hugging Face model folder with config.json; give a folder path")
            arch = AutoConfig.from_pretrained(folder)
    except (ModelNotFoundError, OSError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"field 'model': {cfg.model!r}: {e}") from None
    with torch.device("meta"):
        names = [n for n, _ in AutoModelForCausalLM.from_config(arch).named_modules() if n]
    if not cfg.lora.target_modules:
        raise ConfigError("field 'lora.target_modules': empty; name at least one module (e.g. q_proj) or 'all-linear'")
    missing = [t for t in cfg.lora.target_modules
               if t != "all-linear" and not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        leaves = sorted({n.rsplit(".", 1)[-1] for n in names if not n.rsplit(".", 1)[-1].isdigit()})
        raise ConfigError(f"field 'lora.target_modules': {', '.join(map(repr, missing))} not in the model "
                          f"{cfg.model!r}; its modules: {', '.join(leaves)}")
