"""The log-prob body over final hidden states: ``ChunkedLogp`` (the lm_head and log-softmax a chunk of
tokens at a time, with its backward written out), the top-p truncation both bodies share, and
``HeadGrad``, where a mini-batch's lm_head gradient waits to be formed once (the deferred head
gradient lever). ``model/logprobs.py`` picks between this body and the full (B, T, V) logits.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.model import budgets


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


@dataclass(frozen=True)
class HeadSpec:
    """How ``ChunkedLogp`` scores: pi = softmax(h W^T / temperature), its matmuls in ``dtype`` (what
    autocast would run the lm_head in), and whether the entropy of pi is wanted too."""
    temperature: float
    dtype: torch.dtype
    entropy: bool = False
    step: object = None  # trainer.compile's Step (model/compiled.py): the per-chunk passes compiled; None: eager


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
    def forward(ctx, h: Tensor, weight: Tensor, targets: Tensor, spec: HeadSpec, floor: Tensor | None = None,
                head_grad: HeadGrad | None = None) -> tuple[Tensor, Tensor]:
        temperature, dtype, want_entropy = spec.temperature, spec.dtype, spec.entropy
        w = cast_weight(weight, dtype)
        logp, ent, lse, lse_all = (h.new_zeros(len(h), dtype=torch.float32) for _ in range(4))  # on h's device
        # The matmul's output, kept for the backward when there is one (2 bytes a logit in bf16: 20 MB
        # for 200 tokens), so the backward does not run the lm_head again: it is deterministic, so the
        # kept logits are the ones the backward would recompute.
        kept = h.new_empty(len(h), w.shape[0], dtype=w.dtype) if any(ctx.needs_input_grad) else None
        chunk = chunk_tokens(h.is_cuda, w.shape[0])
        scores = (spec.step.wrap(chunk_scores, rows=(0, 1, 2)) if spec.step is not None and kept is not None
                  else chunk_scores)
        for i in range(0, len(h), chunk):
            sl = slice(i, i + chunk)
            zw = ChunkedLogp._logits(h[sl], w)  # (c, V) in the matmul's dtype
            if kept is not None:
                kept[sl] = zw
            logp[sl], ent[sl], lse[sl], lse_all[sl] = scores(zw, targets[sl], floor[sl] if floor is not None else None,
                                                             (temperature, want_entropy))
        ctx.save_for_backward(h, weight, targets, ent, lse, lse_all, floor, kept)
        ctx.temperature, ctx.dtype, ctx.head_grad, ctx.step = temperature, dtype, head_grad, spec.step
        ctx.set_materialize_grads(False)  # an output no loss reads gets None, not zeros to test on the host
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp: Tensor, g_ent: Tensor):
        h, weight, targets, ent, lse, lse_all, floor, kept = ctx.saved_tensors
        w = cast_weight(weight, ctx.dtype)
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
        grad_z = ctx.step.wrap(chunk_grad, rows=(0, 1, 2, 3)) if ctx.step is not None else chunk_grad
        for i in range(0, len(h), chunk):
            sl = slice(i, i + chunk)
            stats = (lse[sl], lse_all[sl], floor[sl] if floor is not None else None, ent[sl])
            dz = grad_z(kept[sl], targets[sl], stats, (g_logp[sl], g_ent[sl] if g_ent is not None else None),
                        (ctx.temperature, ctx.dtype))
            grad_h[sl] = (dz @ w).to(h.dtype)
            if dz_all is not None:
                dz_all[sl] = dz
        grad_w = None
        if dz_all is not None and ctx.head_grad is not None:  # formed once per mini-batch (HeadGrad)
            ctx.head_grad.add(dz_all, h.to(ctx.dtype))
        elif dz_all is not None:  # (V, H); zeros when there are no tokens
            grad_w = (dz_all.T @ h.to(ctx.dtype)).to(weight.dtype) if len(h) else torch.zeros_like(weight)
        return grad_h, grad_w, None, None, None, None

    @staticmethod
    def _logits(h: Tensor, w: Tensor) -> Tensor:  # (c, V): the lm_head, once per token (the forward's)
        return h.to(w.dtype) @ w.T


def chunk_scores(zw: Tensor, targets: Tensor, floor: Tensor | None, spec: tuple) -> tuple[Tensor, ...]:
    """One chunk of ``ChunkedLogp``'s forward from its logits zw (c, V) in the matmul's dtype: (log pi(target),
    entropy (0 unless asked), log-sum-exp over the kept set, over all tokens), each (c,) float32.
    ``spec``: (temperature, entropy wanted), constants of trainer.compile's graph (model/compiled.py)."""
    temperature, want_entropy = spec
    z = zw.float().div_(temperature)  # (c, V) float32
    lse_all = z.logsumexp(-1)
    zk = truncated(z, lse_all, floor, targets)  # (c, V)
    lse = zk.logsumexp(-1) if floor is not None else lse_all  # over the kept set
    logp = z.gather(-1, targets[:, None]).squeeze(-1) - lse
    if not want_entropy:
        return logp, torch.zeros_like(lse), lse, lse_all
    return logp, lse - ((zk - lse[:, None]).exp_() * z).sum(-1), lse, lse_all  # H = lse - sum p z, p = 0 off the set


def chunk_grad(kept: Tensor, targets: Tensor, stats: tuple, grads: tuple, spec: tuple) -> Tensor:
    """One chunk of ``ChunkedLogp``'s backward: dz (c, V) in the matmul's dtype from the forward's logits
    ``kept`` (c, V). stats: the forward's (lse, lse_all, floor or None, entropy); grads: (g_logp, g_ent or
    None), each already divided by the temperature; spec: (temperature, the matmul's dtype)."""
    lse, lse_all, floor, ent = stats
    g_logp, g_ent = grads
    temperature, dtype = spec
    z = kept.float().div_(temperature)  # (c, V): the forward's logits
    zk = truncated(z, lse_all, floor, targets)  # the forward's set
    p = (zk - lse[:, None]).exp_()  # renormalised over the kept set, 0 off it
    if g_ent is not None:  # -p (log p + H) g_ent, before p is overwritten
        ent_part = p * ((z - lse[:, None]) + ent[:, None]) * g_ent[:, None]
    dz = p.mul_(-g_logp[:, None])
    dz.scatter_add_(1, targets[:, None], g_logp[:, None])  # (onehot - p) g_logp
    if g_ent is not None:
        dz -= ent_part
    return dz.to(dtype)


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


def cast_weight(weight: Tensor, dtype: torch.dtype) -> Tensor:
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

