"""Comparing two records of one version, quantity by quantity: what ``evotrainer rerun`` reports.

``compare_versions(recorded, rerun)`` reads two version directories and says, for every quantity a
rerun reproduces, whether it is the same. Discrete quantities (token ids, tasks, rewards, verdicts,
accuracies) match only when equal; float quantities (losses, log-probs, adapter weights, AdamW state)
match bit for bit on the same machine, threads and library versions, else within ``RTOL``/``ATOL``.
A recorded NaN reproduced as NaN is a match. Timings are never compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from evotrainer.loop.stages.training import OPTIMIZER_FILE
from evotrainer.records.rollout import Rollout
from evotrainer.records.scores import correct
from evotrainer.records.version import VersionDir

RTOL, ATOL = 1e-5, 1e-7                 # float quantities: "within tolerance" of the record


@dataclass
class Comparison:
    """One recorded quantity against the rerun's. ``kind``: ``exact`` (discrete, or arithmetic on
    discrete values: token ids, tasks, rewards, verdicts, accuracies; only equality matches) or
    ``float`` (model arithmetic: losses, log-probs, weights; bit-for-bit on the same machine, threads
    and library versions, else within RTOL/ATOL)."""
    name: str
    kind: str
    recorded: str
    rerun: str
    verdict: str                        # exact | within tolerance | differs
    max_abs_diff: float | None = None

    @property
    def matches(self) -> bool:
        return self.verdict != "differs"


def compare_versions(recorded: VersionDir, rerun: VersionDir) -> list[Comparison]:
    """Every quantity of the record that a rerun reproduces, recorded against rerun (timings excluded)."""
    out: list[Comparison] = []
    old_train, new_train = recorded.rollouts("train"), rerun.rollouts("train")
    out.append(_exact("train tasks per step", _tasks_by_step(old_train), _tasks_by_step(new_train), show=_tasks))
    out.append(_exact("train completions (token ids)", [r.completion_ids for r in old_train],
                      [r.completion_ids for r in new_train], show=_count))
    out.append(_exact("train rewards", [r.reward for r in old_train], [r.reward for r in new_train]))
    out.append(_exact("train advantages", [r.advantage for r in old_train], [r.advantage for r in new_train]))
    out.append(_floats("train sampler log-probs", [x for r in old_train for x in r.logprobs],
                       [x for r in new_train for x in r.logprobs]))
    old_steps, new_steps = recorded.steps(), rerun.steps()
    out.append(_exact("training steps", [s.get("step") for s in old_steps], [s.get("step") for s in new_steps]))
    keys = sorted({k for s in old_steps + new_steps for k in s if k != "step" and not k.endswith("_seconds")})
    for key in keys:
        out.append(_floats(f"step metric {key}", [s.get(key) for s in old_steps], [s.get(key) for s in new_steps]))
    for split in ("heldout", "selection"):
        old, new = recorded.rollouts(split), rerun.rollouts(split)
        out.append(_exact(f"{split} completions (token ids)", [r.completion_ids for r in old],
                          [r.completion_ids for r in new], show=_count))
        out.append(_exact(f"{split} verdicts", [correct(r) for r in old], [correct(r) for r in new], show=_correct))
    old_meta, new_meta = recorded.meta(), rerun.meta()
    for key in ("heldout_accuracy", "selection_accuracy", "train_reward_mean", "cost"):
        out.append(_exact(key, old_meta.metrics.get(key), new_meta.metrics.get(key)))
    out.append(_floats("adapter weights", _tensors(recorded.adapter_dir), _tensors(rerun.adapter_dir)))
    if (recorded.adapter_dir / OPTIMIZER_FILE).is_file() or (rerun.adapter_dir / OPTIMIZER_FILE).is_file():
        out.append(_floats("optimizer state", _optimizer(recorded.adapter_dir), _optimizer(rerun.adapter_dir)))
    return out


def _tasks_by_step(rollouts: list[Rollout]) -> list[list[str]]:
    steps: dict[int, list[str]] = {}
    for r in rollouts:
        if r.task_id not in steps.setdefault(r.step, []):
            steps[r.step].append(r.task_id)
    return [steps[k] for k in sorted(steps)]


def _tasks(steps: list[list[str]]) -> str:
    ids = [t for step in steps for t in step]
    return f"{len(steps)} steps, {len(ids)} tasks" + (f" ({ids[0]}, ...)" if ids else "")


def _count(values: list) -> str:
    return f"{len(values)} rollouts"


def _correct(values: list) -> str:
    return f"{sum(values)}/{len(values)} correct"


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        shown = ", ".join(_short(v) for v in value[:4])
        return f"[{shown}{', ...' if len(value) > 4 else ''}]" + (f" ({len(value)})" if len(value) > 4 else "")
    return str(value)


def _exact(name: str, old: Any, new: Any, show: Callable[[Any], str] = _short) -> Comparison:
    same = _same(old, new)
    return Comparison(name, "exact", show(old), show(new), "exact" if same else "differs",
                      None if same else _max_diff(old, new))


def _floats(name: str, old: Any, new: Any) -> Comparison:
    """A float quantity (a list, a number, or {tensor name: tensor}): exact, within tolerance, or not."""
    shown = _short
    if isinstance(old, dict) or isinstance(new, dict):
        old, new = old or {}, new or {}
        shown = lambda d: f"{len(d)} tensors, {sum(t.numel() for t in d.values())} values"   # noqa: E731
        if set(old) != set(new) or any(old[k].shape != new[k].shape for k in old):
            return Comparison(name, "float", shown(old), shown(new), "differs")
        exact = all(torch.equal(old[k], new[k]) for k in old)
        diff = max((float((old[k].double() - new[k].double()).abs().max()) for k in old if old[k].numel()), default=0.0)
        close = all(torch.allclose(old[k].double(), new[k].double(), rtol=RTOL, atol=ATOL) for k in old)
    else:
        exact = _same(old, new)
        diff = _max_diff(old, new)
        close = exact or _close(old, new)
    verdict = "exact" if exact else "within tolerance" if close else "differs"
    return Comparison(name, "float", shown(old), shown(new), verdict, diff)


def _same(a: Any, b: Any) -> bool:
    """Equality where NaN equals NaN (a recorded NaN reproduced is a match)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _numbers(a: Any, b: Any) -> list[tuple[float, float]] | None:
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return None
        pairs = [_numbers(x, y) for x, y in zip(a, b)]
        return None if any(p is None for p in pairs) else [q for p in pairs for q in p]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return [(float(a), float(b))]
    return [] if a == b else None


def _max_diff(a: Any, b: Any) -> float | None:
    pairs = _numbers(a, b)
    if pairs is None:
        return None
    finite = [abs(x - y) for x, y in pairs if math.isfinite(x) and math.isfinite(y)]
    return max(finite, default=0.0)


def _close(a: Any, b: Any) -> bool:
    pairs = _numbers(a, b)
    return pairs is not None and all((math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=RTOL, abs_tol=ATOL)
                                     for x, y in pairs)


def _tensors(adapter: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    path = adapter / "adapter_model.safetensors"
    return load_file(str(path)) if path.is_file() else {}


def _optimizer(adapter: Path) -> dict[str, torch.Tensor]:
    path = adapter / OPTIMIZER_FILE
    if not path.is_file():
        return {}
    flat: dict[str, torch.Tensor] = {}
    for i, entry in torch.load(path, weights_only=True).items():   # {parameter position: AdamW state}
        for key, value in entry.items():
            flat[f"{i}.{key}"] = torch.as_tensor(value)
    return flat
