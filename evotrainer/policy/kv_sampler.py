"""Sampling on the KV decoder: shared prefixes prefilled once, continued sequences prefilled from
where they stopped, and every sampled token's log-probability under the distribution it was drawn from.

One call samples a batch of token sequences under one branch (``KVSampler.sample``), or rows of
several branches in one batch (``KVSampler.sample_rows``: one base matmul, each branch's LoRA paths on
its own rows, each branch's prompts prefilled under its adapter):

1. **Reuse.** The previous call's cache is kept with the tokens each of its rows holds. A sequence
   that extends one of them (the next turn of an episode: the trajectory so far, the tool result,
   the next assistant header) starts from that row and prefills only its new tokens. The cache is
   reused only under the same adapter with the same tensors (a training step in between makes it
   stale, and it is dropped). A batch of several branches' rows keeps each branch's rows apart, so
   the next turn of every branch's episodes continues from its own rows.
2. **Prefill** each distinct (start row, new tokens) once: a GRPO group asks one prompt n times.
   Fresh prompts that open with the same tokens (the chat template's system prompt) prefill that
   common prefix once.
3. **Decode**: per step, the processed scores (temperature, then top-k, then top-p, as
   ``transformers``' warpers compute them), their log-softmax (what ``Completion.logprobs``
   records, the trainer's ``old_logps``), and a draw by inverse CDF with one uniform per row from a
   generator seeded by the call (``generate`` draws one exponential per vocabulary entry: same
   distribution, other tokens for the same seed). Greedy is the argmax, as in ``generate``. Rows
   that finished leave the batch once a quarter of it has (greedy answers end at very different
   lengths); their cache is kept for the next call.

A row stops at an EOS token, when its text contains a stop string, or at ``max_new_tokens``; the
engine cuts each completion exactly as it cuts ``generate``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from evotrainer.policy.decode_graph import decode_step
from evotrainer.policy.guided_decoding import LOGPROB_FLOOR
from evotrainer.policy.kv_decoder import KVCache, KVDecoder, RowLora, lora_deltas

MIN_SHARED_PREFIX = 8   # tokens: a shorter common opening is not worth a prefill of its own


@dataclass
class Sampled:
    ids: list[int]            # sampled tokens, the stop token included
    logprobs: list[float]


@dataclass
class _Piece:
    cache: KVCache
    rows: list[tuple[int, ...]]   # per cache row, the tokens whose keys and values it holds
    outs: list[int]               # per cache row, the output row of the call that filled it

    def of(self, keep: list[int]) -> _Piece:
        """The piece's rows ``keep`` alone."""
        index = torch.tensor(keep, device=self.cache.k[0].device)
        return _Piece(self.cache.select(index, self.cache.length), [self.rows[r] for r in keep],
                      [self.outs[r] for r in keep])


def policy_model(policy):
    """The model to read weights from: the peft model once adapters exist, else the bare one."""
    model = getattr(policy, "model", None)
    return model if model is not None else policy.base_model


def adapter_key(policy, adapter: str | None) -> tuple:
    """Identifies an adapter's current tensors: their identities and in-place version counters
    (an optimizer step, a load or a fork bumps them)."""
    if adapter is None:
        return (None,)
    return (adapter,) + tuple((id(p), p._version) for p in policy.parameters(adapter))


def _common_prefix(seqs: list[tuple[int, ...]]) -> int:
    n = min(len(s) for s in seqs) - 1      # every sequence keeps at least one token of its own
    first = seqs[0]
    for s in seqs[1:]:
        i = 0
        while i < n and s[i] == first[i]:
            i += 1
        n = i
    return max(n, 0)


class KVSampler:
    """``static``: decode at fixed shapes (``decode_graph.py``), replayed from a captured CUDA graph
    on a GPU; None (the default) turns it on on CUDA only, where per-token launches dominate a step."""

    def __init__(self, policy, static: bool | None = None) -> None:
        self.policy = policy
        self.decoder = KVDecoder(policy_model(policy))
        self.static = self.decoder.device.type == "cuda" if static is None else static
        self.kept: dict[tuple, list[_Piece]] = {}   # adapter key -> the last call's pieces of that adapter
        self.reused_tokens = 0      # prompt tokens taken from a kept cache instead of prefilled
        self.prefilled_tokens = 0   # prompt tokens run through a prefill

    def forget(self) -> None:
        self.kept = {}

    def sample(self, prompts: list[list[int]], adapter: str | None, *, seed: int, **kw) -> list[Sampled]:
        """One branch's batch: :meth:`sample_rows` with every row under ``adapter``, one seed."""
        return self.sample_rows(prompts, [adapter] * len(prompts), seeds=[(len(prompts), seed)], **kw)

    @torch.inference_mode()
    def sample_rows(self, prompts: list[list[int]], adapters: list[str | None], *, seeds: list[tuple[int, int]],
                    max_new_tokens: int, temperature: float | Sequence[float], top_k: int, top_p: float, eos: set[int],
                    pad: int, stop_check=None, guide=None) -> list[Sampled]:
        """``prompts[i]`` continued under ``adapters[i]``: several branches' rows decode in one batch
        (one base matmul per projection, each branch's LoRA paths on its own rows). ``seeds``: (rows,
        seed) segments in row order; each draws its uniforms from its own generator, so a segment
        samples the tokens it would sample alone (up to float summation order in the larger batch).
        ``temperature``: one for every row, or one per row (all > 0, or all 0: greedy); a population's
        temperature child then shares its siblings' batch (each row's scores divided by its own, as
        ``TemperatureLogitsWarper`` divides them: the same tokens up to float rounding).
        ``stop_check(ids) -> bool``: whether a row's tokens so far contain a stop string.
        ``guide``: a :class:`~evotrainer.policy.guided_decoding.GuidedRows` over the output rows; a
        guided row draws from its grammar's tokens and records the unguided log-probability."""
        if sum(n for n, _ in seeds) != len(prompts) or len(adapters) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts need as many adapters ({len(adapters)}) and seeded rows "
                             f"({sum(n for n, _ in seeds)})")
        dev = self.decoder.device
        names = list(dict.fromkeys(adapters))
        keys = {name: adapter_key(self.policy, name) for name in names}
        self.kept = {k: v for k, v in self.kept.items() if k in keys.values()}   # stale or unused: released
        if len(names) == 1:
            lora = lora_deltas(policy_model(self.policy), names[0])
            cache, logits = self._prefill(prompts, lora, keys[names[0]], max_new_tokens)
        else:
            cache, logits, lora = self._prefill_branches(prompts, adapters, names, keys, max_new_tokens)
        B = len(prompts)
        gens = [(n, torch.Generator(device=dev).manual_seed(seed)) for n, seed in seeds]
        temps = [float(t) for t in temperature] if isinstance(temperature, Sequence) else [float(temperature)] * B
        if len(temps) != B or (any(t > 0 for t in temps) and not all(t > 0 for t in temps)):
            raise ValueError(f"{len(temps)} temperatures for {B} rows: give one, or one per row, all > 0 or all 0")
        temperature = temps[0]
        per_row = torch.tensor(temps, device=dev)[:, None] if len(set(temps)) > 1 else None
        warpers = []
        if temperature > 0:
            if per_row is not None:   # indexed by the live rows: finished rows leave the batch
                warpers.append(lambda _, s: s / per_row[rows])
            elif temperature != 1.0:
                warpers.append(TemperatureLogitsWarper(float(temperature)))
            if top_k:
                warpers.append(TopKLogitsWarper(top_k))
            if top_p < 1.0:
                warpers.append(TopPLogitsWarper(top_p))
        out = [Sampled([], []) for _ in range(B)]
        held = [list(p) for p in prompts]     # tokens in each output row's cache row
        rows = list(range(B))                 # cache row -> output row
        alive = [True] * B                    # per cache row: still sampling
        stash: list[_Piece] = []              # rows that finished and left the batch
        guided = guide is not None and guide.any
        forward = decode_step(self.decoder, cache, lora, self.static, max_new_tokens)
        for step in range(max_new_tokens):
            scores = logits
            for w in warpers:
                scores = w(None, scores)
            # A guided row draws from its grammar's tokens (masked before the warpers, so top-k/top-p
            # keep allowed ones); every row records log p under the unguided scores (guided_decoding.py).
            draw = scores
            if guided:
                draw = guide.mask_(logits, rows)
                for w in warpers:
                    draw = w(None, draw)
            # log p(token) = score - logsumexp(scores), taken for the chosen tokens only; the CDF is the
            # cumulative sum of exp(score - max), whose last entry is the normaliser.
            top = scores.max(dim=-1, keepdim=True).values
            if temperature > 0:
                dtop = draw.max(dim=-1, keepdim=True).values if guided else top
                cdf = torch.exp(draw - dtop).cumsum_(-1)
                # Inverse CDF: the first token whose cumulative mass exceeds u; the uniform is drawn for
                # every batch row, so a row's draw does not depend on which rows finished.
                u = torch.cat([torch.rand((n, 1), generator=g, device=dev) for n, g in gens])[rows]
                nxt = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=cdf.shape[-1] - 1)
                total = torch.exp(scores - top).sum(-1, keepdim=True) if guided else cdf[:, -1:]
            else:
                nxt = draw.argmax(-1, keepdim=True)
                total = torch.exp(scores - top).sum(-1, keepdim=True)
            chosen = (scores.gather(1, nxt) - top - total.log()).squeeze(1)
            if guided:
                chosen = chosen.clamp(min=LOGPROB_FLOOR)
            chosen = chosen.tolist()
            tokens = nxt.squeeze(1).tolist()
            for j, i in enumerate(rows):
                if alive[j]:
                    out[i].ids.append(tokens[j])
                    out[i].logprobs.append(chosen[j])
                    if guided:
                        guide.consume(i, tokens[j])
                    alive[j] = not (tokens[j] in eos or (stop_check is not None and stop_check(out[i].ids)))
            if step == max_new_tokens - 1 or not any(alive):
                break
            # A quarter finished: shrink the batch (a static one keeps its shape; its finished rows feed padding).
            if not self.static and len(rows) - sum(alive) >= max(2, len(rows) // 4):
                done = [j for j, a in enumerate(alive) if not a]
                stash.append(_Piece(cache.select(torch.tensor(done, device=dev), cache.length),
                                    [tuple(held[rows[j]]) for j in done], [rows[j] for j in done]))
                keep = [j for j, a in enumerate(alive) if a]
                cache = cache.select(torch.tensor(keep, device=dev), cache.capacity)
                if isinstance(lora, RowLora):
                    lora = lora.select(torch.tensor(keep, device=dev))
                rows, tokens, alive = [rows[j] for j in keep], [tokens[j] for j in keep], [True] * len(keep)
                forward = decode_step(self.decoder, cache, lora, self.static, max_new_tokens - step)
            for j, i in enumerate(rows):
                if alive[j]:
                    held[i].append(tokens[j])
            feed = torch.tensor([t if a else pad for t, a in zip(tokens, alive)], device=dev)[:, None]
            logits = forward(feed, torch.tensor(alive, device=dev)[:, None])
        # Kept for the next call, each branch's rows under its own key (its next turn continues them).
        pieces = stash + [_Piece(cache, [tuple(held[i]) for i in rows], list(rows))]
        if len(names) == 1:
            self.kept = {keys[names[0]]: pieces}
        else:
            self.kept = {}
            for name in names:
                mine = [piece.of(r) for piece in pieces
                        if (r := [j for j, o in enumerate(piece.outs) if adapters[o] == name])]
                self.kept[keys[name]] = mine
        return out

    def _prefill_branches(self, prompts: list[list[int]], adapters: list[str | None], names: list[str | None],
                          keys: dict, max_new_tokens: int) -> tuple[KVCache, torch.Tensor, RowLora]:
        """Each branch's prompts prefilled under its own adapter (their shared prompts once each, a
        continued sequence from that branch's kept row), stacked back into row order, and the per-row
        adapters for the decode."""
        dev = self.decoder.device
        model = policy_model(self.policy)
        loras = [lora_deltas(model, name) for name in names]
        parts, order = [], []
        for name, lora in zip(names, loras):
            rows = [i for i, a in enumerate(adapters) if a == name]
            parts.append(self._prefill([prompts[i] for i in rows], lora, keys[name], max_new_tokens))
            order += rows
        capacity = max(c.length for c, _ in parts) + max_new_tokens
        back = torch.empty(len(order), dtype=torch.long, device=dev)
        back[torch.tensor(order, device=dev)] = torch.arange(len(order), device=dev)
        logits = torch.cat([lg for _, lg in parts]).index_select(0, back)
        cache = KVCache.concat([(c, torch.arange(c.k[0].shape[0], device=dev)) for c, _ in parts], capacity)
        del parts   # each branch's cache is in the stacked one now: one copy less at the peak
        if order != sorted(order):   # branches' rows interleaved: restore row order (a copy; else none)
            cache = cache.select(back, capacity)
        group = torch.tensor([names.index(a) for a in adapters], device=dev)
        return cache, logits, RowLora(group, loras)

    # ---- prefill --------------------------------------------------------------------------------
    def _prefill(self, prompts: list[list[int]], lora, key: tuple, max_new_tokens: int) -> tuple[KVCache, torch.Tensor]:
        """The cache after each prompt and the logits after its last token. A prompt starts from the
        kept row that is its longest strict prefix, when every prompt has one."""
        dev = self.decoder.device
        starts = self._kept_rows(prompts, key)
        pieces = self.kept.get(key, []) if starts is not None else []
        self.kept.pop(key, None)    # the rows it needs are copied below; release the rest of this key's
        cut = [len(pieces[p].rows[r]) for p, r in starts] if starts is not None else [0] * len(prompts)
        starts = starts or [(-1, -1)] * len(prompts)
        unique: dict[tuple, int] = {}
        row_of = [unique.setdefault((s, tuple(p[c:])), len(unique)) for s, p, c in zip(starts, prompts, cut)]
        keys = list(unique)
        width = max(len(new) for _, new in keys)
        if pieces:
            used = [pieces[p] for (p, _), _ in keys]
            capacity = max(piece.cache.length for piece in used) + width + max_new_tokens
            cache = KVCache.concat([(piece.cache, torch.tensor([r], device=dev))
                                    for piece, ((_, r), _) in zip(used, keys)], capacity)
            del pieces, used   # the kept rows are copied: free them before the new tokens' pass
        else:
            capacity = width + max_new_tokens
            cache = self.decoder.new_cache(len(keys), capacity)
            shared = _common_prefix([new for _, new in keys]) if len(keys) > 1 else 0
            if shared >= MIN_SHARED_PREFIX:
                head = self.decoder.new_cache(1, capacity)
                self.decoder.forward(head, torch.tensor([keys[0][1][:shared]], device=dev),
                                     torch.ones(1, shared, dtype=torch.bool, device=dev), lora)
                cache = head.select(torch.zeros(len(keys), dtype=torch.long, device=dev), capacity)
                keys = [(s, new[shared:]) for s, new in keys]
                width -= shared
                self.prefilled_tokens += shared
        ids = torch.tensor([[0] * (width - len(new)) + list(new) for _, new in keys], device=dev)
        valid = torch.tensor([[False] * (width - len(new)) + [True] * len(new) for _, new in keys], device=dev)
        logits = self.decoder.forward(cache, ids, valid, lora)
        self.prefilled_tokens += sum(len(new) for _, new in keys)
        self.reused_tokens += sum(cut)
        if row_of != list(range(len(keys))):
            index = torch.tensor(row_of, device=dev)
            cache, logits = cache.select(index, capacity), logits.index_select(0, index)
        return cache, logits

    def _kept_rows(self, prompts: list[list[int]], key: tuple) -> list[tuple[int, int]] | None:
        """For each prompt, the (piece, row) of the kept row whose tokens are its longest strict
        prefix; None unless every prompt has one (a batch continues together or starts afresh)."""
        if key not in self.kept:
            return None
        found = []
        for p in prompts:
            best, best_len = None, 0
            for pi, piece in enumerate(self.kept[key]):
                for r, held in enumerate(piece.rows):
                    n = len(held)
                    if best_len < n < len(p) and tuple(p[:n]) == held:
                        best, best_len = (pi, r), n
            if best is None:
                return None
            found.append(best)
        return found
