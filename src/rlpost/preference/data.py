"""Supervised and preference data: reading rows, and turning them into the same ``Rollouts``
batch the RL trainer consumes.

Row formats (JSONL, parquet, or a ``datasets.save_to_disk`` folder):
  SFT         {"prompt": str | messages, "completion": str}   or   {"messages": [..., assistant]}
  preference  {"prompt": str | messages, "chosen": str, "rejected": str}
A completion is encoded the way the sampler produces one: its text tokens, then EOS, after the
chat-templated prompt (``add_generation_prompt=True``). So SFT, DPO and RL all see the same
token layout, and a preference pair is simply a group of two rows sharing one prompt: the
shared-prefix forward (logprobs.py) runs the prompt once for both.

A malformed row raises ``DataError`` naming the file and line (or is skipped with a count, when
the caller passes ``on_error='skip'``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rlpost.batch import Rollouts
from rlpost.data import DataError, _where, check_rows, read_rows  # noqa: F401 - re-exported


def prompt_messages(row: dict, source: str) -> list[dict]:
    p = row.get("prompt")
    if isinstance(p, str):
        return [{"role": "user", "content": p}]
    if isinstance(p, list) and p and all(isinstance(m, dict) and "role" in m and "content" in m for m in p):
        return p
    raise DataError(f"{_where(row, source)}: 'prompt' must be a string or a list of chat messages")


def sft_pair(row: dict, source: str) -> tuple[list[dict], str]:
    """(prompt messages, completion text) of an SFT row."""
    if "messages" in row:
        msgs = row["messages"]
        if not (isinstance(msgs, list) and msgs and msgs[-1].get("role") == "assistant"):
            raise DataError(f"{_where(row, source)}: 'messages' must end with an assistant message")
        return msgs[:-1], str(msgs[-1]["content"])
    if not isinstance(row.get("completion"), str):
        raise DataError(f"{_where(row, source)}: expected 'completion' (a string) or 'messages'")
    return prompt_messages(row, source), row["completion"]


def preference_triple(row: dict, source: str) -> tuple[list[dict], str, str]:
    for key in ("chosen", "rejected"):
        if not isinstance(row.get(key), str):
            raise DataError(f"{_where(row, source)}: expected '{key}' (a string)")
    return prompt_messages(row, source), row["chosen"], row["rejected"]


def encode(tokenizer, prompts: list[list[dict]], completions: list[str], group_ids: list[int],
           max_len: int = 256) -> Rollouts:
    """A Rollouts batch for teacher-forced completions (no sampler: sampler_logp is 0)."""
    p_ids = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True) for m in prompts]
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
        rows=[{"messages": m} for m in prompts], completions=list(completions),
    )


def encode_sft(tokenizer, rows: list[dict], max_len: int = 256) -> Rollouts:
    pairs = [sft_pair(r, "data") for r in rows]
    return encode(tokenizer, [p for p, _ in pairs], [c for _, c in pairs], list(range(len(rows))), max_len)


def encode_pairs(tokenizer, rows: list[dict], max_len: int = 256) -> Rollouts:
    """Rows 2i (chosen) and 2i+1 (rejected) form group i."""
    prompts, completions, groups = [], [], []
    for i, r in enumerate(rows):
        m, chosen, rejected = preference_triple(r, "data")
        prompts += [m, m]
        completions += [chosen, rejected]
        groups += [i, i]
    return encode(tokenizer, prompts, completions, groups, max_len)
