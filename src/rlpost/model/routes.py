"""The routes to the hidden states: what a model outputs at the T positions that predict the
completion tokens, by one of four routes (``completion_states`` picks, per batch):

  full           prompt and completion in one forward per row (``full``)
  shared prefix  each distinct prompt once, its KV cache repeated for its group's rows (``shared_prefix``)
  given prefix   the prompts already run for the whole mini-batch (``Prefix``, ``prompt_prefix``)
  packed trunk   rlpost's own trunk over the fed tokens only (``packed_states``, model/packed.py)

The first three run transformers' forward: the *ForCausalLM for its logits (``causal_lm``) or its
decoder for final hidden states (``backbone``). Position ids are rebuilt from the attention mask
exactly as `generate` builds them for left-padded prompts; without that the trainer would see
shifted positions and its log-probs would not match the sampler's.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers.modeling_outputs import BaseModelOutputWithPast

from rlpost.model import packed
from rlpost.model.chunked import plain_head
from rlpost.types.batch import Rollouts


def position_ids(attention_mask: Tensor) -> Tensor:  # (B, L) int64
    pos = attention_mask.long().cumsum(-1) - 1  # first real token at 0
    return pos.clamp(min=0)  # left pads get 0; they are masked out of attention anyway



def trunk(model: torch.nn.Module, chunked: bool = True, value_head: torch.nn.Module | None = None):
    """(module, run) that ``policy_forward`` runs: the decoder for final hidden states (the chunked
    head, or a value head reading them), else the *ForCausalLM for its logits."""
    if (chunked and plain_head(model)) or value_head is not None:
        return model.get_decoder(), backbone
    return model, causal_lm


# (B, T, D)
def completion_states(module, batch: Rollouts, share_prefix: bool, run, prefix: Prefix | None = None) -> Tensor:
    """What ``module`` outputs at the T positions that predict the completion tokens: logits
    (a *ForCausalLM, run=causal_lm) or final hidden states (its decoder, run=backbone).
    prefix: the rows' prompts, already run (``Prefix.take``)."""
    trunk = packed.trunk_of(module)
    if trunk is not None and run is backbone:  # the packed trunk gives final hidden states (model/packed.py)
        return packed_states(trunk, batch, share_prefix, prefix)
    if prefix is not None:
        return given_prefix(module, batch, prefix.states, prefix.cache, run)
    groups = shared_groups(module, batch) if share_prefix else None
    if groups is not None:
        return shared_prefix(module, batch, *groups, run)
    return full(module, batch, run)


# transformers 5.24 renamed the KV cache's argument and output field from ``past_key_values`` to
# ``cache``; the old name warns on every run and goes in 5.40, and ``transformers>=5.0,<6`` admits
# both sides of the rename. The output classes say which side this install is on.
CACHE_KW = "cache" if "cache" in getattr(BaseModelOutputWithPast, "__dataclass_fields__", {}) else "past_key_values"


def causal_lm(model, keep: int, **kw):
    """(logits of the last `keep` positions, cache). logits_to_keep skips the lm_head (a
    576 x 49152 matmul per token) on positions we do not score."""
    out = model(logits_to_keep=keep, **kw)
    return out.logits, getattr(out, CACHE_KW)


def backbone(decoder, keep: int, **kw):
    """(final hidden states of the last `keep` positions (0 = all), cache)."""
    out = decoder(**kw)
    h = out.last_hidden_state
    return (h[:, -keep:] if keep else h), getattr(out, CACHE_KW)


def checkpointing(model) -> bool:
    """Whether activation (gradient) checkpointing is on; transformers v5 renamed the flag."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


def prompt_groups(batch: Rollouts) -> tuple[Tensor | None, Tensor | None]:
    """(first row of each run of identical prompts (G,), row -> run index (B,)), or (None, None)."""
    _, row_to_group, counts = torch.unique_consecutive(batch.group_ids, return_inverse=True, return_counts=True)
    first = torch.cumsum(counts, 0) - counts  # (G,)
    same = torch.equal(batch.prompt_ids, batch.prompt_ids[first][row_to_group])
    return (first, row_to_group) if same else (None, None)


def shared_groups(module, batch: Rollouts) -> tuple[Tensor, Tensor] | None:
    """``prompt_groups`` where the prompt prefix can be shared: some prompt repeats, and activation
    checkpointing is off (transformers turns the KV cache off under it); else None."""
    first, row_to_group = prompt_groups(batch)
    if first is None or len(first) == len(batch) or checkpointing(module):
        return None
    return first, row_to_group


def run_prompts(module, batch: Rollouts, first: Tensor, run):
    """Each distinct prompt (rows ``first``) once: (its last position's output (G, 1, D), which
    predicts completion token 0, and the prompts' KV cache)."""
    p_ids, p_mask = batch.prompt_ids[first], batch.prompt_mask[first]  # (G, P) each
    return run(module, 1, input_ids=p_ids, attention_mask=p_mask.long(), position_ids=position_ids(p_mask),
               use_cache=True)


def full(module, batch: Rollouts, run) -> Tensor:  # (B, T, D)
    T = batch.completion_ids.shape[1]
    ids, attn = batch.input_ids(), batch.attention_mask()  # (B, P+T) each
    # Position P-1+t predicts completion token t: the last T+1 positions, minus the very last.
    states, _ = run(module, T + 1, input_ids=ids, attention_mask=attn, position_ids=position_ids(attn), use_cache=False)
    return states[:, :-1, :]


def shared_prefix(module, batch: Rollouts, first: Tensor, row_to_group: Tensor, run) -> Tensor:  # (B, T, D)
    first_states, cache = run_prompts(module, batch, first, run)  # 1. each distinct prompt once
    cache.batch_select_indices(row_to_group)  # (G, ...) -> (B, ...) rows; differentiable indexing
    return given_prefix(module, batch, first_states[row_to_group], cache, run)  # (B, 1, D) first states


def given_prefix(module, batch: Rollouts, first_states: Tensor, cache, run) -> Tensor:  # (B, T, D)
    """The completions run on top of their rows' prompt cache (B rows, P columns); first_states
    (B, 1, D) is the last prompt position's output, which predicts completion token 0."""
    T = batch.completion_ids.shape[1]
    if T == 1:
        return first_states
    # 2. The completions (all but the last token, which predicts nothing we score) on top of it.
    attn = batch.attention_mask()[:, :-1]  # (B, P+T-1)
    pos = position_ids(attn)[:, -(T - 1):]  # (B, T-1): positions continue after each prompt
    states, _ = run(module, 0, input_ids=batch.completion_ids[:, :-1], attention_mask=attn, position_ids=pos,
                    use_cache=True, **{CACHE_KW: cache})
    return torch.cat([first_states, states], dim=1)  # (B, T, D)


@dataclass
class Prefix:
    """The distinct prompts of a mini-batch, run once with grad (``prompt_prefix``): their outputs
    and KV cache as detached leaves, which the micro-batches index into (``take``) and whose
    gradients ``backward`` sends through the prompt forward once, after the last micro-batch."""
    states: Tensor  # (G, 1, D) leaf: each prompt's last position's output
    cache: object  # the prompts' KV cache (G rows, P columns), each layer's keys and values leaves
    group: Tensor  # (B,) row of the mini-batch -> its prompt's index
    outputs: list[Tensor]  # the prompt forward's own tensors, in the order of ``leaves``
    leaves: list[Tensor]

    def take(self, idx: Tensor, prompt_cols: int) -> Prefix:
        """The prompts of mini-batch rows ``idx`` (B,), as a micro-batch trimmed to its last
        ``prompt_cols`` prompt columns (left padding: the columns dropped are padding for every row
        of it) sees them. The copy's cache is a fresh object over indexed leaves: a forward appends
        the completions' keys to it, never to the shared one."""
        rows = self.group[idx]  # (b,)
        cache = copy.copy(self.cache)
        cache.layers = [copy.copy(layer) for layer in self.cache.layers]
        for layer in cache.layers:
            layer.keys = layer.keys[rows, :, -prompt_cols:]  # (b, kv heads, P', head dim)
            layer.values = layer.values[rows, :, -prompt_cols:]
        return Prefix(self.states[rows], cache, rows, [], [])

    def backward(self) -> None:
        """The prompt forward's backward, with the gradients the micro-batches left on the leaves."""
        pairs = [(out, leaf.grad) for out, leaf in zip(self.outputs, self.leaves) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        self.outputs, self.leaves = [], []  # free the prompt forward's graph


def prompt_prefix(model: torch.nn.Module, batch: Rollouts, chunked: bool = True,
                  value_head: torch.nn.Module | None = None) -> Prefix | None:
    """Every distinct prompt of ``batch`` run once, for ``policy_forward(..., prefix=p.take(...))``
    on its rows in any grouping; None where ``completion_states`` would not share prefixes (no
    repeated prompts, or activation checkpointing, which turns the KV cache off)."""
    module, run = trunk(model, chunked, value_head)
    packed_trunk = packed.trunk_of(module)
    if packed_trunk is not None and run is backbone:
        return packed_prompts(packed_trunk, batch, True, leaves=True)
    groups = shared_groups(module, batch)
    if groups is None:
        return None
    first, row_to_group = groups
    states, cache = run_prompts(module, batch, first, run)
    outputs, leaves = [states], [states.detach().requires_grad_(states.requires_grad)]
    for layer in cache.layers:
        for name in ("keys", "values"):
            out = getattr(layer, name)  # (G, kv heads, P, head dim)
            leaf = out.detach().requires_grad_(out.requires_grad)
            setattr(layer, name, leaf)
            outputs.append(out)
            leaves.append(leaf)
    return Prefix(leaves[0], cache, row_to_group, outputs, leaves)


def _matmul_dtype(weight: Tensor) -> torch.dtype:
    """What the forward's matmuls run in: autocast's dtype where it is on, else the weights' own."""
    dev = weight.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else weight.dtype


def packed_prompts(trunk: packed.PackedTrunk, batch: Rollouts, share_prefix: bool,
                    leaves: bool) -> packed.PackedPrefix:
    """Each distinct prompt of ``batch`` once on the packed trunk (every row's own without
    share_prefix, or where a group's rows do not share one); ``leaves``: for ``Prefix``'s use."""
    first, row_to_group = prompt_groups(batch) if share_prefix else (None, None)
    if first is None:
        first = row_to_group = torch.arange(len(batch), device=batch.device)
    ids, mask = batch.prompt_ids[first], batch.prompt_mask[first]  # (G, P) each
    dtype = _matmul_dtype(trunk.decoder.embed_tokens.weight)
    with torch.autocast(batch.device.type, enabled=False):  # the trunk casts for itself
        prefix = trunk.prompts(ids, mask, position_ids(mask), dtype, leaves)
    prefix.group = row_to_group
    return prefix


def packed_states(trunk: packed.PackedTrunk, batch: Rollouts, share_prefix: bool,
                   prefix: packed.PackedPrefix | None) -> Tensor:  # (B, T, H)
    """``completion_states`` on the packed trunk; prefix: the rows' prompts already run (taken)."""
    if prefix is None:
        prefix = packed_prompts(trunk, batch, share_prefix, leaves=False).take(
            torch.arange(len(batch), device=batch.device), batch.prompt_ids.shape[1])
    dtype = _matmul_dtype(trunk.decoder.embed_tokens.weight)
    with torch.autocast(batch.device.type, enabled=False):
        return trunk.completions(batch.completion_ids, batch.completion_mask, batch.prompt_mask, prefix, dtype)

