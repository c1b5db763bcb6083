"""Per-token log-probabilities of sampled completions under the current policy: the trainer's ``logps``.

Two ways to the same numbers. ``per_token_logps`` runs each row's prompt and completion through the
model as one sequence (TRL's way). ``shared_prompt_logps`` runs each distinct prompt once and the
completions on top of its cached keys and values: a GRPO group's n rows share one prompt, and the
prompt is most of a short completion's tokens (the quickstart's: ~50 prompt tokens, ~30 sampled), so
this skips about half of a step's forward and backward FLOPs. Gradients reach the prompt's LoRA
activations through the cached keys and values, summed over the group, as in the unshared pass.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, TopPLogitsWarper


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


def per_token_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                    temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """log π(token_t | tokens_<t) for the last ``logits_to_keep`` tokens of each row, under the
    sampler's distribution (see ``_sampler_logps``)."""
    # Only the completion positions need the 49k-vocab head: ask the model for those logits alone.
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep + 1).logits
    return _sampler_logps(logits[:, :-1], input_ids[:, -logits_to_keep:], temperature, top_p)


def shared_prompt_logps(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, rows: torch.Tensor,
                        completion_ids: torch.Tensor, completion_attention: torch.Tensor,
                        temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """What ``per_token_logps`` gives on ``[prompt_ids[rows] | completion_ids]``, with each of the U
    distinct prompts (U, P; left-padded) run once. ``rows`` (B,) maps each completion (B, T;
    right-padded, ``completion_attention`` 0 on padding) to its prompt. Positions count real tokens
    only (left padding takes none), as the sampler counts them."""
    T = completion_ids.shape[1]
    pos = (prompt_mask.long().cumsum(1) - 1).clamp(min=0)
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
