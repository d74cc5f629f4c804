"""The trainer's and the reference's forward on a packed trunk for Llama-family decoders: the
same function of the weights as transformers' forward, without padding, on the CPU and on CUDA.

Why a trunk of our own. transformers' forward of a micro-batch runs every row to the longest
completion in it, casts each linear layer's float32 input to bf16 once per projection (q, k and
v each cast the same normed input), and on CPU runs SDPA's flash kernel, whose backward took
8.8 ms for an 8-row, 63 x 110 attention here (0.74 s of a 6.4 s update). This trunk, the
training-side twin of the sampler's decode loop (roles/rollout_fast.py):

* **packs the tokens**: the linear layers, norms and MLP see only the positions that carry a
  loss token or precede one (no padded rows), as verl's ``use_remove_padding`` does with flash
  attention's varlen kernel; only attention, which is cheap here, works on a padded grid;
* **fuses the projections**: q/k/v is one matmul and gate/up is one, over bf16 copies of the
  weights built once per mini-batch (``cached``) with autograd, so each micro-batch's weight
  gradient flows back into the float32 parameters through them;
* **runs attention as two batched matmuls** (``Attention``) with a hand-written backward, each
  kv head serving its group of query heads without copying keys (transformers' repeat_kv order).

Numerics follow transformers' bf16 autocast with SDPA: the residual stream and RMSNorm in float32,
every projection in bf16, RoPE on the bf16 projections in the residual stream's dtype, then cast
for attention; attention scores and softmax in float32 from bf16 q and k (as SDPA's CPU kernel
accumulates them), probabilities cast to bf16 for p @ v. Scores rounded to bf16, as transformers'
eager attention leaves them, were measured to matter: with bf16 parameters the tiny model's
learning test reached 0.26 held-out on one seed where SDPA reached 1.0 (0.88 once the scores were
float32). With float32 weights and no autocast everything is float32. tests/model/test_packed.py
checks values and gradients against transformers' forward.

Which models: ``llama`` and ``qwen2`` (q/k/v biases) without sliding windows, attention dropout,
LoRA adapters, FSDP or activation checkpointing (``reason_unsupported``); trainer.forward picks
this trunk (auto/packed) or transformers' forward (hf).

On CUDA the linear layers, norms and MLP run packed as on the CPU (fewer kernels: fused q/k/v and
gate/up, no padded rows), with GPU kernels of their own (``on_gpu``): the RMSNorms are torch's
``rms_norm`` with the weight, there one fused kernel forward and one or two back that keep only x and
one 1/rms a token (the written-out norm is ~20 kernels and keeps the float32 normalised x as well: 4
bytes a hidden unit a token, 1.4 GB a micro-batch of the H100 0.5B row's 8.2k tokens), and the SwiGLU
product is ``SiluMul``, which keeps gate and up and recomputes silu(gate) in its backward (autograd
keeps silu(gate) too: 2 bytes an MLP unit a token, 1.9 GB there). 112 kernels a layer where the CPU
branch takes 155 (benchmarks/kernel_count.py). Attention is torch's SDPA on the padded grid with the
mask (``attention``), the memory-efficient kernel transformers' own CUDA forward runs. True varlen
attention (FlexAttention's block masks, flash-attn's varlen kernel) would drop the grid's padding
too, but attention is a small share of a micro-batch's work at these lengths, FlexAttention is fast
only compiled (a compile per new length), and flash-attn is a CUDA-only build CI cannot run. The batch-side glue (prompt
groups, positions) is model/logprobs.py's, which calls ``PackedTrunk.prompts`` and ``.completions``.
"""

from __future__ import annotations

import weakref
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.weak import WeakIdKeyDictionary

from rlpost.types.errors import ConfigError

SUPPORTED = ("llama", "qwen2")  # the sampler's decode loop supports the same (roles/rollout_fast.py)


def reason_unsupported(model: torch.nn.Module) -> str | None:
    """Why the packed trunk cannot stand in for ``model``'s forward, or None when it can."""
    c = getattr(model, "config", None)
    if c is None or c.model_type not in SUPPORTED:
        return f"model type {getattr(c, 'model_type', type(model).__name__)!r} (supported: {', '.join(SUPPORTED)})"
    if getattr(c, "hidden_act", "silu") != "silu" or getattr(c, "mlp_bias", False):
        return "an MLP other than bias-free SiLU gate/up/down"
    if getattr(c, "use_sliding_window", False) or getattr(c, "attention_dropout", 0.0):
        return "sliding-window attention or attention dropout"
    if any(type(m).__module__.startswith("peft") for m in model.modules()):
        return "LoRA adapters (peft)"
    if any(type(p).__name__ == "DTensor" for p in model.parameters()):
        return "FSDP-sharded parameters"
    return None


def resolve(setting: str, model: torch.nn.Module, *, checkpointing: bool = False, data_parallel: bool = False) -> bool:
    """trainer.forward for ``model``: whether its forward runs packed. 'auto' = where it applies;
    'packed' where it does not is a config error naming why; 'hf' = never."""
    if setting == "hf":
        return False
    why = ("activation checkpointing (model.gradient_checkpointing)" if checkpointing
           else "data parallelism (dist.trainer_ranks > 1)" if data_parallel else reason_unsupported(model))
    if why is not None and setting == "packed":
        raise ConfigError(f"trainer.forward=packed does not apply to {why}; use trainer.forward=auto or hf")
    return why is None


class Attention(torch.autograd.Function):
    """softmax(q k^T * scale + mask) v for grouped-query attention, with its backward written out.

    q (b, nkv, g*T, hd): the g query heads of each kv head stacked along the rows (head-major);
    k, v (b, nkv, L, hd); mask (b, 1, 1, T, L) float32, 0 where a query may look and -inf where it
    may not. Returns (b, nkv, g*T, hd) in q's dtype. The scores q k^T and the softmax are float32
    (q and k cast up: products of bf16 numbers are exact in float32), p is cast to v's dtype for
    p v. The backward is the textbook one (with
    p = softmax(s), o = p v): dv = p^T do, dp = do v^T, ds = p (dp - rowsum(p dp)) * scale,
    dq = ds k, dk = ds^T q. It keeps p in float32 for it (2 MB a layer at 8 x 9 x 63 x 110)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
        b, nkv, gT, _ = q.shape
        T, L = mask.shape[-2:]
        acc = torch.promote_types(q.dtype, torch.float32)  # the scores' dtype: float32, or float64 in tests
        s = (q.to(acc) @ k.to(acc).transpose(-1, -2)).view(b, nkv, gT // T, T, L)  # (b, nkv, g, T, L)
        p = torch.add(mask, s, alpha=scale).softmax(-1).view(b, nkv, gT, L)
        ctx.save_for_backward(q, k, v, p)
        ctx.scale = scale
        return p.to(q.dtype) @ v  # (b, nkv, g*T, hd)

    @staticmethod
    def backward(ctx, do: Tensor):
        q, k, v, p = ctx.saved_tensors
        do = do.to(q.dtype)
        dv = p.to(q.dtype).transpose(-1, -2) @ do  # (b, nkv, L, hd)
        dp = do.to(p.dtype) @ v.to(p.dtype).transpose(-1, -2)  # (b, nkv, g*T, L)
        ds = (p * (dp - (p * dp).sum(-1, keepdim=True)) * ctx.scale).to(q.dtype)  # softmax's backward, 0 off the mask
        return ds @ k, ds.transpose(-1, -2) @ q, dv, None, None


SAVED_BYTES = 16 * 2**20  # Attention keeps a layer's float32 probabilities up to this size; SDPA past it


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    """``Attention`` on the CPU while its float32 probabilities, which it keeps for the backward, are at
    most ``SAVED_BYTES`` a layer (the demo: 5 MB; vs_trl.py's batch: 8 MB). They grow with the square of
    the length, 324 MB a layer at 8 rows of 1,024 tokens, ~10 GB over 30 layers (scaling.py's
    longest run was OOM-killed at 23.5 GB), and the float32 q k^T with them: past that, and on a
    GPU always, torch's SDPA (``sdpa``) keeps only a log-sum-exp per query and computes the scores in
    the inputs' dtype with float32 accumulation, as transformers' forward runs it."""
    b, nkv, gT, hd = q.shape
    T, L = mask.shape[-2:]
    if not q.is_cuda and b * nkv * gT * L * 4 <= SAVED_BYTES:
        return Attention.apply(q, k, v, mask, scale)
    return sdpa(q, k, v, mask, scale, expand_kv=q.is_cuda)


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float, expand_kv: bool) -> Tensor:
    """``Attention``'s layout through torch's SDPA: q (b, nkv, g*T, hd) is (b, nh, T, hd) with query head
    j*g + i on kv head j, SDPA's enable_gqa order. ``expand_kv``: hand SDPA every query head its
    own copy of its kv head's keys and values instead (CUDA: with an arbitrary mask, GQA would leave
    only the math kernel; the memory-efficient kernel takes the mask, not GQA)."""
    b, nkv, gT, hd = q.shape
    T, L = mask.shape[-2:]
    g = gT // T
    if expand_kv:
        k, v = (x[:, :, None].expand(b, nkv, g, L, hd).reshape(b, nkv * g, L, hd) for x in (k, v))
    q, bias = q.view(b, nkv * g, T, hd), mask[:, 0].to(q.dtype)
    with kernels(q, k, v, bias, gqa=not expand_kv):
        o = F.scaled_dot_product_attention(q, k, v, bias, scale=scale, enable_gqa=not expand_kv)  # (b, nh, T, hd)
    return o.view(b, nkv, gT, hd)


def kernels(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, gqa: bool):
    """Which SDPA kernels the trainer's attention may use: on CUDA the memory-efficient one wherever it
    takes these inputs, else torch's choice. On Hopper torch picks cuDNN's attention first, and cuDNN
    builds a graph for every new shape it sees (hundreds of ms, about a second when it compiles a kernel):
    the trainer's shapes change with the batch's lengths, and the H100 demo's updates had steps of 1.8-2.6 s
    among steps of 0.6-0.9 (benchmarks/README.md). The memory-efficient kernel is compiled ahead and keeps
    the same log-sum-exp per query for the backward; attention was ~5% of the update there."""
    if not q.is_cuda:
        return nullcontext()
    try:  # SDPAParams' arguments have changed between torch versions: where they differ, torch chooses
        params = torch.backends.cuda.SDPAParams(q, k, v, bias, 0.0, False, gqa)
        usable = torch.backends.cuda.can_use_efficient_attention(params, False)
    except (TypeError, AttributeError, RuntimeError):
        usable = False
    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]) if usable else nullcontext()


@dataclass
class PackedPrefix:
    """The prompts of a batch run once (``PackedTrunk.prompts``): what ``logprobs.Prefix`` is for
    transformers' forward, with plain per-layer keys and values in place of a cache object.

    As leaves (the trainer's prompts once per mini-batch), micro-batches index into them (``take``)
    and ``backward`` sends their gradients through the prompt forward once; otherwise they are the
    prompt forward's own outputs and one backward covers prompts and completions."""
    states: Tensor  # (G, 1, H) each prompt's last position's output (final norm applied): predicts completion token 0
    kv: list[tuple[Tensor, Tensor]]  # per layer (keys after RoPE, values), each (G, nkv, P, hd) in the matmul dtype
    group: Tensor  # (B,) row of the batch -> its prompt's index
    outputs: list[Tensor] = field(default_factory=list)  # the prompt forward's tensors, in the order of ``leaves``
    leaves: list[Tensor] = field(default_factory=list)

    def take(self, idx: Tensor, prompt_cols: int) -> "PackedPrefix":
        """Rows ``idx`` of the batch, seeing their prompts' last ``prompt_cols`` columns (a trimmed
        micro-batch drops columns that are left padding for all of its rows)."""
        rows = self.group[idx]  # (b,)
        kv = [(k[rows, :, -prompt_cols:], v[rows, :, -prompt_cols:]) for k, v in self.kv]
        return PackedPrefix(self.states[rows], kv, torch.arange(len(idx)))

    def backward(self) -> None:
        pairs = [(out, leaf.grad) for out, leaf in zip(self.outputs, self.leaves) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        self.outputs, self.leaves = [], []  # free the prompt forward's graph


class PackedTrunk:
    """The decoder of a Llama-family model, run packed. Holds no weights of its own: the fused bf16
    copies (``cached``) are rebuilt from the model's parameters after every optimizer step."""

    def __init__(self, model: torch.nn.Module):
        self.decoder = model.get_decoder()
        c = self.decoder.config
        self.nh, self.nkv = c.num_attention_heads, c.num_key_value_heads
        self.hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.scale = self.decoder.layers[0].self_attn.scaling
        self._fused: dict[tuple, list] = {}
        self.compiled: tuple | None = None  # (pre_attention, post_attention) through trainer.compile (``compile``)

    def compile(self, step) -> None:
        """Run the layers' token-wise work through ``step`` (model/compiled.py: Step) when grad is on: the
        trainer's update; its no-grad forwards (old log-probs) stay eager, which keeps the graphs few."""
        self.compiled = (step.wrap(pre_attention, rows=(0, 1)), step.wrap(post_attention, rows=(0, 1)))

    # --- weights ----------------------------------------------------------------------------------

    def cached(self, dtype: torch.dtype) -> list[tuple]:
        """Per layer (qkv weight, qkv bias or None, o weight, o bias or None, gate/up weight, down
        weight) in ``dtype``: concatenated and cast with autograd, once until ``clear``. Keyed by
        grad mode too: copies made under no_grad (old log-probs, the reference) carry no graph."""
        key = (dtype, torch.is_grad_enabled())
        if key not in self._fused:
            def cast(ts):
                return None if ts[0] is None else torch.cat(ts).to(dtype) if len(ts) > 1 else ts[0].to(dtype)
            out = []
            for layer in self.decoder.layers:
                a, m = layer.self_attn, layer.mlp
                qkv = [a.q_proj, a.k_proj, a.v_proj]
                out.append((cast([p.weight for p in qkv]), cast([p.bias for p in qkv]), cast([a.o_proj.weight]),
                            cast([a.o_proj.bias]), cast([m.gate_proj.weight, m.up_proj.weight]),
                            cast([m.down_proj.weight])))
            self._fused[key] = out
        return self._fused[key]

    def clear(self) -> None:
        """Drop the fused copies: the weights changed (an optimizer step), or a pass is over."""
        self._fused.clear()

    # --- the layers -----------------------------------------------------------------------------

    def _layers(self, x: Tensor, pos: Tensor, cells: tuple[Tensor | None, int, int], prefix_kv: list | None,
                mask: Tensor, dtype: torch.dtype) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """Every decoder layer over packed tokens x (N, H) at positions pos (N,). ``cells``: (grid, b, T),
        each token's cell in the padded (b, T) grid attention works on (grid None: the tokens fill it);
        ``prefix_kv``: per layer the rows' prompt keys and values (b, nkv, P, hd) placed before
        their own; mask (b, 1, 1, T, P+T) additive. Returns x and per layer the tokens' own keys
        and values on the grid (b, nkv, T, hd)."""
        grid, b, T = cells
        nh, nkv, hd = self.nh, self.nkv, self.hd
        g = nh // nkv
        gpu = on_gpu(x)
        if gpu:
            mask = mask.to(dtype)  # 0 and -inf are exact in bf16: cast once here, not in every layer's SDPA
        cos, sin = self.decoder.rotary_emb(x, pos[None])  # (1, N, hd) each, in the residual stream's dtype
        cos, sin = cos[0, :, None], torch.cat((-sin[0, :, : hd // 2], sin[0, :, hd // 2 :]), -1)[:, None]  # (N, 1, hd)
        rope = torch.stack((cos, sin), 1)  # (N, 2, 1, hd): one row tensor for pre_attention
        pre, post = self.compiled if self.compiled is not None and torch.is_grad_enabled() else (pre_attention,
                                                                                                 post_attention)
        kv_out = []
        for i, layer in enumerate(self.decoder.layers):
            w_qkv, b_qkv, w_o, b_o, w_gu, w_down = self.cached(dtype)[i]
            qk, v = pre(x, rope, layer.input_layernorm.weight, (w_qkv, b_qkv),
                        (nh, nkv, hd, layer.input_layernorm.variance_epsilon, dtype, gpu))
            if grid is not None:  # onto the padded grid: (b T, ...) rows, zeros off the tokens
                qk = qk.new_zeros(b * T, nh + nkv, hd).index_copy(0, grid, qk)
                v = v.new_zeros(b * T, nkv, hd).index_copy(0, grid, v)
            qk, v = qk.view(b, T, nh + nkv, hd), v.view(b, T, nkv, hd).transpose(1, 2)  # v: (b, nkv, T, hd)
            q, k = qk.split([nh, nkv], dim=2)
            q = q.permute(0, 2, 1, 3).reshape(b, nkv, g * T, hd)  # kv head j's g query heads, stacked
            k = k.transpose(1, 2)  # (b, nkv, T, hd)
            kv_out.append((k, v))
            if prefix_kv is not None:
                k, v = torch.cat([prefix_kv[i][0], k], 2), torch.cat([prefix_kv[i][1], v], 2)  # (b, nkv, P+T, hd)
            o = attention(q, k, v, mask, self.scale).view(b, nh, T, hd).transpose(1, 2).reshape(b * T, nh * hd)
            if grid is not None:
                o = o.index_select(0, grid)  # (N, nh hd): back to the tokens
            x = post(x, o, layer.post_attention_layernorm.weight, (w_o, b_o, w_gu, w_down),
                     (nh, nkv, hd, layer.post_attention_layernorm.variance_epsilon, dtype, gpu))
        return x, kv_out

    # --- prompts and completions ------------------------------------------------------------------

    def prompts(self, ids: Tensor, mask: Tensor, pos: Tensor, dtype: torch.dtype, leaves: bool) -> PackedPrefix:
        """Each distinct prompt once: ids, mask (bool), pos (G, P), left-padded. ``leaves``: hand
        the outputs over as leaves (``PackedPrefix``), for a backward of their own."""
        G, P = ids.shape
        allow = torch.ones(P, P, dtype=torch.bool, device=ids.device).tril() & mask[:, None, :]  # (G, P, P)
        allow |= torch.eye(P, dtype=torch.bool, device=ids.device)  # a left pad looks at itself (never read; no NaN)
        x = self.decoder.embed_tokens(ids).reshape(G * P, -1)  # (G P, H)
        x, kv = self._layers(x, pos.reshape(-1), (None, G, P), None, additive(allow), dtype)
        states = rms_norm(x.view(G, P, -1)[:, -1:], self.decoder.norm, on_gpu(x))  # (G, 1, H): P-1 predicts token 0
        if not leaves:
            return PackedPrefix(states, kv, torch.arange(G, device=ids.device))
        outputs = [states, *(t for pair in kv for t in pair)]
        made = [t.detach().requires_grad_(t.requires_grad) for t in outputs]
        return PackedPrefix(made[0], list(zip(made[1::2], made[2::2])), torch.arange(G, device=ids.device), outputs,
                            made)

    def completions(self, ids: Tensor, loss_mask: Tensor, prompt_mask: Tensor, prefix: PackedPrefix,
                    dtype: torch.dtype) -> Tensor:
        """Final hidden states (b, T, H) at the positions that predict completion tokens ids (b, T):
        row r's state t predicts its token t, for t below its length (up to its last loss token;
        zeros after). Token t-1 is fed to predict token t; state 0 is the prompt's (``prefix``,
        taken for these rows)."""
        b, T = ids.shape
        cols = torch.arange(T, device=ids.device)
        Tf, grid = _PLANNED.get(loss_mask) or fed_layout(loss_mask)
        if Tf <= 0:
            return F.pad(prefix.states, (0, 0, 0, T - 1))
        P = prompt_mask.shape[1]
        # positions continue after the prompt
        pos = (prompt_mask.sum(1, keepdim=True) + cols[None, :Tf]).reshape(-1)[grid]
        allow = torch.cat([prompt_mask[:, None, :].expand(b, Tf, P),
                           torch.ones(Tf, Tf, dtype=torch.bool, device=ids.device).tril().expand(b, Tf, Tf)], -1)
        x = self.decoder.embed_tokens(ids[:, :Tf].reshape(-1)[grid])  # (N, H)
        x, _ = self._layers(x, pos, (grid, b, Tf), prefix.kv, additive(allow), dtype)
        x = rms_norm(x, self.decoder.norm, on_gpu(x))  # (N, H)
        fed_states = x.new_zeros(b * Tf, x.shape[-1]).index_copy(0, grid, x).view(b, Tf, -1)
        return F.pad(torch.cat([prefix.states.to(x.dtype), fed_states], 1), (0, 0, 0, T - 1 - Tf))  # (b, T, H)


def pre_attention(x: Tensor, rope: Tensor, norm_weight: Tensor, weights: tuple, spec: tuple) -> tuple[Tensor, Tensor]:
    """A layer's token-wise work before attention, over packed tokens x (N, H): RMSNorm, the fused q/k/v
    projection (``weights``: its weight and bias or None) and RoPE (``rope`` (N, 2, 1, hd): cos, then sin
    with its first half negated). Returns q and k (N, nh + nkv, hd) and v (N, nkv, hd), in the matmul
    dtype. ``spec``: (nh, nkv, hd, the norm's eps, the matmul dtype, GPU kernels), plain constants, so
    that trainer.compile compiles one graph a row count for every layer (model/compiled.py)."""
    nh, nkv, hd, eps, dtype, gpu = spec
    N = x.shape[0]
    qkv = F.linear(_rms(x, norm_weight, eps, gpu).to(dtype), *weights)  # (N, (nh + 2 nkv) hd)
    # RoPE on q and k in one go, as transformers' x cos + rotate_half(x) sin with rotate_half
    # written as roll(x) times a sin whose first half is negated (rollout_fast.rope)
    # split, not two slices: its backward is one cat, where each slice's makes a zero tensor of
    # qkv's size, copies its part in, and the two are added (6 kernels where 1 does)
    qk, v = qkv.split([(nh + nkv) * hd, nkv * hd], dim=-1)
    qk = qk.view(N, nh + nkv, hd)
    cos, sin = rope.unbind(1)  # (N, 1, hd) each
    return (qk * cos + qk.roll(hd // 2, -1) * sin).to(dtype), v.view(N, nkv, hd)


def post_attention(x: Tensor, o: Tensor, norm_weight: Tensor, weights: tuple, spec: tuple) -> Tensor:
    """A layer's token-wise work after attention: x (N, H) plus the output projection of o (N, nh hd),
    then plus the SwiGLU MLP of its RMSNorm. ``weights``: (o weight, o bias or None, gate/up, down);
    ``spec`` as ``pre_attention``'s."""
    w_o, b_o, w_gu, w_down = weights
    _, _, _, eps, dtype, gpu = spec
    x = x + F.linear(o, w_o, b_o)
    gate, up = F.linear(_rms(x, norm_weight, eps, gpu).to(dtype), w_gu).chunk(2, dim=-1)
    return x + F.linear(SiluMul.apply(gate, up) if gpu else F.silu(gate) * up, w_down)


def fed_layout(loss_mask: Tensor) -> tuple[int, Tensor]:
    """(Tf, grid) of ``completions``: the fed positions of the longest row (token t-1 is fed to predict
    token t, up to each row's last loss token), and each fed token's cell in the (b, Tf) grid (N,).
    Both read the mask back to the host (a max and a nonzero): ``plan_fed`` does it ahead of time."""
    b, T = loss_mask.shape
    cols = torch.arange(T, device=loss_mask.device)
    length = torch.where(loss_mask, cols + 1, 0).amax(1)  # (b,) last loss token + 1; tokens before it are fed
    Tf = int(length.max()) - 1 if b else 0
    fed = cols[None, :max(Tf, 0)] < (length - 1)[:, None]  # (b, Tf)
    return Tf, fed.reshape(-1).nonzero().squeeze(1)


# Layouts planned ahead (``plan_fed``), by the mask they were read from; an entry goes with its mask.
_PLANNED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def plan_fed(loss_mask: Tensor) -> None:
    """Read ``loss_mask``'s fed layout now, for the forward that later runs on it: the trainer plans all
    of a mini-batch's micro-batches before the first, so on a GPU no forward waits for the device
    (roles/trainer.py, ``_micro``). The mask must not change in place after (none does: masks are
    made, selected and trimmed, never written)."""
    _PLANNED[loss_mask] = fed_layout(loss_mask)


def on_gpu(x: Tensor) -> bool:
    """Whether the trunk takes its GPU kernels for x (fused RMSNorm, ``SiluMul``, the mask cast once): a
    function of its own so the tests run that branch on the CPU."""
    return x.is_cuda


def rms_norm(x: Tensor, norm: torch.nn.Module, fused: bool = False) -> Tensor:
    """transformers' LlamaRMSNorm (``norm``) over x (``_rms``)."""
    return _rms(x, norm.weight, norm.variance_epsilon, fused)


def _rms(x: Tensor, weight: Tensor, eps: float, fused: bool) -> Tensor:
    """transformers' LlamaRMSNorm, written out: in float32, cast back, then the weight. ``fused``, for a
    float32 x and weight (bf16 autocast over float32 masters): torch's ``rms_norm`` with the weight, the
    same x * rsqrt(mean(x^2) + eps) * w in float32, which on CUDA is one kernel each way keeping x and
    1/rms for the backward (on the CPU torch writes it out as above)."""
    if fused and x.dtype == weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class SiluMul(torch.autograd.Function):
    """silu(gate) * up, the SwiGLU product, keeping only gate and up for the backward and recomputing
    silu(gate) there: autograd's silu and mul keep silu(gate) too, a third tensor of the MLP's width
    (tokens x intermediate in bf16, 80 MB a layer at 8.2k tokens of the 0.5B shape). The backward runs the ops
    autograd's would (d up = g silu(gate), d gate = silu_backward(g up, gate)), so values and gradients
    are the same to the bit, for one more elementwise kernel a layer."""

    @staticmethod
    def forward(ctx, gate: Tensor, up: Tensor) -> Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, g: Tensor):
        gate, up = ctx.saved_tensors
        return torch.ops.aten.silu_backward(g * up, gate), g * F.silu(gate)


def additive(allow: Tensor) -> Tensor:
    """(b, T, L) bool -> (b, 1, 1, T, L) float32: 0 where allowed, -inf elsewhere."""
    return torch.zeros(allow.shape, device=allow.device).masked_fill_(~allow, float("-inf"))[:, None, None]


# The models whose forward runs packed: decoder module -> its trunk. Weak, so a dropped model
# (the end of a run, a test) takes its trunk and cached weights with it.
_TRUNKS: "weakref.WeakKeyDictionary[torch.nn.Module, PackedTrunk]" = weakref.WeakKeyDictionary()


def enable(model: torch.nn.Module) -> PackedTrunk:
    """Run ``model``'s trainer/reference forward (model/logprobs.py) on the packed trunk from now on."""
    trunk = PackedTrunk(model)
    _TRUNKS[trunk.decoder] = trunk
    return trunk


def disable(model: torch.nn.Module) -> None:
    """transformers' forward for ``model`` again (a model shared with a role that enabled it, later
    wrapped in LoRA adapters, say)."""
    if hasattr(model, "get_decoder"):
        _TRUNKS.pop(model.get_decoder(), None)


def trunk_of(module: torch.nn.Module) -> PackedTrunk | None:
    """The packed trunk of a decoder (or of the model holding it), when enabled."""
    found = _TRUNKS.get(module)
    if found is None and hasattr(module, "get_decoder"):
        found = _TRUNKS.get(module.get_decoder())
    return found


def clear_caches() -> None:
    """Every trunk drops its fused weights (after an optimizer step: logprobs.clear_cast_cache)."""
    for trunk in list(_TRUNKS.values()):
        trunk.clear()
