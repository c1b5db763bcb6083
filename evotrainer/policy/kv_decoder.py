"""A Llama-family forward pass for sampling: one branch's weights merged, projections fused, KV kept.

Why not ``generate``: on a CPU, a decode step of a 135M model at 16 sequences is a few GFLOP, and
``generate`` spends most of a step elsewhere (measured in ``benchmarks/rollout_throughput.py``): it
re-concatenates the whole KV cache every step, builds a 4-D mask per layer, runs LoRA as four extra
matmuls per projection, draws a categorical sample with one exponential per vocabulary entry, and
runs one flash-attention kernel launch per layer for a single query. This module does the same
arithmetic as the Hugging Face model with peft (RMSNorm in fp32, RoPE from the model's own rotary
module, SiLU-gated MLP, ``B(A(x)) * scale`` added to each adapted projection) with:

- the frozen base weights copied once, q/k/v fused into one matmul and gate/up into another, and
  packed for the CPU's matmul kernel; every branch's LoRA paths run beside them unmerged, as peft
  runs them, so one copy serves all adapters and a trained adapter is never stale;
- a preallocated KV cache written in place, attended over its filled prefix only;
- prompts that repeat in a batch (a GRPO group asks one prompt n times) prefilled once, their cache
  rows copied to every sequence that shares them;
- a cache that outlives a call: a later call whose sequences extend cached ones (the next turn of an
  episode) prefills only the new tokens.

Which models it serves is a closed list (:func:`supports`); anything else samples with ``generate``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

ARCHITECTURES = {"llama", "mistral", "qwen2"}


def supports(config) -> str | None:
    """None when this decoder computes what the model computes, else the reason it does not."""
    kind = getattr(config, "model_type", None)
    if kind not in ARCHITECTURES:
        return f"model_type {kind!r} is not one of {sorted(ARCHITECTURES)}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} (only silu)"
    if getattr(config, "mlp_bias", False):
        return "mlp_bias"
    window = getattr(config, "sliding_window", None)
    if kind != "llama" and window is not None and getattr(config, "use_sliding_window", kind == "mistral"):
        return f"sliding-window attention (window {window})"
    return None


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# The decoder's fused projections and what they stack, in order.
FUSED = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate_up": ("gate_proj", "up_proj"),
         "down": ("down_proj",)}


@dataclass(frozen=True)
class LoraDelta:
    """The LoRA paths of the projections inside one fused projection, as two matmuls: ``A`` stacks
    their down-projections, ``B`` puts each up-projection (times its scale) in its block of the
    fused output, zeros elsewhere. Equal to peft's ``B(A(x)) * scale`` for each projection."""

    A: torch.Tensor
    B: torch.Tensor
    bias: torch.Tensor | None

    def add_to(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if out.dtype == self.A.dtype and self.bias is None:   # one fused multiply-add into the output
            n = out.shape[-1]
            out.view(-1, n).addmm_(F.linear(x.reshape(-1, x.shape[-1]), self.A), self.B.t())
            return out
        # As peft: the base output and the LoRA path summed in the adapter's dtype, then cast back.
        delta = F.linear(F.linear(x.to(self.A.dtype), self.A), self.B, self.bias)
        return (out.to(delta.dtype) + delta).to(out.dtype)


def _base(module) -> torch.nn.Linear:
    return getattr(module, "base_layer", module)


def _projections(layer) -> dict[str, torch.nn.Module]:
    att, mlp = layer.self_attn, layer.mlp
    return {n: getattr(att if n in ("q_proj", "k_proj", "v_proj", "o_proj") else mlp, n) for n in PROJECTIONS}


def _fuse(modules: dict[str, torch.nn.Module], names: tuple[str, ...], adapter: str) -> LoraDelta:
    As, blocks = [], []           # blocks: (output rows, scaled B weight or None, scaled B bias or None)
    for n in names:
        m = modules[n]
        rows = _base(m).weight.shape[0]
        if adapter not in getattr(m, "lora_A", {}):
            blocks.append((rows, None, None))
            continue
        if adapter in getattr(m, "lora_variant", {}) or getattr(m, "use_dora", {}).get(adapter):
            raise ValueError(f"adapter {adapter!r} uses a peft variant (DoRA or similar) on {n}")
        scale = float(m.scaling[adapter])
        up = m.lora_B[adapter]
        As.append(m.lora_A[adapter].weight.detach())
        bias = getattr(up, "bias", None)
        blocks.append((rows, up.weight.detach() * scale, bias.detach() * scale if bias is not None else None))
    A = torch.cat(As)
    B = A.new_zeros((sum(r for r, _, _ in blocks), A.shape[0]))
    row = col = 0
    for rows, w, _ in blocks:
        if w is not None:
            B[row:row + rows, col:col + w.shape[1]] = w
            col += w.shape[1]
        row += rows
    bias = None
    if any(b is not None for _, _, b in blocks):
        bias = torch.cat([b if b is not None else A.new_zeros(r) for r, _, b in blocks])
    return LoraDelta(A, B, bias)


def lora_deltas(model, adapter: str | None) -> list[dict[str, LoraDelta]]:
    """Per decoder layer, ``adapter``'s LoRA paths by fused projection, built from the peft model's
    current tensors (build them again after a training step; they are small).

    Raises ValueError for what the decoder does not compute: DoRA and other peft variants, or an
    adapter on a module outside the layers' seven projections (embeddings, the LM head)."""
    hf = getattr(model, "get_base_model", lambda: model)()
    if adapter is None:
        return [{} for _ in hf.model.layers]
    out, covered = [], 0
    for layer in hf.model.layers:
        mods = _projections(layer)
        fused = {}
        for key, names in FUSED.items():
            adapted = sum(adapter in getattr(mods[n], "lora_A", {}) for n in names)
            if adapted:
                fused[key] = _fuse(mods, names, adapter)
                covered += adapted
        out.append(fused)
    total = sum(1 for m in model.modules() if adapter in getattr(m, "lora_A", {}))
    if total != covered:
        raise ValueError(f"adapter {adapter!r} adapts {total - covered} module(s) outside the decoder layers' "
                         "projections (embeddings or the LM head)")
    return out


@dataclass(frozen=True)
class RowsDelta:
    """One fused projection's LoRA paths for a batch whose rows run different adapters: each part is
    (the rows of one adapter, its :class:`LoraDelta`). The low-rank products are gathered per adapter,
    as multi-LoRA servers do, beside one base matmul shared by every row."""

    parts: tuple[tuple[torch.Tensor, LoraDelta], ...]

    def add_to(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        for rows, delta in self.parts:
            out.index_copy_(0, rows, delta.add_to(out.index_select(0, rows), x.index_select(0, rows)))
        return out


class RowLora:
    """Per-row adapters for :meth:`KVDecoder.forward`: row r runs ``loras[group[r]]`` (each one
    :func:`lora_deltas` of a branch; ``[{}, ...]`` for the base model). Indexes like those lists, by
    layer, so the forward pass reads one branch's deltas and several branches' the same way."""

    def __init__(self, group: torch.Tensor, loras: list[list[dict[str, LoraDelta]]]) -> None:
        self.group, self.loras = group, loras
        rows = [(group == g).nonzero().squeeze(1) for g in range(len(loras))]
        self._layers = [
            {key: RowsDelta(tuple((r, lora[i][key]) for r, lora in zip(rows, loras) if r.numel() and key in lora[i]))
             for key in FUSED if any(key in lora[i] for lora in loras)}
            for i in range(len(loras[0]))]

    def select(self, keep: torch.Tensor) -> "RowLora":
        """The rows ``keep`` of this batch, in that order (the batch shrank or was reordered)."""
        return RowLora(self.group.index_select(0, keep), self.loras)

    def __getitem__(self, layer: int) -> dict[str, RowsDelta]:
        return self._layers[layer]

    def __len__(self) -> int:
        return len(self._layers)


def _packed_linear_available() -> bool:
    try:
        w = torch.zeros(4, 4)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 1)
        return torch.ops.mkldnn._linear_pointwise(torch.ones(1, 4), packed, None, "none", [], "").shape == (1, 4)
    except (AttributeError, RuntimeError):
        return False


PACKED = _packed_linear_available()


class Linear:
    """``y = x W^T + b`` with W packed once into oneDNN's blocked layout when on a CPU.

    Why: at decode shapes (a few rows against a large weight) the default CPU path re-packs the
    weight on every call, which halves its speed with the model's weights streaming from memory
    (``benchmarks/rollout_throughput.py`` prints the kernel rates side by side). The packed
    kernel is the one PyTorch's own compiler uses for frozen CPU linears; it returns the same
    values up to fp32 summation order. Elsewhere (a GPU, a build without oneDNN) it is F.linear."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, rows_hint: int = 16) -> None:
        self.weight, self.bias = weight.contiguous(), bias
        self.packed = None
        if PACKED and weight.device.type == "cpu" and weight.dtype in (torch.float32, torch.bfloat16):
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, rows_hint)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


@dataclass
class _Layer:
    ln1: torch.Tensor
    qkv: Linear
    o: Linear
    ln2: torch.Tensor
    gate_up: Linear
    down: Linear


class KVCache:
    """Keys and values of B sequences, preallocated to ``capacity`` positions, plus each position's
    validity (left padding is invalid) and each sequence's next position id."""

    def __init__(self, layers: int, batch: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device) -> None:
        shape = (batch, kv_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.valid = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
        self.next_pos = torch.zeros(batch, dtype=torch.long, device=device)
        self.length = 0          # filled positions (shared by all rows; padding fills the gaps)
        self.capacity = capacity

    def select(self, rows: torch.Tensor, capacity: int) -> "KVCache":
        """A new cache holding ``rows`` of this one (repeats allowed), with room for ``capacity``."""
        return KVCache.concat([(self, rows)], capacity)

    @staticmethod
    def concat(parts: list[tuple["KVCache", torch.Tensor]], capacity: int) -> "KVCache":
        """A new cache stacking the given rows of several caches (of any lengths: a shorter one's
        missing positions are padding, invalid), with room for ``capacity`` positions."""
        first = parts[0][0]
        n = max(c.length for c, _ in parts)
        batch = sum(len(r) for _, r in parts)
        out = KVCache.__new__(KVCache)
        out.k, out.v = [], []
        for layer in range(len(first.k)):
            _, h, _, d = first.k[layer].shape
            nk = first.k[layer].new_zeros((batch, h, capacity, d))
            nv = first.v[layer].new_zeros((batch, h, capacity, d))
            at = 0
            for c, rows in parts:
                m = c.length
                nk[at:at + len(rows), :, :m] = c.k[layer][:, :, :m].index_select(0, rows)
                nv[at:at + len(rows), :, :m] = c.v[layer][:, :, :m].index_select(0, rows)
                at += len(rows)
            out.k.append(nk)
            out.v.append(nv)
        out.valid = first.valid.new_zeros((batch, capacity))
        at = 0
        for c, rows in parts:
            out.valid[at:at + len(rows), :c.length] = c.valid[:, :c.length].index_select(0, rows)
            at += len(rows)
        out.next_pos = torch.cat([c.next_pos.index_select(0, rows) for c, rows in parts])
        out.length, out.capacity = n, capacity
        return out


class KVDecoder:
    """The frozen base weights of a Llama-family model, fused and packed once; any branch's LoRA
    paths are passed to :meth:`forward`, so one decoder serves every adapter of a policy."""

    def __init__(self, model) -> None:
        hf = getattr(model, "get_base_model", lambda: model)()  # through a PeftModel to the HF model
        cfg = hf.config
        reason = supports(cfg)
        if reason:
            raise ValueError(f"KVDecoder cannot run this model: {reason}")
        self.config = cfg
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        body = hf.model
        self.rotary = body.rotary_emb
        self.embed = body.embed_tokens.weight.detach()
        self.norm = body.norm.weight.detach()
        self.lm_head = Linear(hf.lm_head.weight.detach())
        self.dtype, self.device = self.embed.dtype, self.embed.device
        # Set by decode_graph.py: why a CUDA-graph capture failed (then it is not tried again), and the
        # last reason it logged for not capturing (said once, not on every call).
        self.graph_failure: str | None = None
        self.graph_refusal_said: str | None = None
        self.layers: list[_Layer] = []
        for layer in body.layers:
            mods = {n: _base(m) for n, m in _projections(layer).items()}
            q, k, v, o = mods["q_proj"], mods["k_proj"], mods["v_proj"], mods["o_proj"]
            qkv_bias = torch.cat([q.bias, k.bias, v.bias]).detach() if q.bias is not None else None
            self.layers.append(_Layer(
                ln1=layer.input_layernorm.weight.detach(),
                qkv=Linear(torch.cat([q.weight, k.weight, v.weight]).detach(), qkv_bias),
                o=Linear(o.weight.detach(), o.bias.detach() if o.bias is not None else None),
                ln2=layer.post_attention_layernorm.weight.detach(),
                gate_up=Linear(torch.cat([mods["gate_proj"].weight, mods["up_proj"].weight]).detach()),
                down=Linear(mods["down_proj"].weight.detach()),
            ))

    # ---- the forward pass --------------------------------------------------------------------
    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:   # one kernel, LlamaRMSNorm's formula
            return F.rms_norm(x, weight.shape, weight, self.eps)
        # As LlamaRMSNorm: the statistics in fp32, the scale in the model's dtype.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        return KVCache(len(self.layers), batch, self.kv_heads, self.head_dim, capacity, self.dtype, self.device)

    @staticmethod
    def _project(linear: Linear, fused: str, x: torch.Tensor, deltas: dict[str, LoraDelta | RowsDelta]) -> torch.Tensor:
        out = linear(x)
        delta = deltas.get(fused)
        return out if delta is None else delta.add_to(out, x)

    @torch.inference_mode()
    def forward(self, cache: KVCache, ids: torch.Tensor, valid: torch.Tensor,
                lora: list[dict[str, LoraDelta]] | RowLora | None = None) -> torch.Tensor:
        """Appends ``ids`` (B, T) to the cache (``valid`` marks real tokens; padding is left of them)
        and returns the logits after the last position of each row, in fp32 (B, vocab). ``lora``:
        :func:`lora_deltas` of the branch to run (None: the base model), or a :class:`RowLora` when
        the rows run different branches."""
        B, T = ids.shape
        start = cache.length
        if start + T > cache.capacity:
            raise ValueError(f"KV cache holds {cache.capacity} positions; {start + T} asked")
        cache.valid[:, start:start + T] = valid
        pos = cache.next_pos[:, None] + valid.long().cumsum(1) - 1
        pos = pos.clamp(min=0)
        cache.next_pos += valid.long().sum(1)
        cache.length = start + T
        S = cache.length
        cos, sin = self.rotary(self.embed[:1], pos)                   # (B, T, D), as the HF model makes them
        cos, sin = cos[:, None], sin[:, None]
        # Additive mask (B, 1, 1, T, S): a query sees valid cached positions up to its own.
        seen = cache.valid[:, None, :S]
        causal = torch.arange(S, device=ids.device)[None, :] <= torch.arange(start, S, device=ids.device)[:, None]
        allowed = seen & causal[None]
        # A padding query sees itself, so its row stays finite (a row of -inf would give NaN, and
        # NaN keys poison the products with real queries even under a zero weight).
        allowed[:, torch.arange(T), torch.arange(start, S)] = True
        bias = torch.zeros(allowed.shape, dtype=torch.float32, device=ids.device)
        bias.masked_fill_(~allowed, float("-inf"))
        # Grouped-query attention without repeating K/V: query head h reads KV head h // G, so the G
        # heads of a KV head are stacked along the query axis (B, KV, G*T, D), the mask with them.
        G = self.heads // self.kv_heads
        bias = bias[:, None, None].expand(B, 1, G, T, S).reshape(B, 1, G * T, S)

        x = F.embedding(ids, self.embed)
        return self.layers_forward(x, cos, sin, bias, lora, lambda i, k, v: self._append(cache, i, start, k, v))

    @staticmethod
    def _append(cache: KVCache, i: int, start: int, k: torch.Tensor, v: torch.Tensor):
        """Layer i's new keys and values written at ``start``; the filled prefix to attend over."""
        S = start + k.shape[2]
        cache.k[i][:, :, start:S] = k
        cache.v[i][:, :, start:S] = v
        return cache.k[i][:, :, :S], cache.v[i][:, :, :S]

    def layers_forward(self, x, cos, sin, bias, lora, write) -> torch.Tensor:
        """The decoder layers and the final norm and head over embedded tokens ``x`` (B, T, hidden):
        ``bias`` the additive attention mask (B, 1, G*T, keys), ``write(i, k, v)`` stores layer i's
        new keys and values and returns the keys and values to attend over (the decode graph's static
        step stores them by a device index, over the cache's whole capacity)."""
        B, T = x.shape[:2]
        H, KV, D = self.heads, self.kv_heads, self.head_dim
        G = H // KV
        scale = D ** -0.5
        half = D // 2
        for i, L in enumerate(self.layers):
            h = self._rms(x, L.ln1)
            deltas = lora[i] if lora else {}
            qkv = self._project(L.qkv, "qkv", h, deltas)
            qk = qkv[..., :(H + KV) * D].view(B, T, H + KV, D).transpose(1, 2)
            v = qkv[..., (H + KV) * D:].view(B, T, KV, D).transpose(1, 2)
            qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), -1) * sin   # RoPE, q and k at once
            q, k = qk[:, :H], qk[:, H:]
            keys, values = write(i, k, v)
            scores = torch.matmul(q.reshape(B, KV, G * T, D), keys.transpose(-1, -2)).float() * scale + bias
            probs = torch.softmax(scores, dim=-1).to(v.dtype)
            att = torch.matmul(probs, values)                            # (B, KV, G*T, D)
            att = att.view(B, H, T, D).transpose(1, 2).reshape(B, T, H * D)
            x = x + self._project(L.o, "o", att, deltas)
            h = self._rms(x, L.ln2)
            gate, up = self._project(L.gate_up, "gate_up", h, deltas).chunk(2, dim=-1)
            x = x + self._project(L.down, "down", F.silu(gate) * up, deltas)
        last = self._rms(x[:, -1], self.norm)
        return self.lm_head(last).float()
