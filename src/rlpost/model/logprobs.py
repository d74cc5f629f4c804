"""Per-token log-probs of completions under a model: the one forward shared by the trainer,
the reference, and the trainer's re-computation of old log-probs.

``policy_forward`` is a route and a body. The route to the hidden states (model/routes.py) is one
of four: the full forward, the shared prompt prefix, a prefix given by the caller (the prompts run
once per mini-batch), or the packed trunk (model/packed.py). The body turns them into log-probs:
``ChunkedLogp`` (model/chunked.py) a chunk of completion tokens at a time where the head is a plain
linear layer, else the full (B, T, V) logits (``full_body``). What stays the same for every batch of
a role (temperature, shared prefix, body, value head) is its ``Scoring``; what changes per call
(the entropy asked for, the given prefix, where the head's gradient goes) are the other arguments.

The policy being trained is softmax(logits / temperature), the same distribution the sampler
drew from, so the temperature divides the logits here as it does in the sampler (TRL and verl
do the same). Position ids are rebuilt from the attention mask exactly as `generate` builds them
for left-padded prompts; without that the trainer would see shifted positions and its log-probs
would not match the sampler's.

Top-p. When the sampler drew from the top-p set (``Rollouts.sampler_floor``, its threshold), every
log-prob here is of the same truncated distribution: the tokens whose full-softmax log-prob is at
or above the threshold, plus the sampled token itself, renormalised ("keep sampling mask",
DeepSeek-V3.2). With the sampler's weights that is exactly the set it drew from (ties at the
threshold aside); as the policy moves it is the set the same threshold keeps, and the sampled token
always stays in it, so no log-prob is -inf.

Shared prefix. The K completions of a group share one prompt, and in the demo the prompt is
three quarters of every sequence. So the prompt runs once per group, its KV cache is repeated
for the group's K rows, and only the completions run per row. Gradients flow back through the
repeated cache into the single prompt forward, so the result is the same function of the
weights as the plain forward (tests/model/test_logprobs.py checks values and gradients), at about a
third of the tokens.

Prompts once per mini-batch. Within a micro-batch a group's rows are padded to its longest
completion; with the prompt run per micro-batch, micro-batches must keep groups whole, so short rows
carry their group's long one's padding. ``prompt_prefix`` runs every prompt of a mini-batch once,
with grad, and hands its KV cache to the micro-batches as detached leaves; micro-batches then take
rows sorted by their own length, across groups (``Prefix.take``). Each micro-batch's backward stops
at the leaves and adds into their ``.grad``; ``Prefix.backward`` then sends those sums through the
prompt forward once. The result is the same gradient (a sum over micro-batches either way).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.model import packed
from rlpost.model.chunked import (  # noqa: F401 (re-exported: the forward's pieces, where callers look for them)
    CHUNK_TOKENS,
    ChunkedLogp,
    HeadGrad,
    HeadSpec,
    _cast_cache,
    chunk_tokens,
    plain_head,
    truncated,
)
from rlpost.model.routes import (  # noqa: F401 (re-exported, as above)
    CACHE_KW,
    Prefix,
    backbone,
    causal_lm,
    checkpointing,
    completion_states,
    position_ids,
    prompt_groups,
    prompt_prefix,
    trunk,
)
from rlpost.types.batch import Rollouts

ENTROPY_MODES = ("none", "detached", "grad")  # policy_forward's entropy: not computed, a diagnostic, in the loss


@dataclass
class PolicyForward:
    logp: Tensor  # (B, T) float32, log pi(token); differentiable when grad is on
    entropy: Tensor | None  # (B, T) float32, entropy of pi at each position, or None when not asked
    values: Tensor | None  # (B, T) float32, V(state before token t) from a value head sharing the trunk


@dataclass(frozen=True)
class Scoring:
    """What a role's forward does the same way for every batch.

    temperature: the sampler's; the policy is softmax(logits / temperature).
    share_prefix: run each distinct prompt once within a micro-batch (the shared-prefix route).
    chunked: the ``ChunkedLogp`` body on the completion tokens only, where the model's head is a
    plain bias-free linear layer; False = the full (B, T, V) logits.
    value_head: PPO's critic on the policy's own trunk: the head reads the same final hidden states
    the logits come from, so policy and value cost one forward.
    step: trainer.compile's compiled step (model/compiled.py: Step) for the chunked head's passes, or None."""
    temperature: float
    share_prefix: bool = True
    chunked: bool = True
    value_head: torch.nn.Module | None = None
    step: object = None


def policy_forward(model: torch.nn.Module, batch: Rollouts, scoring: Scoring, entropy: str = "none",
                   prefix: Prefix | None = None, head_grad: HeadGrad | None = None) -> PolicyForward:
    """One forward of the policy over the completions: the route, then the body, then the value head.

    entropy: 'none', 'detached' (a diagnostic) or 'grad' (an entropy bonus in the loss).
    prefix: these rows' prompts already run (``Prefix.take``, the same ``scoring``).
    head_grad: where the chunked head's weight gradient goes instead of the backward's return
    (``HeadGrad``: the trainer forms it once per mini-batch)."""
    if entropy not in ENTROPY_MODES:
        raise ValueError(f"entropy={entropy!r}: expected one of {', '.join(ENTROPY_MODES)}")
    module, run = trunk(model, scoring.chunked, scoring.value_head)
    states = completion_states(module, batch, scoring.share_prefix, run, prefix)  # (B, T, H) or (B, T, V) logits
    if scoring.chunked and plain_head(model):
        logp, ent = chunked_body(model, states, batch, scoring, entropy, head_grad)
    else:
        logits = states if run is causal_lm else model.get_output_embeddings()(states)  # (B, T, V)
        logp, ent = full_body(logits, batch, scoring.temperature, entropy)
    values = scoring.value_head(states).squeeze(-1).float() if scoring.value_head is not None else None  # (B, T)
    return PolicyForward(logp, ent, values)


def chunked_body(model: torch.nn.Module, hidden: Tensor, batch: Rollouts, scoring: Scoring, entropy: str,
                 head_grad: HeadGrad | None) -> tuple[Tensor, Tensor | None]:
    """(logp (B, T), entropy (B, T) or None) from final hidden states through ``ChunkedLogp``, on the
    completion tokens only; 0 off the mask. scoring: its temperature, and its compiled step where it has one."""
    mask = batch.completion_mask
    head = model.get_output_embeddings().weight
    dev = hidden.device.type  # autocast is per device type: ask the one the forward ran on
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else head.dtype
    with_grad = entropy == "grad" and torch.is_grad_enabled()
    floor = batch.sampler_floor[mask] if batch.sampler_floor is not None else None
    # With head_grad, the head's gradient is not the backward's to return: autograd does not see the weight
    deferred = head_grad is not None and head.requires_grad and torch.is_grad_enabled()
    lp, ent = ChunkedLogp.apply(hidden[mask], head.detach() if deferred else head, batch.completion_ids[mask],
                                HeadSpec(scoring.temperature, dtype, entropy != "none", scoring.step), floor,
                                head_grad if deferred else None)
    logp = hidden.new_zeros(mask.shape, dtype=torch.float32).masked_scatter(mask, lp)  # (B, T), 0 off the mask
    if entropy == "none":
        return logp, None
    return logp, hidden.new_zeros(mask.shape, dtype=torch.float32).masked_scatter(mask, ent if with_grad
                                                                                  else ent.detach())


def full_body(logits: Tensor, batch: Rollouts, temperature: float, entropy: str) -> tuple[Tensor, Tensor | None]:
    """(logp (B, T), entropy (B, T) or None) from the full (B, T, V) logits, top-p truncated as the
    sampler drew (``truncated``)."""
    z = logits.float() / temperature  # (B, T, V)
    floor = batch.sampler_floor
    zk = truncated(z, z.logsumexp(-1) if floor is not None else None, floor, batch.completion_ids)  # (B, T, V)
    lse = zk.logsumexp(-1, keepdim=True)  # (B, T, 1)
    logp = z.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1) - lse.squeeze(-1)  # (B, T)
    if entropy == "none":
        return logp, None
    with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):
        return logp, -((zk - lse).exp() * (z - lse)).sum(-1)  # (B, T); p = 0 off the set, z stays finite


def completion_logprobs(
    model: torch.nn.Module, batch: Rollouts, temperature: float, with_entropy: bool = False,
    share_prefix: bool = True, chunked: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """(logp (B, T), entropy (B, T) without grad or None): the reference's and the tests' view."""
    out = policy_forward(model, batch, Scoring(temperature, share_prefix, chunked),
                         entropy="detached" if with_entropy else "none")
    return out.logp, out.entropy


def completion_values(decoder: torch.nn.Module, head: torch.nn.Module, batch: Rollouts,
                      share_prefix: bool = True) -> Tensor:
    """(B, T) float32 values from a separate critic: its own trunk (a decoder) and a scalar head."""
    hidden = completion_states(decoder, batch, share_prefix, backbone)  # (B, T, H)
    return head(hidden).squeeze(-1).float()


def clear_cast_cache() -> None:
    """Forget every cast of the weights: the head's (``chunked.cast_weight``) and the packed trunks' fused copies."""
    _cast_cache.clear()
    packed.clear_caches()
