"""The KV decoder's decode step at fixed shapes, replayed from a captured CUDA graph on a GPU.

Why: on a GPU a decode step of a small model is a few hundred small kernels, and launching them one
by one from Python costs more than running them (on an H200 the KV decoder was only 1.8× ``generate``,
issue 48). A CUDA graph records the step's kernels once and replays them with one launch. That needs
every shape and every address fixed from one step to the next, so this step differs from
:meth:`KVDecoder.forward` in three ways and computes the same numbers:

- it attends over the cache's whole capacity, the positions not yet filled masked out, instead of
  over the filled prefix (a shape that grows by one each step);
- the position it writes is a tensor on the device, advanced inside the step, so keys, values and
  validity land by ``index_copy_`` rather than by a Python slice;
- the batch keeps its rows when some finish: a finished row feeds padding, which the cache marks
  invalid (the sampler does not shrink a static batch).

On a CPU the same step runs without capture, which is how it is tested for equality with
``forward`` (``tests/test_decode_graph.py``); the sampler uses it by default only on CUDA.
"""

from __future__ import annotations

import logging

import torch

from evotrainer.policy.kv_decoder import KVCache, KVDecoder, RowLora

log = logging.getLogger(__name__)


def graphs_supported(decoder: KVDecoder) -> str | None:
    """None when the decode step can be captured for this model, else the reason it cannot."""
    rope = (getattr(decoder.config, "rope_parameters", None) or {}).get("rope_type", "default")
    if "dynamic" in str(rope) or "longrope" in str(rope):
        return f"rope_type {rope!r} recomputes its frequencies from the positions it sees"
    return None


class StaticDecodeStep:
    """One token per row appended to ``cache`` under ``lora``, at shapes fixed for the cache's life.

    ``capture``: record the step as a CUDA graph after one eager step (the warm-up) and replay it
    from then on; without it every step runs eagerly (a CPU, or a GPU where capture is off)."""

    def __init__(self, decoder: KVDecoder, cache: KVCache, lora, *, capture: bool) -> None:
        self.decoder, self.cache, self.lora, self.capture = decoder, cache, lora, capture
        batch, dev = cache.valid.shape[0], decoder.device
        self.ids = torch.zeros((batch, 1), dtype=torch.long, device=dev)
        self.valid = torch.zeros((batch, 1), dtype=torch.bool, device=dev)
        self.at = torch.tensor([cache.length], dtype=torch.long, device=dev)   # the position written next
        self.positions = torch.arange(cache.capacity, device=dev)
        self.logits: torch.Tensor | None = None
        self.graph = None
        self.steps = 0

    def __call__(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """The logits after each row's new token, as :meth:`KVDecoder.forward` with T = 1 returns them."""
        if self.cache.length + 1 > self.cache.capacity:
            raise ValueError(f"KV cache holds {self.cache.capacity} positions; {self.cache.length + 1} asked")
        self.ids.copy_(ids)
        self.valid.copy_(valid)
        if not self.capture or self.steps == 0:
            self._run()
        elif self.graph is not None or self._record():
            self.graph.replay()
        else:
            self._run()
        self.cache.length += 1
        self.steps += 1
        return self.logits.clone()      # the graph overwrites its output on the next replay

    def _record(self) -> bool:
        """Captures the step; False (logged) when capture fails, and the step runs eagerly from then on.
        Capture records kernels without running them, so a failed one has written nothing."""
        # The eager first step warmed the kernels up; capture records without running.
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._run()
        except RuntimeError as e:
            log.warning("decode step could not be captured as a CUDA graph (%s); it runs eagerly", e)
            self.capture = False
            return False
        self.graph = graph
        log.debug("decode step captured as a CUDA graph: batch %d, capacity %d",
                  self.ids.shape[0], self.cache.capacity)
        return True

    @torch.inference_mode()
    def _run(self) -> None:
        dec, cache, at = self.decoder, self.cache, self.at
        B = self.ids.shape[0]
        cache.valid.index_copy_(1, at, self.valid)
        pos = (cache.next_pos[:, None] + self.valid.long() - 1).clamp(min=0)
        cache.next_pos.add_(self.valid.long().squeeze(1))
        cos, sin = dec.rotary(dec.embed[:1], pos)
        cos, sin = cos[:, None], sin[:, None]
        # The query at position `at` sees the valid positions up to its own, and itself (a padding
        # row stays finite, as in forward); positions past it are empty or stale, masked either way.
        allowed = (cache.valid & (self.positions <= at)) | (self.positions == at)
        bias = torch.zeros(allowed.shape, dtype=torch.float32, device=allowed.device)
        bias.masked_fill_(~allowed, float("-inf"))
        G = dec.heads // dec.kv_heads
        bias = bias[:, None, None].expand(B, 1, G, bias.shape[-1])

        def write(i: int, k: torch.Tensor, v: torch.Tensor):
            cache.k[i].index_copy_(2, at, k)
            cache.v[i].index_copy_(2, at, v)
            return cache.k[i], cache.v[i]

        x = torch.nn.functional.embedding(self.ids, dec.embed)
        logits = dec.layers_forward(x, cos, sin, bias, self.lora, write)
        at.add_(1)
        if self.logits is None:
            self.logits = logits
        else:
            self.logits.copy_(logits)


def decode_step(decoder: KVDecoder, cache: KVCache, lora: list | RowLora | None, static: bool):
    """The sampler's decode step: ``forward`` on the growing prefix, or the static step (captured on
    CUDA). Capture is skipped, and logged, where the model's rotary embedding cannot be captured."""
    if not static:
        return lambda ids, valid: decoder.forward(cache, ids, valid, lora)
    capture = decoder.device.type == "cuda"
    if capture and (reason := graphs_supported(decoder)):
        log.info("decode step not captured as a CUDA graph: %s; it runs eagerly at static shapes", reason)
        capture = False
    return StaticDecodeStep(decoder, cache, lora, capture=capture)
