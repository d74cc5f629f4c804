"""Teacher-forced rows into the same ``Rollouts`` batch the RL trainer consumes: SFT rows,
preference pairs, and token-id pairs (the process reward model's examples).

A completion is encoded the way the sampler produces one: its text tokens, then EOS, after the
chat-templated prompt (``add_generation_prompt=True``). So SFT, DPO and RL all see the same
token layout, and a preference pair is simply a group of two rows sharing one prompt: the
shared-prefix forward (logprobs.py) runs the prompt once for both. The row formats and their
checks are in ``envs/data.py``.
"""

from __future__ import annotations

import torch

from rlpost.envs.data import preference_triple, sft_pair, standard_prompt
from rlpost.types.batch import Rollouts


def encode(tokenizer, prompts: list[list[dict] | str], completions: list[str], group_ids: list[int],
           max_len: int = 256) -> Rollouts:
    """A Rollouts batch for teacher-forced completions (no sampler: sampler_logp is 0). A prompt given as
    text (pref.prompt_format=raw) is tokenized as it is, as the sampler feeds task.prompt_format=raw."""
    p_ids = [tokenizer.encode(m, add_special_tokens=False) if isinstance(m, str) else
             tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True) for m in prompts]
    p_ids = [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in p_ids]
    eos = tokenizer.eos_token_id
    c_ids = [tokenizer.encode(c, add_special_tokens=False)[: max_len - 1] + [eos] for c in completions]
    P, T = max(map(len, p_ids)), max(map(len, c_ids))
    pad = tokenizer.pad_token_id
    prompt = torch.tensor([[pad] * (P - len(p)) + p for p in p_ids])  # (B, P) left-padded
    completion = torch.tensor([c + [pad] * (T - len(c)) for c in c_ids])  # (B, T) right-padded
    c_mask = torch.tensor([[True] * len(c) + [False] * (T - len(c)) for c in c_ids])  # (B, T)
    B = len(c_ids)
    return Rollouts(
        prompt_ids=prompt, prompt_mask=torch.tensor([[False] * (P - len(p)) + [True] * len(p) for p in p_ids]),
        completion_ids=completion, completion_mask=c_mask, sampler_logp=torch.zeros(B, T),
        truncated=torch.zeros(B, dtype=torch.bool), group_ids=torch.tensor(group_ids),
        rows=[{"messages": [{"role": "user", "content": m}] if isinstance(m, str) else m} for m in prompts],
        completions=list(completions),
    )


def as_given(row: dict, messages: list[dict], raw: bool) -> list[dict] | str:
    """The prompt to encode: with ``raw`` (pref.prompt_format=raw) a standard-format row's text, else its messages."""
    text = standard_prompt(row) if raw else None
    return messages if text is None else text


def encode_sft(tokenizer, rows: list[dict], max_len: int = 256, raw: bool = False) -> Rollouts:
    pairs = [sft_pair(r, "data") for r in rows]
    return encode(tokenizer, [as_given(r, p, raw) for r, (p, _) in zip(rows, pairs)], [c for _, c in pairs],
                  list(range(len(rows))), max_len)


def encode_pairs(tokenizer, rows: list[dict], max_len: int = 256, raw: bool = False) -> Rollouts:
    """Rows 2i (chosen) and 2i+1 (rejected) form group i."""
    prompts, completions, groups = [], [], []
    for i, r in enumerate(rows):
        m, chosen, rejected = preference_triple(r, "data")
        m = as_given(r, m, raw)
        prompts += [m, m]
        completions += [chosen, rejected]
        groups += [i, i]
    return encode(tokenizer, prompts, completions, groups, max_len)


def unpadded(batch: Rollouts) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, completion ids up to and incl. EOS) of each row, without padding."""
    prompts = [p[m].tolist() for p, m in zip(batch.prompt_ids, batch.prompt_mask)]
    return prompts, [c[m].tolist() for c, m in zip(batch.completion_ids, batch.completion_mask)]


def make_batch(prompts: list[list[int]], completions: list[list[int]], pad_id: int,
               positions: list[list[int]] | None = None, targets: list[list[float]] | None = None) -> Rollouts:
    """A ``Rollouts`` for the head: prompts left-padded, completions right-padded. completion_mask is
    True on ``positions`` when given (the labelled tokens), else on every completion token; returns
    holds the targets (0 elsewhere). Consecutive rows with the same prompt share a group id, so the
    forward runs that prompt once (logprobs.py, shared prefix)."""
    B, P, T = len(prompts), max(map(len, prompts)), max(1, max(map(len, completions)))
    prompt_ids = torch.full((B, P), pad_id)  # (B, P)
    prompt_mask = torch.zeros(B, P, dtype=torch.bool)  # (B, P)
    completion_ids = torch.full((B, T), pad_id)  # (B, T)
    mask = torch.zeros(B, T, dtype=torch.bool)  # (B, T)
    returns = torch.zeros(B, T)  # (B, T) float32
    group, groups = -1, []
    for i, (p, c) in enumerate(zip(prompts, completions)):
        prompt_ids[i, P - len(p):], prompt_mask[i, P - len(p):] = torch.tensor(p), True
        completion_ids[i, :len(c)] = torch.tensor(c, dtype=torch.long)
        where = positions[i] if positions is not None else list(range(len(c)))
        mask[i, where] = True
        if targets is not None:
            returns[i, positions[i]] = torch.tensor(targets[i], dtype=torch.float32)
        group += int(i == 0 or p != prompts[i - 1])
        groups.append(group)
    return Rollouts(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                    completion_mask=mask, sampler_logp=torch.zeros(B, T), truncated=torch.zeros(B, dtype=torch.bool),
                    group_ids=torch.tensor(groups), rows=[{} for _ in range(B)], completions=["" for _ in range(B)],
                    returns=returns if targets is not None else None)
