"""Served adapters: a branch's current LoRA weights as files, under a name and an id never reused.

A serving engine (vLLM) reads an adapter from a folder and caches it by integer id, and its prefix
cache by name. A branch's weights change with every training step, so an id or a name that outlived
its weights would serve stale ones: peers have shipped rollouts that silently came from old or base
weights that way. Here an adapter is keyed on (branch, digest of its weights and config): the same
content keeps its name and id, changed content gets a fresh name and the next id, and an id is
never handed out twice in a registry's life.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch
from peft.utils import get_peft_model_state_dict


@dataclass(frozen=True)
class ServedAdapter:
    branch: str       # the policy's adapter name (a version id)
    digest: str       # sha256 of the adapter's config and tensors
    lora_id: int      # the serving engine's integer id: one per (branch, digest), never reused
    path: Path        # folder with adapter_config.json + adapter_model.safetensors
    zero: bool        # all lora_B are zero: the adapter equals the base model by construction
    stamp: tuple = ()  # the tensors' identities and in-place version counters when it was exported

    @property
    def name(self) -> str:
        """The name the engine serves it under; it changes whenever the weights do."""
        return f"{self.branch}@{self.digest[:16]}"


def weights_stamp(policy, branch: str) -> tuple:
    """Which tensors hold a branch's LoRA weights and how often each was changed in place (torch's
    version counter: an optimizer step, a load_state_dict copy). Equal stamps mean the weights cannot
    have changed, so the sha256 over every tensor (on the CPU: a device-to-host copy of each) is
    skipped; an episode's every turn and a step's every generate call export the same adapter."""
    return tuple((id(p), p.data_ptr(), p._version) for p in policy.parameters(branch))


def adapter_digest(policy, branch: str) -> str:
    """sha256 of a branch's LoRA config and tensors (names, dtypes, shapes, bytes), as saved."""
    h = hashlib.sha256()
    h.update(json.dumps(policy.model.peft_config[branch].to_dict(), sort_keys=True, default=str).encode())
    state = get_peft_model_state_dict(policy.model, adapter_name=branch)
    for key in sorted(state):
        t = state[key].detach().cpu().contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class AdapterRegistry:
    """Writes branches' adapters under ``root`` and hands out their serving names and ids."""

    def __init__(self, root: str | Path | None = None) -> None:
        self._own = root is None   # a temporary folder of our own is removed by close()
        self.root = Path(tempfile.mkdtemp(prefix="evotrainer-adapters-")) if root is None else Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        # A temporary folder of our own goes with the registry (or the process) even without close().
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.root), True) if self._own else None
        self.current: dict[str, ServedAdapter] = {}
        self._next_id = 1          # vLLM ids are positive integers

    def export(self, policy, branch: str) -> tuple[ServedAdapter, ServedAdapter | None]:
        """The branch's adapter as it is now in ``policy``; and the one it supersedes (None when the
        weights did not change since the last export), which the engine should drop."""
        stamp = weights_stamp(policy, branch)
        prev = self.current.get(branch)
        if prev is not None and prev.stamp == stamp and prev.path.is_dir():
            return prev, None   # not one tensor was replaced or written to since that export
        digest = adapter_digest(policy, branch)
        if prev is not None and prev.digest == digest and prev.path.is_dir():
            self.current[branch] = dataclasses.replace(prev, stamp=stamp)
            return self.current[branch], None
        path = self.root / f"{branch}-{digest[:16]}-{self._next_id}"
        tmp = self.root / f".{path.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        policy.save(branch, tmp)
        tmp.rename(path)      # whole folders only: the engine never reads half an adapter
        served = ServedAdapter(branch=branch, digest=digest, lora_id=self._next_id, path=path,
                               zero=policy.is_zero(branch), stamp=stamp)
        self._next_id += 1
        self.current[branch] = served
        return served, prev

    def forget(self, served: ServedAdapter) -> None:
        """Removes a superseded adapter's files (its id stays used up)."""
        if self.current.get(served.branch) == served:
            del self.current[served.branch]
        shutil.rmtree(served.path, ignore_errors=True)

    def close(self) -> None:
        if self._cleanup is not None:
            self._cleanup()
