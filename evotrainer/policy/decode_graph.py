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

import contextlib
import logging
import warnings

import torch

from evotrainer.policy.kv_decoder import KVCache, KVDecoder, RowLora

log = logging.getLogger(__name__)


# A call that decodes fewer tokens than this runs its static step eagerly: capturing costs a device
# synchronisation and about one step's time, which a short call would not earn back.
MIN_CAPTURED_STEPS = 16


def graphs_supported(decoder: KVDecoder) -> str | None:
    """None when the decode step can be captured for this model, else the reason it cannot: a rotary
    embedding that recomputes its frequencies from the positions it sees (a host sync), or an
    earlier capture on this decoder that failed (it is not retried on every call)."""
    if decoder.graph_failure:
        return f"an earlier capture failed ({decoder.graph_failure})"
    rope = str(getattr(decoder.rotary, "rope_type", "default"))   # the module's own: transformers 4.x and 5.x
    if "dynamic" in rope or "longrope" in rope:
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
        self.stream = None       # the side stream the warm-up and the capture run on (CUDA only)
        self.steps = 0

    def __call__(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """The logits after each row's new token, as :meth:`KVDecoder.forward` with T = 1 returns them."""
        if self.cache.length + 1 > self.cache.capacity:
            raise ValueError(f"KV cache holds {self.cache.capacity} positions; {self.cache.length + 1} asked")
        self.ids.copy_(ids)
        self.valid.copy_(valid)
        if not self.capture:
            self._run()
        elif self.steps == 0:
            self._warm_up()
        elif self.graph is not None or self._record():
            self.graph.replay()
        else:
            self._run()
        self.cache.length += 1
        self.steps += 1
        return self.logits.clone()      # the graph overwrites its output on the next replay

    @contextlib.contextmanager
    def _side_stream(self):
        """The decoder's device made current and a side stream of it, ordered after and before the
        current one: the capture stream is the current device's, and a failed capture must not leave
        its stream current (``torch.cuda.graph`` restores it only when capture ends cleanly)."""
        with torch.cuda.device(self.decoder.device):
            main = torch.cuda.current_stream()
            if self.stream is None:
                self.stream = torch.cuda.Stream()
            self.stream.wait_stream(main)
            try:
                with torch.cuda.stream(self.stream):
                    yield self.stream
            finally:
                main.wait_stream(self.stream)

    def _warm_up(self) -> None:
        """The first step, run eagerly on the stream the capture will use (as PyTorch asks: per-stream
        lazy setup, such as a cuBLAS workspace, happens here and not inside the graph's memory pool)."""
        if self.decoder.device.type != "cuda":    # capture asked where there is nothing to capture on
            self._give_up(RuntimeError(f"{self.decoder.device} is not a CUDA device"))
            self._run()
            return
        with self._side_stream():
            self._run()

    def _record(self) -> bool:
        """Captures the step; False (logged, and remembered on the decoder) when capture fails, and the
        step runs eagerly from then on. Capture records kernels without running them, so a failed one
        has written nothing."""
        try:
            graph = torch.cuda.CUDAGraph()
            with warnings.catch_warnings(record=True) as caught, self._side_stream() as stream:
                warnings.simplefilter("always")
                with torch.cuda.graph(graph, stream=stream):
                    self._run()
            empty = [w for w in caught if "empty" in str(w.message).lower()]
            if empty:   # kernels ran elsewhere than the captured stream: replaying would do nothing
                raise RuntimeError(str(empty[0].message))
        except RuntimeError as e:
            self._give_up(e)
            return False
        self.graph = graph
        log.debug("decode step captured as a CUDA graph: batch %d, capacity %d",
                  self.ids.shape[0], self.cache.capacity)
        return True

    def _give_up(self, error: Exception) -> None:
        log.warning("decode step could not be captured as a CUDA graph (%s); it runs eagerly, and this "
                    "decoder does not try again", error)
        self.capture = False
        self.decoder.graph_failure = str(error)

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


def decode_step(decoder: KVDecoder, cache: KVCache, lora: list | RowLora | None, static: bool, steps: int):
    """The sampler's decode step for a call of up to ``steps`` tokens: ``forward`` on the growing
    prefix, or the static step (captured on CUDA when the call is long enough to earn it back).
    Capture is skipped, and logged, where :func:`graphs_supported` says it cannot happen."""
    if not static:
        return lambda ids, valid: decoder.forward(cache, ids, valid, lora)
    capture = decoder.device.type == "cuda" and steps >= MIN_CAPTURED_STEPS
    if capture and (reason := graphs_supported(decoder)):
        if decoder.graph_refusal_said != reason:    # once per decoder and reason
            log.info("decode step not captured as a CUDA graph: %s; it runs eagerly at static shapes", reason)
            decoder.graph_refusal_said = reason
        capture = False
    return StaticDecodeStep(decoder, cache, lora, capture=capture)
