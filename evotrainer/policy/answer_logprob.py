"""The policy's log-probability of each task's reference answer, teacher-forced: a per-task score
that needs no sampling (one forward pass per task) and moves continuously with the policy.

``log π(reference completion | prompt)``, summed over the completion's tokens and its end-of-turn
token, under the branch's adapter, with the trainer's own forward (``policy/logps.py``: each distinct
prompt once). The reference completion is the domain's (``Domain.reference_completion``): for math
``Answer: <number>``, the form the prompt asks for.
"""

from __future__ import annotations

from typing import Sequence

import torch

from evotrainer.policy.logps import shared_prompt_logps
from evotrainer.policy.rollout_engine import chat_ids

Messages = list[dict[str, str]]


@torch.no_grad()
def answer_logprobs(policy, adapter: str | None, prompts: Sequence[Messages], completions: Sequence[str],
                    batch_size: int = 32) -> list[float]:
    """One summed log-probability per (prompt, completion) pair."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    tok = policy.tokenizer
    pad = tok.pad_token_id
    eos = tok.eos_token_id if isinstance(tok.eos_token_id, int) else list(tok.eos_token_id)[0]
    asked = chat_ids(tok, prompts)
    answers = [list(tok(c, add_special_tokens=False)["input_ids"]) + [eos] for c in completions]
    dev = policy.device
    out: list[float] = []
    with policy.adapter(adapter) as model:
        for start in range(0, len(asked), batch_size):
            ps, cs = asked[start:start + batch_size], answers[start:start + batch_size]
            distinct: dict[tuple[int, ...], int] = {}
            rows = [distinct.setdefault(tuple(p), len(distinct)) for p in ps]
            P, T = max(map(len, distinct)), max(map(len, cs))
            prompt_ids = torch.tensor([[pad] * (P - len(p)) + list(p) for p in distinct], device=dev)
            prompt_mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in distinct], device=dev)
            comp = torch.tensor([c + [pad] * (T - len(c)) for c in cs], device=dev)
            attn = torch.tensor([[1] * len(c) + [0] * (T - len(c)) for c in cs], device=dev)
            lp = shared_prompt_logps(model, prompt_ids, prompt_mask, torch.tensor(rows, device=dev), comp, attn)
            out.extend((lp * attn).sum(1).tolist())
    return out
