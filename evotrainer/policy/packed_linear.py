"""Frozen linear layers on a CPU run on oneDNN's packed weights, forward and backward.

A LoRA branch never trains the base weights, so each base ``nn.Linear`` can hold its weight packed
once into oneDNN's blocked layout (and its transpose, for the input gradient), instead of the default
CPU matmul re-packing it on every call. Measured at the trainer's shapes (the quickstart's GRPO step:
about 300-500 rows against SmolLM2's projections) that is 1.3-1.4x the matmul speed, forward and
backward (``benchmarks/step_speed.py``); the values are the same up to float summation order.

Only the module's ``forward`` changes (the weight stays the same ``Parameter``, so peft, saving and
loading see what they saw); a weight that changes after packing is caught by its version counter and
packed again. The packed copies cost twice the weights' memory, so models above ``MAX_PARAMS`` stay as
they are.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from evotrainer.policy.kv_decoder import PACKED

MAX_PARAMS = 600_000_000   # two packed copies of a bigger model's weights cost more memory than they save time


def _pack(w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(w.detach().contiguous(), 256)


def _apply(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class _PackedLinearFn(torch.autograd.Function):
    """y = x W^T + b with W frozen: the backward gives x its gradient only (W's would be thrown away)."""

    @staticmethod
    def forward(ctx, x, packed, packed_t, bias):
        ctx.packed_t = packed_t
        return _apply(x, packed, bias)

    @staticmethod
    def backward(ctx, grad):
        return _apply(grad.contiguous(), ctx.packed_t, None), None, None, None


def _forward(self, x: torch.Tensor) -> torch.Tensor:
    w = self.weight
    if w.requires_grad or x.dtype != w.dtype or x.device.type != "cpu":
        return F.linear(x, w, self.bias)
    if self._packed_version != w._version:   # the weight was written in place since it was packed
        self._packed, self._packed_t = _pack(w), _pack(w.t())
        self._packed_version = w._version
    bias = self.bias.detach() if self.bias is not None else None
    if torch.is_grad_enabled() and x.requires_grad:
        return _PackedLinearFn.apply(x, self._packed, self._packed_t, bias)
    return _apply(x, self._packed, bias)


def pack_frozen_linears(model: torch.nn.Module) -> int:
    """Gives every frozen fp32/bf16 ``nn.Linear`` of a CPU model the packed forward; returns how many.
    Nothing happens without oneDNN's packed kernels, on other devices, or above ``MAX_PARAMS``."""
    if not PACKED or sum(p.numel() for p in model.parameters()) > MAX_PARAMS:
        return 0
    n = 0
    for module in model.modules():
        if type(module) is not torch.nn.Linear or getattr(module, "_packed_version", None) is not None:
            continue
        w = module.weight
        if w.device.type != "cpu" or w.dtype not in (torch.float32, torch.bfloat16):
            continue
        module._packed_version = -1   # packed at the first call, when the weight is final
        module.forward = types.MethodType(_forward, module)
        n += 1
    return n
