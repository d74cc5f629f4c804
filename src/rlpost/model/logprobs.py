"""Per-token log-probs of completions under a model: the one forward shared by the trainer,
the reference, and the trainer's re-computation of old log-probs.

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

import copy
import weakref
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers.modeling_outputs import BaseModelOutputWithPast

from rlpost.model import budgets, packed
from rlpost.types.batch import Rollouts


def position_ids(attention_mask: Tensor) -> Tensor:  # (B, L) int64
    pos = attention_mask.long().cumsum(-1) - 1  # first real token at 0
    return pos.clamp(min=0)  # left pads get 0; they are masked out of attention anyway


ENTROPY_MODES = ("none", "detached", "grad")  # policy_forward's entropy: not computed, a diagnostic, in the loss


@dataclass
class PolicyForward:
    logp: Tensor  # (B, T) float32, log pi(token); differentiable when grad is on
    entropy: Tensor | None  # (B, T) float32, entropy of pi at each position, or None when not asked
    values: Tensor | None  # (B, T) float32, V(state before token t) from a value head sharing the trunk


def policy_forward(
    model: torch.nn.Module, batch: Rollouts, temperature: float, *, entropy: str = "none",
    share_prefix: bool = True, value_head: torch.nn.Module | None = None, chunked: bool = True,
    prefix: "Prefix | None" = None, head_grad: "HeadGrad | None" = None,
) -> PolicyForward:
    """One forward of the policy over the completions.

    entropy: 'none', 'detached' (a diagnostic) or 'grad' (an entropy bonus in the loss).
    value_head: PPO's critic on the policy's own trunk: the head reads the same final hidden
    states the logits come from, so policy and value cost one forward.
    chunked: the lm_head and log-softmax run through ``ChunkedLogp`` on the completion tokens only
    (where the model's head is a plain bias-free linear layer); False = full (B, T, V) logits.
    prefix: these rows' prompts already run (``Prefix.take``, the same ``chunked``/``value_head``).
    head_grad: where the chunked head's weight gradient goes instead of the backward's return
    (``HeadGrad``: the trainer forms it once per mini-batch)."""
    if entropy not in ENTROPY_MODES:
        raise ValueError(f"entropy={entropy!r}: expected one of {', '.join(ENTROPY_MODES)}")
    mask = batch.completion_mask
    module, run = trunk(model, chunked, value_head)
    if chunked and plain_head(model):
        hidden = completion_states(module, batch, share_prefix, run, prefix)  # (B, T, H)
        head = model.get_output_embeddings().weight
        dev = hidden.device.type  # autocast is per device type: ask the one the forward ran on
        dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else head.dtype
        with_grad = entropy == "grad" and torch.is_grad_enabled()
        floor = batch.sampler_floor[mask] if batch.sampler_floor is not None else None
        # With head_grad, the head's gradient is not the backward's to return: autograd does not see the weight
        deferred = head_grad is not None and head.requires_grad and torch.is_grad_enabled()
        lp, ent = ChunkedLogp.apply(hidden[mask], head.detach() if deferred else head, batch.completion_ids[mask],
                                    temperature, dtype, entropy != "none", floor, head_grad if deferred else None)
        logp = hidden.new_zeros(mask.shape, dtype=torch.float32).masked_scatter(mask, lp)  # (B, T), 0 off the mask
        if entropy != "none":
            ent = (hidden.new_zeros(mask.shape, dtype=torch.float32)
                   .masked_scatter(mask, ent if with_grad else ent.detach()))
        values = value_head(hidden).squeeze(-1).float() if value_head is not None else None  # (B, T)
        return PolicyForward(logp, ent if entropy != "none" else None, values)
    if value_head is None:
        logits = completion_states(module, batch, share_prefix, run, prefix)  # (B, T, V)
    else:
        hidden = completion_states(module, batch, share_prefix, run, prefix)  # (B, T, H)
        logits = model.get_output_embeddings()(hidden)  # (B, T, V)
    z = logits.float() / temperature  # (B, T, V)
    floor = batch.sampler_floor
    zk = truncated(z, z.logsumexp(-1) if floor is not None else None, floor, batch.completion_ids)  # (B, T, V)
    lse = zk.logsumexp(-1, keepdim=True)  # (B, T, 1)
    logp = z.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1) - lse.squeeze(-1)  # (B, T)
    ent = None
    if entropy != "none":
        with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):
            ent = -((zk - lse).exp() * (z - lse)).sum(-1)  # (B, T); p = 0 off the set, z stays finite
    values = value_head(hidden).squeeze(-1).float() if value_head is not None else None  # (B, T)
    return PolicyForward(logp, ent, values)


def truncated(z: Tensor, lse: Tensor, floor: Tensor | None, targets: Tensor) -> Tensor:
    """Logits z (..., V) with -inf off the sampler's top-p set: tokens whose log-prob z - lse is at
    or above ``floor`` (...), and the target token; z itself when there is no floor."""
    if floor is None:
        return z
    keep = (z - lse.unsqueeze(-1)) >= floor.unsqueeze(-1)  # (..., V)
    keep.scatter_(-1, targets.unsqueeze(-1), True)
    return z.masked_fill(~keep, float("-inf"))


def plain_head(model) -> bool:
    """Whether logits are exactly hidden @ lm_head.weight^T (no bias, scale or soft-capping)."""
    head, c = model.get_output_embeddings(), model.config
    return (type(head) is torch.nn.Linear and head.bias is None and not getattr(c, "final_logit_softcapping", None)
            and getattr(c, "logit_scale", None) is None and getattr(c, "logits_scaling", None) is None)


CHUNK_TOKENS = budgets.CPU_CHUNK_TOKENS  # tokens per chunk on a CPU (model/budgets.py says why)


def chunk_tokens(on_gpu: bool, vocab: int) -> int:
    """Tokens per ``ChunkedLogp`` chunk: CHUNK_TOKENS on a CPU, GPU_CHUNK_BYTES of logits on a GPU
    (model/budgets.py)."""
    return budgets.gpu_chunk_tokens(vocab) if on_gpu else CHUNK_TOKENS


class ChunkedLogp(torch.autograd.Function):
    """log pi(target) and the entropy of pi = softmax(h W^T / temperature) for rows of h, without
    ever holding more than a chunk of rows of logits (``chunk_tokens``).

    The plain path keeps (B, T, V) float32 logits, their log-softmax and (for the entropy) their
    softmax alive for the backward: ~1.2 GB at 32 x 64 tokens of a 49152 vocabulary. Here the
    forward keeps h, one log-sum-exp per token and the lm_head's output in its own dtype (bf16 under
    autocast: a sixth of that, and no matmul to redo), and the backward rebuilds each chunk's
    logits z from it and forms the gradient in closed form: with p = softmax(z),
    d log pi(y) / dz = onehot(y) - p and d H / dz = -p (log p + H), and dz / dh = W / temperature.
    With a top-p ``floor`` p is the truncated, renormalised distribution (0 off the kept set), and
    the same formulas hold.
    The matmuls run in ``dtype`` (bf16 under autocast, as autocast would run the lm_head) with a
    float32 softmax; tests/model/test_logprobs.py checks values and gradients against the plain path."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, targets: Tensor, temperature: float, dtype: torch.dtype,
                want_entropy: bool, floor: Tensor | None = None,
                head_grad: "HeadGrad | None" = None) -> tuple[Tensor, Tensor]:
        w = _cast(weight, dtype)
        logp, ent, lse, lse_all = (h.new_zeros(len(h), dtype=torch.float32) for _ in range(4))  # on h's device
        # The matmul's output, kept for the backward when there is one (2 bytes a logit in bf16: 20 MB
        # for 200 tokens), so the backward does not run the lm_head again: it is deterministic, so the
        # kept logits are the ones the backward would recompute.
        kept = h.new_empty(len(h), w.shape[0], dtype=w.dtype) if any(ctx.needs_input_grad) else None
        chunk = chunk_tokens(h.is_cuda, w.shape[0])
        for i in range(0, len(h), chunk):
            sl = slice(i, i + chunk)
            zw = ChunkedLogp._logits(h[sl], w)  # (c, V) in the matmul's dtype
            if kept is not None:
                kept[sl] = zw
            z = zw.float().div_(temperature)  # (c, V) float32
            lse_all[sl] = z.logsumexp(-1)
            zk = truncated(z, lse_all[sl], floor[sl] if floor is not None else None, targets[sl])  # (c, V)
            lse[sl] = zk.logsumexp(-1) if floor is not None else lse_all[sl]  # over the kept set
            logp[sl] = z.gather(-1, targets[sl, None]).squeeze(-1) - lse[sl]
            if want_entropy:  # H = lse - sum p z, p = 0 off the kept set
                ent[sl] = lse[sl] - ((zk - lse[sl, None]).exp_() * z).sum(-1)
        ctx.save_for_backward(h, weight, targets, ent, lse, lse_all, floor, kept)
        ctx.temperature, ctx.dtype, ctx.head_grad = temperature, dtype, head_grad
        ctx.set_materialize_grads(False)  # an output no loss reads gets None, not zeros to test on the host
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp: Tensor, g_ent: Tensor):
        h, weight, targets, ent, lse, lse_all, floor, kept = ctx.saved_tensors
        w = _cast(weight, ctx.dtype)
        grad_h = torch.empty_like(h)
        # dz of every chunk is kept in ``dtype`` (bf16: 2 bytes per logit, 96 MB for 976 tokens) so
        # the weight's gradient is one matmul: accumulating it chunk by chunk meant a full 49152 x
        # 576 float32 add per chunk, the slowest ops of the whole update in the profile.
        want_w = ctx.needs_input_grad[1] or ctx.head_grad is not None
        dz_all = h.new_empty(len(h), w.shape[0], dtype=ctx.dtype) if want_w else None
        # the chain through z = h W^T / temperature; an unread output's gradient is None (no entropy term)
        g_logp = g_logp / ctx.temperature if g_logp is not None else torch.zeros_like(lse)
        g_ent = g_ent / ctx.temperature if g_ent is not None else None
        chunk = chunk_tokens(h.is_cuda, w.shape[0])
        for i in range(0, len(h), chunk):
            sl = slice(i, i + chunk)
            z = kept[sl].float().div_(ctx.temperature)  # (c, V): the forward's logits
            zk = truncated(z, lse_all[sl], floor[sl] if floor is not None else None, targets[sl])  # the forward's set
            p = (zk - lse[sl, None]).exp_()  # renormalised over the kept set, 0 off it
            if g_ent is not None:  # -p (log p + H) g_ent, before p is overwritten
                ent_part = p * ((z - lse[sl, None]) + ent[sl, None]) * g_ent[sl, None]
            dz = p.mul_(-g_logp[sl, None])
            dz.scatter_add_(1, targets[sl, None], g_logp[sl, None])  # (onehot - p) g_logp
            if g_ent is not None:
                dz -= ent_part
            dz = dz.to(ctx.dtype)
            grad_h[sl] = (dz @ w).to(h.dtype)
            if dz_all is not None:
                dz_all[sl] = dz
        grad_w = None
        if dz_all is not None and ctx.head_grad is not None:  # formed once per mini-batch (HeadGrad)
            ctx.head_grad.add(dz_all, h.to(ctx.dtype))
        elif dz_all is not None:  # (V, H); zeros when there are no tokens
            grad_w = (dz_all.T @ h.to(ctx.dtype)).to(weight.dtype) if len(h) else torch.zeros_like(weight)
        return grad_h, grad_w, None, None, None, None, None, None

    @staticmethod
    def _logits(h: Tensor, w: Tensor) -> Tensor:  # (c, V): the lm_head, once per token (the forward's)
        return h.to(w.dtype) @ w.T


class HeadGrad:
    """The lm_head weight's gradient over a mini-batch's micro-batches, formed once at the end.

    Each micro-batch's backward through ``ChunkedLogp`` would make a (V, H) gradient in bf16, cast it
    to a fresh float32 tensor (113 MB for SmolLM2's 49152 x 576 head) and add it into ``.grad``:
    in the update profile that was 44 ms of casting and ~20 ms of adding per micro-batch, most of it
    first-touch page faults. Here each backward leaves its dz (tokens, V) and h (tokens, H) in the
    matmul's dtype, and ``flush`` makes the sum over all of them one matmul, one cast and one add:
    sum_mb dz_mb^T h_mb = [dz_1; ...; dz_n]^T [h_1; ...; h_n]."""

    def __init__(self):
        self.dz: list[Tensor] = []
        self.h: list[Tensor] = []

    def add(self, dz: Tensor, h: Tensor) -> None:
        self.dz.append(dz)
        self.h.append(h)

    def held(self) -> int:
        """Bytes of dz and h held for ``flush``: (tokens, V) in bf16 per micro-batch, 0.8 GB for 8k tokens
        of a 49152 vocabulary, so the trainer flushes past ``budgets.head_grad_bytes``."""
        return sum(t.nbytes for t in (*self.dz, *self.h))

    def flush(self, weight: Tensor) -> None:
        """Accumulate the mini-batch's gradient into ``weight`` (a leaf) through autograd, so its
        hooks run as for any other gradient (trainer.param_dtype=bfloat16's masters)."""
        if not self.dz:
            return
        one = len(self.dz) == 1  # a cat of one tensor would copy it
        dz, h = (self.dz[0], self.h[0]) if one else (torch.cat(self.dz), torch.cat(self.h))  # (N, V), (N, H)
        self.dz, self.h = [], []
        torch.autograd.backward(weight, (dz.T @ h).to(weight.dtype))


_cast_cache: dict = {}


def _cast(weight: Tensor, dtype: torch.dtype) -> Tensor:
    """``weight`` in ``dtype``, cast once: within one mini-batch every micro-batch's forward and
    backward reuse one cast of the 49152 x 576 head. In-place writes such as ``copy_`` bump
    ``Tensor._version`` and invalidate it; the fused AdamW kernel does not, so the trainer calls
    ``clear_cast_cache()`` after every optimizer step."""
    if weight.dtype == dtype:
        return weight.detach()
    key = (id(weight), dtype)
    hit = _cast_cache.get(key)
    if hit is None or hit[0]() is not weight or hit[1] != weight._version:
        _cast_cache.clear()  # one head at a time: do not keep old models' casts alive
        hit = _cast_cache[key] = (weakref.ref(weight), weight._version, weight.detach().to(dtype))
    return hit[2]


def completion_logprobs(
    model: torch.nn.Module, batch: Rollouts, temperature: float, with_entropy: bool = False,
    share_prefix: bool = True, chunked: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """(logp (B, T), entropy (B, T) without grad or None): the reference's and the tests' view."""
    out = policy_forward(model, batch, temperature, entropy="detached" if with_entropy else "none",
                         share_prefix=share_prefix, chunked=chunked)
    return out.logp, out.entropy


def completion_values(decoder: torch.nn.Module, head: torch.nn.Module, batch: Rollouts,
                      share_prefix: bool = True) -> Tensor:
    """(B, T) float32 values from a separate critic: its own trunk (a decoder) and a scalar head."""
    hidden = completion_states(decoder, batch, share_prefix, _backbone)  # (B, T, H)
    return head(hidden).squeeze(-1).float()


def trunk(model: torch.nn.Module, chunked: bool = True, value_head: torch.nn.Module | None = None):
    """(module, run) that ``policy_forward`` runs: the decoder for final hidden states (the chunked
    head, or a value head reading them), else the *ForCausalLM for its logits."""
    if (chunked and plain_head(model)) or value_head is not None:
        return model.get_decoder(), _backbone
    return model, _causal_lm


# (B, T, D)
def completion_states(module, batch: Rollouts, share_prefix: bool, run, prefix: "Prefix | None" = None) -> Tensor:
    """What ``module`` outputs at the T positions that predict the completion tokens: logits
    (a *ForCausalLM, run=_causal_lm) or final hidden states (its decoder, run=_backbone).
    prefix: the rows' prompts, already run (``Prefix.take``)."""
    trunk = packed.trunk_of(module)
    if trunk is not None and run is _backbone:  # the packed trunk gives final hidden states (model/packed.py)
        return _packed_states(trunk, batch, share_prefix, prefix)
    if prefix is not None:
        return _completions(module, batch, prefix.states, prefix.cache, run)
    groups = _shared_groups(module, batch) if share_prefix else None
    if groups is not None:
        return _shared_prefix(module, batch, *groups, run)
    return _full(module, batch, run)


# transformers 5.24 renamed the KV cache's argument and output field from ``past_key_values`` to
# ``cache``; the old name warns on every run and goes in 5.40, and ``transformers>=5.0,<6`` admits
# both sides of the rename. The output classes say which side this install is on.
CACHE_KW = "cache" if "cache" in getattr(BaseModelOutputWithPast, "__dataclass_fields__", {}) else "past_key_values"


def _causal_lm(model, keep: int, **kw):
    """(logits of the last `keep` positions, cache). logits_to_keep skips the lm_head (a
    576 x 49152 matmul per token) on positions we do not score."""
    out = model(logits_to_keep=keep, **kw)
    return out.logits, getattr(out, CACHE_KW)


def _backbone(decoder, keep: int, **kw):
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


def _shared_groups(module, batch: Rollouts) -> tuple[Tensor, Tensor] | None:
    """``prompt_groups`` where the prompt prefix can be shared: some prompt repeats, and activation
    checkpointing is off (transformers turns the KV cache off under it); else None."""
    first, row_to_group = prompt_groups(batch)
    if first is None or len(first) == len(batch) or checkpointing(module):
        return None
    return first, row_to_group


def _prompts(module, batch: Rollouts, first: Tensor, run):
    """Each distinct prompt (rows ``first``) once: (its last position's output (G, 1, D), which
    predicts completion token 0, and the prompts' KV cache)."""
    p_ids, p_mask = batch.prompt_ids[first], batch.prompt_mask[first]  # (G, P) each
    return run(module, 1, input_ids=p_ids, attention_mask=p_mask.long(), position_ids=position_ids(p_mask),
               use_cache=True)


def _full(module, batch: Rollouts, run) -> Tensor:  # (B, T, D)
    T = batch.completion_ids.shape[1]
    ids, attn = batch.input_ids(), batch.attention_mask()  # (B, P+T) each
    # Position P-1+t predicts completion token t: the last T+1 positions, minus the very last.
    states, _ = run(module, T + 1, input_ids=ids, attention_mask=attn, position_ids=position_ids(attn), use_cache=False)
    return states[:, :-1, :]


def _shared_prefix(module, batch: Rollouts, first: Tensor, row_to_group: Tensor, run) -> Tensor:  # (B, T, D)
    first_states, cache = _prompts(module, batch, first, run)  # 1. each distinct prompt once
    cache.batch_select_indices(row_to_group)  # (G, ...) -> (B, ...) rows; differentiable indexing
    return _completions(module, batch, first_states[row_to_group], cache, run)  # (B, 1, D) first states


def _completions(module, batch: Rollouts, first_states: Tensor, cache, run) -> Tensor:  # (B, T, D)
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

    def take(self, idx: Tensor, prompt_cols: int) -> "Prefix":
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
    if packed_trunk is not None and run is _backbone:
        return _packed_prompts(packed_trunk, batch, True, leaves=True)
    groups = _shared_groups(module, batch)
    if groups is None:
        return None
    first, row_to_group = groups
    states, cache = _prompts(module, batch, first, run)
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


def _packed_prompts(trunk: packed.PackedTrunk, batch: Rollouts, share_prefix: bool,
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


def _packed_states(trunk: packed.PackedTrunk, batch: Rollouts, share_prefix: bool,
                   prefix: packed.PackedPrefix | None) -> Tensor:  # (B, T, H)
    """``completion_states`` on the packed trunk; prefix: the rows' prompts already run (taken)."""
    if prefix is None:
        prefix = _packed_prompts(trunk, batch, share_prefix, leaves=False).take(
            torch.arange(len(batch), device=batch.device), batch.prompt_ids.shape[1])
    dtype = _matmul_dtype(trunk.decoder.embed_tokens.weight)
    with torch.autocast(batch.device.type, enabled=False):
        return trunk.completions(batch.completion_ids, batch.completion_mask, batch.prompt_mask, prefix, dtype)


def clear_cast_cache() -> None:
    """Forget every cast of the weights: the head's (``_cast``) and the packed trunks' fused copies."""
    _cast_cache.clear()
    packed.clear_caches()
