"""Per-token log-probabilities of sampled completions under the current policy: the trainer's ``logps``.

Two ways to the same numbers. ``per_token_logps`` runs each row's prompt and completion through the
model as one sequence (TRL's way). ``shared_prompt_logps`` runs each distinct prompt once and the
completions on top of its cached keys and values: a GRPO group's n rows share one prompt, and the
prompt is most of a short completion's tokens (the quickstart's: ~50 prompt tokens, ~30 sampled), so
this skips about half of a step's forward and backward FLOPs. Gradients reach the prompt's LoRA
activations through the cached keys and values, summed over the group, as in the unshared pass.

Memory: the vocabulary head's fp32 logits over a batch's completion positions are B x T x V floats
(16 x 1024 x 151,936 for a Qwen2.5 step: ~10 GB, with a log-softmax copy as large kept for the
backward pass). Past ``LOGITS_BUDGET`` elements, the head runs on the decoder's last hidden states
a chunk of positions at a time under activation checkpointing: only the hidden states are kept,
and each chunk's logits are recomputed in the backward pass (one more head matmul). Below it, the
model's own forward computes them at once, as before: the quickstart's 16 x 32 x 49,152 stays fast.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache, TopPLogitsWarper

LOGITS_BUDGET = 2**27   # logits elements (512 MiB in fp32) computed at once; past it, chunks
# Architectures whose logits are the output head applied to the decoder's last hidden state, nothing
# after it (no soft-capping or scaling), so the chunked head computes what the model computes.
HEAD_ONLY = {"llama", "mistral", "qwen2", "qwen3"}


def _sampler_logps(logits: torch.Tensor, targets: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """log p(target) under the sampler's distribution: logits / temperature, then the same nucleus
    (top-p) filter the sampler applied, so the importance ratio against the stored sampler logprobs
    is 1 on the first pass."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    if top_p < 1.0:
        # The sampler's warper (transformers' TopPLogitsWarper), with a finite filter value: a token the
        # current policy moved out of the nucleus gets a ratio of ~0 and a finite gradient, not NaN.
        b, t, v = logits.shape
        logits = TopPLogitsWarper(top_p, filter_value=-1e4)(None, logits.reshape(b * t, v)).reshape(b, t, v)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def _chunked_head(model, positions: int):
    """(decoder, output head) when ``positions`` positions' logits would pass ``LOGITS_BUDGET`` and the
    architecture's logits are the head's output alone; else None (the model's own forward)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config
    if positions * int(config.vocab_size) <= LOGITS_BUDGET or getattr(config, "model_type", None) not in HEAD_ONLY:
        return None
    return base.get_decoder(), base.get_output_embeddings()


def _head_logps(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """``_sampler_logps(head(hidden), targets)`` a chunk of positions at a time, each chunk's logits
    recomputed in the backward pass instead of kept."""
    b, t, h = hidden.shape
    flat, goal = hidden.reshape(b * t, 1, h), targets.reshape(b * t, 1)
    step = max(1, LOGITS_BUDGET // int(head.weight.shape[0]))

    def chunk(x, y):
        return _sampler_logps(head(x), y, temperature, top_p)

    parts = [checkpoint(chunk, flat[i:i + step], goal[i:i + step], use_reentrant=False)
             for i in range(0, b * t, step)]
    return torch.cat(parts).reshape(b, t)


def per_token_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                    temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """log π(token_t | tokens_<t) for the last ``logits_to_keep`` tokens of each row, under the
    sampler's distribution (see ``_sampler_logps``)."""
    targets = input_ids[:, -logits_to_keep:]
    chunked = _chunked_head(model, input_ids.shape[0] * logits_to_keep)
    if chunked is not None:
        decoder, head = chunked
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return _head_logps(head, hidden[:, -logits_to_keep - 1:-1], targets, temperature, top_p)
    # Only the completion positions need the 49k-vocab head: ask the model for those logits alone.
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep + 1).logits
    return _sampler_logps(logits[:, :-1], targets, temperature, top_p)


def shared_prompt_logps(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, rows: torch.Tensor,
                        completion_ids: torch.Tensor, completion_attention: torch.Tensor,
                        temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """What ``per_token_logps`` gives on ``[prompt_ids[rows] | completion_ids]``, with each of the U
    distinct prompts (U, P; left-padded) run once. ``rows`` (B,) maps each completion (B, T;
    right-padded, ``completion_attention`` 0 on padding) to its prompt. Positions count real tokens
    only (left padding takes none), as the sampler counts them."""
    T = completion_ids.shape[1]
    pos = (prompt_mask.long().cumsum(1) - 1).clamp(min=0)
    chunked = _chunked_head(model, rows.shape[0] * T)
    if chunked is not None:
        return _shared_prompt_hidden_logps(chunked, prompt_ids, prompt_mask, pos, rows, completion_ids,
                                           completion_attention, temperature, top_p)
    head = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=pos, use_cache=True,
                 logits_to_keep=1)
    cache = DynamicCache(ddp_cache_data=[(layer.keys.index_select(0, rows), layer.values.index_select(0, rows))
                                         for layer in head.past_key_values.layers])
    attention = torch.cat([prompt_mask.index_select(0, rows), completion_attention], 1)
    cpos = prompt_mask.long().sum(1).index_select(0, rows)[:, None] + torch.arange(T, device=rows.device)[None]
    tail = model(input_ids=completion_ids, attention_mask=attention, position_ids=cpos, past_key_values=cache,
                 use_cache=False, logits_to_keep=T).logits
    # The first completion token is predicted from the prompt's last position; the others from the
    # completion positions before them.
    logits = torch.cat([head.logits[:, -1:].index_select(0, rows), tail[:, :-1]], 1)
    return _sampler_logps(logits, completion_ids, temperature, top_p)


def _shared_prompt_hidden_logps(chunked, prompt_ids, prompt_mask, pos, rows, completion_ids, completion_attention,
                                temperature: float, top_p: float) -> torch.Tensor:
    """``shared_prompt_logps`` on the decoder's hidden states, the head chunked (``_head_logps``)."""
    decoder, head = chunked
    T = completion_ids.shape[1]
    first = decoder(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=pos, use_cache=True)
    cache = DynamicCache(ddp_cache_data=[(layer.keys.index_select(0, rows), layer.values.index_select(0, rows))
                                         for layer in first.past_key_values.layers])
    attention = torch.cat([prompt_mask.index_select(0, rows), completion_attention], 1)
    cpos = prompt_mask.long().sum(1).index_select(0, rows)[:, None] + torch.arange(T, device=rows.device)[None]
    tail = decoder(input_ids=completion_ids, attention_mask=attention, position_ids=cpos, past_key_values=cache,
                   use_cache=False).last_hidden_state
    hidden = torch.cat([first.last_hidden_state[:, -1:].index_select(0, rows), tail[:, :-1]], 1)
    return _head_logps(head, hidden, completion_ids, temperature, top_p)
