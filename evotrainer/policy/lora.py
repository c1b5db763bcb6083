"""LoRA branches: one base model, many named peft adapters (one per branch version).

Every branch is its own adapter inside one ``PeftModel``. A child is forked from its parent by
copying the parent's adapter tensors (never sharing them), so training the child cannot move the
parent. ``check_adapter_applied`` guards against a bug peers have shipped: rollouts that silently
came from the base model because the adapter was not active.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch
from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict
from peft.utils import get_peft_model_state_dict

from evotrainer.policy.packed_linear import pack_frozen_linears

PROBE_MESSAGES = [{"role": "user", "content": "What is 12 + 7? Answer: 19. What is 3 + 4?"}]


@dataclass
class LoraSettings:
    r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])

    def peft_config(self) -> LoraConfig:
        return LoraConfig(r=self.r, lora_alpha=self.lora_alpha, lora_dropout=self.lora_dropout,
                          target_modules=list(self.target_modules), task_type="CAUSAL_LM")


class AdapterNotAppliedError(RuntimeError):
    pass


class Policy:
    """A base model with named LoRA adapters; ``adapter(name)`` selects one for a block of work."""

    def __init__(self, model, tokenizer, lora: LoraSettings | None = None, packed: bool = True,
                 gradient_checkpointing: bool = False, seed: int = 0) -> None:
        self.tokenizer = tokenizer
        self.seed = seed   # a fresh adapter's random A matrices come from it alone (create)
        if gradient_checkpointing:   # non-reentrant: the frozen embeddings' outputs need no grad for it
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.lora = lora or LoraSettings()
        self.base_model = model
        if packed:   # the base weights never train: on a CPU, run them packed (policy/packed_linear.py)
            pack_frozen_linears(model)
        self.model: PeftModel | None = None
        self.branches: list[str] = []
        self._base_probe: torch.Tensor | None = None

    # ---- creating, saving, loading, forking -------------------------------------------------
    def create(self, name: str) -> None:
        """A fresh adapter (B = 0, so it starts equal to the base model). Its random A matrices are drawn
        from the policy's seed alone, not from whatever the process drew before: two runs with one seed
        start from the same weights (a mode that first loads an LLM operator consumed other draws, and
        the same recipe then ended 0.09 apart on 128 test tasks: benchmarks/results/compare_modes_code)."""
        self._require_new(name)
        device = next(self.base_model.parameters()).device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(self.seed)
            if self.model is None:
                self.model = get_peft_model(self.base_model, self.lora.peft_config(), adapter_name=name)
            else:
                self.model.add_adapter(name, self.lora.peft_config())
        self.branches.append(name)

    def load(self, name: str, adapter_dir: str | Path) -> None:
        """Loads a saved adapter under ``name``."""
        self._require_new(name)
        adapter_dir = Path(adapter_dir)
        if not (adapter_dir / "adapter_config.json").is_file():
            raise FileNotFoundError(f"{adapter_dir} holds no adapter (adapter_config.json missing)")
        if self.model is None:
            self.model = PeftModel.from_pretrained(self.base_model, adapter_dir, adapter_name=name, is_trainable=True)
        else:
            self.model.load_adapter(adapter_dir, adapter_name=name, is_trainable=True)
        self.branches.append(name)

    def save(self, name: str, adapter_dir: str | Path) -> Path:
        self._require(name)
        adapter_dir = Path(adapter_dir)
        adapter_dir.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(self.model, adapter_name=name).items()}
        # save_pretrained writes the selected adapter; write config + weights of `name` explicitly.
        self.model.peft_config[name].save_pretrained(adapter_dir)
        from safetensors.torch import save_file
        save_file(state, str(adapter_dir / "adapter_model.safetensors"))
        return adapter_dir

    def fork(self, parent: str, child: str) -> None:
        """A child adapter holding a copy of the parent's weights (copy-on-write semantics)."""
        self._require(parent)
        self.create(child)
        state = get_peft_model_state_dict(self.model, adapter_name=parent)
        set_peft_model_state_dict(self.model, {k: v.detach().clone() for k, v in state.items()}, adapter_name=child)

    def remove(self, name: str) -> None:
        self._require(name)
        self.model.delete_adapter(name)
        self.branches.remove(name)

    def parameters(self, name: str) -> list[torch.nn.Parameter]:
        """The trainable LoRA parameters of one branch."""
        self._require(name)
        return [p for n, p in self.model.named_parameters() if f".{name}." in n and "lora_" in n]

    # ---- selecting an adapter ----------------------------------------------------------------
    @contextlib.contextmanager
    def adapter(self, name: str | None) -> Iterator[torch.nn.Module]:
        """Runs a block with ``name`` active; ``None`` runs the base model (adapters disabled)."""
        if self.model is None:
            if name is not None:
                raise KeyError(f"no branch {name!r}: this policy has no adapters yet")
            yield self.base_model
            return
        if name is None:
            with self.model.disable_adapter():
                yield self.model
            return
        self._require(name)
        self.model.set_adapter(name)
        yield self.model

    @property
    def device(self) -> torch.device:
        return self.base_model.device

    # ---- the adapter-applied check -----------------------------------------------------------
    def is_zero(self, name: str) -> bool:
        self._require(name)
        return all(float(p.detach().abs().max()) == 0.0 for n, p in self.model.named_parameters()
                   if f".{name}." in n and "lora_B" in n)

    @torch.no_grad()
    def probe_logprobs(self, name: str | None) -> torch.Tensor:
        """Log-probs of a fixed prompt's tokens under ``name`` (None = base)."""
        ids = self.tokenizer.apply_chat_template(PROBE_MESSAGES, add_generation_prompt=True, return_tensors="pt",
                                                 return_dict=True)["input_ids"].to(self.device)
        with self.adapter(name) as m:
            logits = m(input_ids=ids).logits.float()
        return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)

    def check_adapter_applied(self, name: str, atol: float = 1e-7) -> None:
        """Raises AdapterNotAppliedError if ``name`` is non-zero yet scores like the base model."""
        if self.is_zero(name):
            return  # a fresh adapter equals the base model by construction
        if self._base_probe is None:  # the base weights never train: probe them once
            self._base_probe = self.probe_logprobs(None)
        diff = (self.probe_logprobs(name) - self._base_probe).abs().max().item()
        if diff <= atol:
            raise AdapterNotAppliedError(
                f"branch {name!r} has non-zero LoRA weights but its log-probs equal the base model's "
                f"(max |Δ| = {diff:.2e}): the adapter is not applied, rollouts would silently use the base model"
            )

    # ---- helpers ------------------------------------------------------------------------------
    def _require(self, name: str) -> None:
        if name not in self.branches:
            raise KeyError(f"no branch {name!r}; known: {self.branches}")

    def _require_new(self, name: str) -> None:
        if name in self.branches:
            raise ValueError(f"branch {name!r} already exists")
