"""Merging two branches' LoRA adapters into one, with peft's ``add_weighted_adapter``.

Both adapters are loaded into the run's own ``Policy`` (the base model they were trained on), peft
combines them (``linear``, ``ties``, ``dare_ties``, ``dare_linear``, ``magnitude_prune`` and their
``*_svd`` forms), and the result is written as an ordinary adapter folder in the *first* adapter's
LoRA config: same rank, alpha and target modules as every other branch, so the trainer, the
adapter-applied check and a serving engine (vLLM's ``max_lora_rank``) treat it like any branch.

peft gives the merged adapter ``lora_alpha = r`` (scaling 1) and folds each input's scaling into
its weights; here that scaling is moved back out, ``A`` and ``B`` each by ``sqrt(s_merged / s_a)``,
which leaves the merged update ``s * B @ A`` exactly as peft computed it.

``cat`` is refused: it adds the ranks, so every merge would double the branch's rank.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any, Sequence

import torch
from peft.tuners.lora import LoraLayer
from peft.utils import get_peft_model_state_dict

from evotrainer.records.run_dir import RunDirError

# Task-arithmetic combinations keep the inputs' rank; the *_svd ones are truncated back to it.
COMBINATIONS = ("linear", "ties", "dare_ties", "dare_linear", "magnitude_prune",
                "svd", "ties_svd", "dare_ties_svd", "dare_linear_svd", "magnitude_prune_svd")
DENSITY_COMBINATIONS = tuple(c for c in COMBINATIONS if c not in ("linear", "svd"))   # they prune: need a density
# adapter_config.json fields two adapters must agree on to be merged (rank, where LoRA sits, how it scales).
MUST_MATCH = ("peft_type", "r", "use_rslora", "use_dora", "fan_in_fan_out", "bias", "modules_to_save",
              "layers_to_transform", "rank_pattern", "alpha_pattern")
_NAMES = ("_merge_a", "_merge_b", "_merge_out")   # temporary adapter names inside the policy


class AdapterMergeError(RunDirError):
    """Two adapters that cannot be merged (another base model, rank or target modules), or a merge
    asked for with settings peft refuses; the message names the folders and the field."""


def adapter_config(adapter_dir: str | Path) -> dict[str, Any]:
    path = Path(adapter_dir) / "adapter_config.json"
    if not path.is_file():
        raise AdapterMergeError(f"{adapter_dir} holds no adapter (adapter_config.json missing): only a trained "
                                "branch's adapter folder can be merged")
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise AdapterMergeError(f"{path}: cannot read the adapter's config ({e}); the file is damaged") from None


def check_compatible(dir_a: str | Path, dir_b: str | Path) -> dict[str, Any]:
    """The first adapter's config when both can be merged; otherwise an error naming what differs."""
    a, b = adapter_config(dir_a), adapter_config(dir_b)
    problems = []
    if a.get("base_model_name_or_path") != b.get("base_model_name_or_path"):
        problems.append(f"base model {a.get('base_model_name_or_path')!r} vs {b.get('base_model_name_or_path')!r}")
    if _modules(a) != _modules(b):
        problems.append(f"target modules {sorted(_modules(a))} vs {sorted(_modules(b))}")
    problems += [f"{k} {a.get(k)!r} vs {b.get(k)!r}" for k in MUST_MATCH if a.get(k) != b.get(k)]
    if a.get("peft_type", "LORA") != "LORA":
        problems.append(f"peft type {a.get('peft_type')!r} (only LoRA adapters merge)")
    if problems:
        raise AdapterMergeError(f"the adapters in {dir_a} and {dir_b} cannot be merged: {'; '.join(problems)}. "
                                "Merge only branches of one run, trained with the same lora settings on the "
                                "same base model")
    return a


def check_settings(combination: str, weights: Sequence[float], density: float | None) -> None:
    if combination not in COMBINATIONS:
        raise AdapterMergeError(f"unknown merge combination {combination!r}; use one of {', '.join(COMBINATIONS)} "
                                "('cat' is refused: it doubles the rank at every merge)")
    if len(weights) != 2 or not all(math.isfinite(float(w)) for w in weights):
        raise AdapterMergeError(f"merge weights must be two finite numbers, got {list(weights)}")
    if combination in DENSITY_COMBINATIONS and not (density is not None and 0 < density <= 1):
        raise AdapterMergeError(f"the {combination} merge prunes: it needs a density in (0, 1], got {density}")


def merge_adapters(policy, dir_a: str | Path, dir_b: str | Path, out_dir: str | Path, *, combination: str = "ties",
                   weights: Sequence[float] = (0.5, 0.5), density: float | None = 0.5, seed: int = 0) -> Path:
    """Writes the ``combination`` of the adapters in ``dir_a`` and ``dir_b`` to ``out_dir`` (a new or
    replaced folder: written beside it, then renamed in), in ``dir_a``'s LoRA config.

    ``policy`` is a ``policy.lora.Policy`` on the base model both adapters were trained on; its own
    branches are untouched (the two inputs and the result live in it only during the call). DARE's
    random pruning draws from ``seed``, so a resumed run merges to the same weights."""
    check_settings(combination, weights, density)
    config = check_compatible(dir_a, dir_b)
    taken = [n for n in _NAMES if n in policy.branches]
    if taken:
        raise AdapterMergeError(f"the policy already holds adapter(s) {taken}: a merge is already under way")
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    name_a, name_b, merged = _NAMES
    active = policy.model.active_adapter if policy.model is not None else None
    try:
        policy.load(name_a, dir_a)
        policy.load(name_b, dir_b)
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                policy.model.add_weighted_adapter([name_a, name_b], [float(w) for w in weights], merged,
                                                  combination_type=combination, density=density,
                                                  svd_rank=int(config["r"]))
        except ValueError as e:   # peft's own refusal (ranks, module types): the folders' problem
            raise AdapterMergeError(f"peft refuses to merge {dir_a} and {dir_b} ({combination}): {e}") from None
        _rescale_to(policy.model, merged, name_a)
        state = {k: v.detach().cpu().contiguous().clone()
                 for k, v in get_peft_model_state_dict(policy.model, adapter_name=merged).items()}
        tmp.mkdir(parents=True)
        shutil.copyfile(Path(dir_a) / "adapter_config.json", tmp / "adapter_config.json")   # dir_a's LoRA config
        from safetensors.torch import save_file
        save_file(state, str(tmp / "adapter_model.safetensors"))
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)   # whole folders only: a crash leaves the old folder or the new one
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        _drop(policy, (merged, name_b, name_a), active)
    return out_dir


def lora_tensors(adapter_dir: str | Path) -> dict[str, torch.Tensor]:
    """An adapter folder's tensors by their saved names (``...q_proj.lora_A.weight``)."""
    from safetensors.torch import load_file

    return load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))


def _modules(config: dict[str, Any]) -> set[str] | str:
    t = config.get("target_modules")
    return set(t) if isinstance(t, (list, tuple, set)) else t


@torch.no_grad()
def _rescale_to(model, merged: str, like: str) -> None:
    """Moves each layer's merged scaling out of ``like``'s: ``A, B *= sqrt(s_merged / s_like)``."""
    for module in model.modules():
        if isinstance(module, LoraLayer) and merged in module.lora_A and like in module.lora_A:
            factor = math.sqrt(module.scaling[merged] / module.scaling[like])
            module.lora_A[merged].weight.mul_(factor)
            module.lora_B[merged].weight.mul_(factor)


def _drop(policy, names: Sequence[str], active: str | None) -> None:
    """Removes the merge's temporary adapters and re-selects the adapter that was active before."""
    model = policy.model
    if model is None:
        return
    keep = [n for n in model.peft_config if n not in names]
    if keep:   # peft moves the active adapter off a deleted one only when another remains
        model.set_adapter(active if active in keep else keep[0])
    for name in names:
        if name in policy.branches:
            policy.remove(name)
        elif name in model.peft_config:
            model.delete_adapter(name)
