"""Rollout engines: turn chat prompts into sampled completions with per-token sampler logprobs.

``RolloutEngine`` is the interface callers use (the trainer, held-out verification, a multi-turn
environment loop). ``TransformersEngine`` implements it on any device: with the KV decoder
(``policy/kv_sampler.py``) for the Llama family, with ``generate`` for any other model; a vLLM
engine implements the same ``generate`` signature, so callers do not change.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Protocol, Sequence

import torch
from transformers import (LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper,
                          TopPLogitsWarper)

Messages = list[dict[str, str]]
log = logging.getLogger(__name__)
batch_log = logging.getLogger(__name__ + ".batches")   # DEBUG: one line per population sampling batch
DECODERS = ("auto", "kv", "generate")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0          # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    seed: int = 0
    # Episodes only: the share of each group's episodes whose turns are decoded under the domain's
    # tool-call grammar (guided exploration, policy/guided_decoding.py); the rest sample freely.
    guided_call_share: float = 0.0
    # ... and the share decoded under it with the tool fixed turn by turn (read, edit, test, submit).
    guided_plan_share: float = 0.0
    # ... and what a guided edit may write: "line" any one line, "token" a one-token change of it,
    # "quoted" a one-token change of a line the issue quotes (where it quotes one).
    guided_edit: str = "line"


@dataclass
class Completion:
    prompt_ids: list[int]
    completion_ids: list[int]          # up to and including the stop token; no padding
    logprobs: list[float]              # sampler log p(token) under the processed distribution
    text: str                          # decoded completion, special tokens removed
    truncated: bool                    # ran out of max_new_tokens without a stop
    stop_reason: str                   # "eos" | "stop_string" | "length"
    gen_seconds: float = 0.0
    meta: dict = field(default_factory=dict)


def _settings(params: SamplingParams, temperatures: Sequence[float] = ()) -> str:
    """The sampling settings that decide whether two jobs share a batch (all but the seed and a
    temperature above 0: ``temperatures``, each job's)."""
    temperature = "/".join(f"{t:g}" for t in dict.fromkeys(temperatures or [params.temperature]))
    return (f"temperature={temperature} top_p={params.top_p} top_k={params.top_k} "
            f"max_new_tokens={params.max_new_tokens} stop={len(params.stop)} guided={params.guided_call_share}/"
            f"{params.guided_plan_share}")


def chat_ids(tokenizer, prompts: Sequence[Messages]) -> list[list[int]]:
    """Each prompt's chat-template token ids with the generation prompt: what every engine samples
    from (one encoding, so the engines and the trainer see the same tokens)."""
    return [
        list(tokenizer.apply_chat_template(list(m), add_generation_prompt=True, tokenize=True,
                                           return_dict=True)["input_ids"])
        for m in prompts
    ]


class RolloutEngine(Protocol):
    def generate(
        self, prompts: Sequence[Messages], params: SamplingParams, adapter: str | None = None
    ) -> list[Completion]:
        """One completion per prompt, sampled with ``params`` under LoRA ``adapter`` (None = base)."""
        ...


class TokenEngine(RolloutEngine, Protocol):
    """An engine that also continues token sequences: what multi-turn episodes need, so that every
    turn conditions on exactly the tokens sampled before it (no re-tokenised history)."""

    tokenizer: object

    def encode(self, prompts: Sequence[Messages]) -> list[list[int]]: ...

    def generate_ids(
        self, prompt_ids: Sequence[list[int]], params: SamplingParams, adapter: str | None = None,
        grammars: Sequence[str | None] | None = None,
    ) -> list[Completion]:
        """``grammars``: per sequence, a Lark grammar its completion must follow (None: free);
        see ``policy/guided_decoding.py``."""
        ...


class _RecordLogprobs(LogitsProcessor):
    """Records the log-probability of each sampled token under the final processed distribution.

    Placed last in the processor list, it sees the exact scores the sampler draws from. The token
    drawn at step t is only known at step t+1 (it is the last column of ``input_ids``), so it keeps
    one step of log-softmax and gathers lazily: memory O(batch × vocab), not O(batch × steps × vocab).
    """

    def __init__(self) -> None:
        self.pending: torch.Tensor | None = None
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.collect(input_ids)
        self.pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def collect(self, input_ids: torch.LongTensor) -> None:
        if self.pending is not None:
            self.logprobs.append(self.pending.gather(1, input_ids[:, -1:]).squeeze(1))
            self.pending = None


class _GuideProcessor(LogitsProcessor):
    """Masks each guided row's scores to its grammar's next tokens, for ``generate``. The token
    drawn at step t is the last column of ``input_ids`` at step t+1; it is consumed then."""

    def __init__(self, guide, prompt_width: int) -> None:
        self.guide, self.width = guide, prompt_width

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[1] > self.width:
            for i, t in enumerate(input_ids[:, -1].tolist()):
                self.guide.consume(i, t)
        return self.guide.mask_(scores, range(scores.shape[0]))


class TransformersEngine:
    """Batched, seeded sampling on the policy's own weights: chat template, stop strings, sampler
    log-probs, the branch's adapter.

    ``decoder``: ``"kv"`` samples with the KV decoder (fused and packed base weights, LoRA beside
    them, shared prompts prefilled once, an episode's next turn continued from its cache; 3-4x the
    tokens per second of ``generate`` on a CPU, ``benchmarks/rollout_throughput.py``);
    ``"generate"`` with ``transformers``' ``generate`` (any model, any peft adapter); ``"auto"``
    (the default) the first where it can run, saying in the log when it cannot.
    ``static_decode``: the KV decoder decodes at fixed shapes, replayed from a captured CUDA graph
    on a GPU (``policy/decode_graph.py``); None (the default) turns it on on CUDA only.
    ``policy`` is a :class:`evotrainer.policy.lora.Policy` (``model``, ``base_model``,
    ``tokenizer``, ``parameters(name)`` and an ``adapter(name)`` context manager).
    """

    def __init__(self, policy, batch_size: int = 32, decoder: str = "auto", static_decode: bool | None = None) -> None:
        if decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}, not {decoder!r}")
        self.policy = policy
        self.batch_size = batch_size
        self.decoder = decoder
        self.static_decode = static_decode
        self._kv = None
        self._kv_refused: set[str | None] = set()   # adapters the KV decoder cannot run (said once)

    @property
    def tokenizer(self):
        return self.policy.tokenizer

    def release_kept(self) -> None:
        """Drops the KV rows kept for continuing the last batch (when a batch of episodes ends, no
        later call continues them; a SWE batch's rows held GBs through the training step)."""
        if self._kv is not None:
            self._kv.forget()

    def encode(self, prompts: Sequence[Messages]) -> list[list[int]]:
        return chat_ids(self.tokenizer, prompts)

    def generate(
        self, prompts: Sequence[Messages], params: SamplingParams, adapter: str | None = None
    ) -> list[Completion]:
        return self.generate_ids(self.encode(prompts), params, adapter)

    @torch.no_grad()
    def generate_ids(
        self, encoded: Sequence[list[int]], params: SamplingParams, adapter: str | None = None,
        grammars: Sequence[str | None] | None = None,
    ) -> list[Completion]:
        """Continues each token sequence (a chat prompt already templated, or a whole trajectory);
        ``grammars[i]``, when given, is the grammar sequence i's completion follows."""
        encoded = [list(p) for p in encoded]
        grammars = list(grammars) if grammars is not None and any(grammars) else [None] * len(encoded)
        if len(grammars) != len(encoded):
            raise ValueError(f"{len(grammars)} grammars for {len(encoded)} sequences; give one per sequence")
        if self._kv_sampler(adapter) is not None:
            return self._sample_kv([(encoded, params, adapter, grammars)])[0]
        out: list[Completion] = []
        with self.policy.adapter(adapter) as model:
            for start in range(0, len(encoded), self.batch_size):
                # Seed per batch from (seed, batch index): same seed and batch → same tokens.
                torch.manual_seed(params.seed * 1_000_003 + start)
                end = start + self.batch_size
                out.extend(self._generate_batch(model, encoded[start:end], params, grammars[start:end]))
        return out

    def _guide(self, grammars: Sequence[str | None]):
        if not any(grammars):
            return None
        from evotrainer.policy.guided_decoding import GuidedRows
        from evotrainer.policy.kv_sampler import policy_model

        vocab = int(policy_model(self.policy).get_output_embeddings().weight.shape[0])
        return GuidedRows(self.tokenizer, grammars, vocab)

    def _kv_sampler(self, adapter: str | None):
        """The KV sampler when it can serve ``adapter``, else None (and the log says why, once)."""
        if self.decoder == "generate" or adapter in self._kv_refused:
            return None
        from evotrainer.policy.kv_decoder import lora_deltas, supports
        from evotrainer.policy.kv_sampler import KVSampler, policy_model

        try:
            model = policy_model(self.policy)
            if self._kv is None:
                reason = supports(getattr(model, "get_base_model", lambda: model)().config)
                if reason:
                    raise ValueError(reason)
                self._kv = KVSampler(self.policy, static=self.static_decode)
            if adapter is not None:
                lora_deltas(model, adapter)
        except ValueError as e:
            if self.decoder == "kv":
                raise ValueError(f"decoder 'kv' cannot sample {adapter or 'the base model'}: {e}") from e
            log.warning("sampling %s with transformers' generate (slower): the KV decoder cannot, %s",
                        adapter or "the base model", e)
            self._kv_refused.add(adapter)
            return None
        return self._kv

    def _sample_kv(self, requests: list[tuple[list[list[int]], SamplingParams, str | None, list[str | None]]]
                   ) -> list[list[Completion]]:
        """(sequences, params, adapter, grammars) requests that differ at most in seed, adapter and a
        temperature above 0, on the KV sampler (each row under its own request's temperature). Each
        request is cut into ``batch_size`` chunks seeded by (seed, chunk start), as ``generate`` is; a
        call samples the i-th chunk of every request together, each chunk's rows under its own adapter
        with its own generator."""
        tok, params = self.tokenizer, requests[0][1]
        eos = {tok.eos_token_id} if isinstance(tok.eos_token_id, int) else set(tok.eos_token_id or [])
        stop_check = None
        if params.stop:
            # A stop string of n characters spans at most n tokens (a special token renders as ""):
            # look at that tail only, every step.
            tail = max(len(s) for s in params.stop) + 2
            stop_check = lambda ids: any(s in tok.decode(ids[-tail:], skip_special_tokens=True)   # noqa: E731
                                         for s in params.stop)
        out: list[list[Completion]] = [[] for _ in requests]
        waves = max(len(enc) for enc, _, _, _ in requests)
        for start in range(0, waves, self.batch_size):
            batch, adapters, seeds, grammars, owners, temps = [], [], [], [], [], []
            for r, (enc, p, adapter, gr) in enumerate(requests):
                chunk = enc[start:start + self.batch_size]
                if chunk:
                    batch += chunk
                    adapters += [adapter] * len(chunk)
                    temps += [p.temperature] * len(chunk)
                    seeds.append((len(chunk), p.seed * 1_000_003 + start))
                    grammars += gr[start:start + self.batch_size]
                    owners += [r] * len(chunk)
            t0 = time.perf_counter()
            sampled = self._kv.sample_rows(
                batch, adapters, seeds=seeds, max_new_tokens=params.max_new_tokens, temperature=temps,
                top_k=params.top_k, top_p=params.top_p, eos=eos, pad=tok.pad_token_id, stop_check=stop_check,
                guide=self._guide(grammars))
            seconds = (time.perf_counter() - t0) / len(batch)
            for r, prompt, s in zip(owners, batch, sampled):
                out[r].append(self._finish(prompt, s.ids, s.logprobs, requests[r][1], seconds))
        return out

    def generate_many(self, jobs: Sequence[tuple[Sequence[Messages], SamplingParams, str | None]]
                      ) -> list[list[Completion]]:
        """Several (prompts, params, adapter) jobs, e.g. one per live branch, as :meth:`generate_ids_many`."""
        return self.generate_ids_many([(self.encode(prompts), params, adapter, None) for prompts, params, adapter in jobs])

    @torch.no_grad()
    def generate_ids_many(self, jobs: Sequence[tuple[Sequence[list[int]], SamplingParams, str | None,
                                                     Sequence[str | None] | None]]) -> list[list[Completion]]:
        """Several (sequences, params, adapter, grammars) jobs: one branch's prompts, or the next turn of
        its episodes. On the KV decoder, jobs that sample alike (the same settings but seed) decode in one
        batch, each row under its own branch's adapter and grammar; the others, and any job the KV
        decoder cannot serve, one after another. Each job's tokens are those it would get alone."""
        out: list[list[Completion]] = [[] for _ in jobs]
        alike: dict[tuple, list[int]] = {}
        for j, (encoded, params, adapter, grammars) in enumerate(jobs):
            if encoded and self._kv_sampler(adapter) is not None:   # a sampled temperature is per row
                alike.setdefault(replace(params, seed=0, temperature=float(params.temperature > 0)), []).append(j)
            elif encoded:
                t0 = time.perf_counter()
                out[j] = self.generate_ids(encoded, params, adapter, grammars=grammars)
                batch_log.debug("alone (no KV decoder): 1 jobs, %d rows, %s, %.3f s", len(encoded),
                                _settings(params), time.perf_counter() - t0)
        for members in alike.values():
            requests = []
            for j in members:
                encoded, params, adapter, grammars = jobs[j]
                grammars = list(grammars) if grammars is not None and any(grammars) else [None] * len(encoded)
                if len(grammars) != len(encoded):
                    raise ValueError(f"{len(grammars)} grammars for {len(encoded)} sequences; give one per sequence")
                requests.append(([list(e) for e in encoded], params, adapter, grammars))
            t0 = time.perf_counter()
            for j, completions in zip(members, self._sample_kv(requests)):
                out[j] = completions
            # Which jobs shared a batch and what it cost: why a population's sampling does or does
            # not get faster than one version at a time (benchmarks/demo_lockstep.py --arms together).
            batch_log.debug("batch: %d jobs, %d rows, %s, %.3f s", len(members), sum(len(r[0]) for r in requests),
                            _settings(requests[0][1], [r[1].temperature for r in requests]), time.perf_counter() - t0)
        return out

    def _generate_batch(self, model, prompt_ids: list[list[int]], params: SamplingParams,
                        grammars: Sequence[str | None]) -> list[Completion]:
        tok = self.tokenizer
        pad = tok.pad_token_id
        width = max(len(p) for p in prompt_ids)
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids], device=model.device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=model.device)
        recorder = _RecordLogprobs()
        greedy = params.temperature <= 0
        # Our own warpers, then the recorder, so it sees exactly the distribution sampled from;
        # generate() gets neutral settings and adds no warpers of its own after ours.
        processors = []
        if not greedy:
            processors.append(TemperatureLogitsWarper(float(params.temperature)))
            if params.top_k:
                processors.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1.0:
                processors.append(TopPLogitsWarper(params.top_p))
        processors.append(recorder)
        guide = self._guide(grammars)
        if guide is not None:   # after the recorder: it records the unguided distribution (guided_decoding.py)
            processors.append(_GuideProcessor(guide, width))
        kwargs = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0)
        if params.stop:
            kwargs.update(stop_strings=list(params.stop), tokenizer=tok)
        t0 = time.perf_counter()
        seqs = model.generate(
            input_ids=input_ids, attention_mask=attention, max_new_tokens=params.max_new_tokens,
            logits_processor=LogitsProcessorList(processors), pad_token_id=pad, eos_token_id=tok.eos_token_id,
            **kwargs,
        )
        recorder.collect(seqs)
        seconds = time.perf_counter() - t0
        new = seqs[:, width:].tolist()
        logps = torch.stack(recorder.logprobs, dim=1).tolist() if recorder.logprobs else [[] for _ in new]
        return [
            self._finish(p, ids, lp, params, seconds / len(new)) for p, ids, lp in zip(prompt_ids, new, logps)
        ]

    def _finish(self, prompt: list[int], ids: list[int], logps: list[float], params: SamplingParams,
                seconds: float) -> Completion:
        """Cuts a padded completion at its stop (eos inclusive, or the end of a stop string)."""
        tok = self.tokenizer
        eos = {tok.eos_token_id} if isinstance(tok.eos_token_id, int) else set(tok.eos_token_id or [])
        end, reason = len(ids), "length"
        for i, t in enumerate(ids):
            if t in eos:
                end, reason = i + 1, "eos"
                break
        if params.stop:
            text = tok.decode(ids[:end], skip_special_tokens=True)
            if any(s in text for s in params.stop):
                # Smallest prefix whose text holds a stop string: where generation stopped.
                for i in range(1, end + 1):
                    if any(s in tok.decode(ids[:i], skip_special_tokens=True) for s in params.stop):
                        end, reason = i, "stop_string"
                        break
        ids = ids[:end]
        return Completion(
            prompt_ids=prompt, completion_ids=ids, logprobs=logps[:end],
            text=tok.decode(ids, skip_special_tokens=True), truncated=reason == "length",
            stop_reason=reason, gen_seconds=seconds,
        )
