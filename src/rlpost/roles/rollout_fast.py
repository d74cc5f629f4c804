"""Rollout role on rlpost's own decode loop for Llama-family models: the same sampling maths as
``HFRollout``, about twice the tokens per second of `generate` with a static cache on CPU.

Why a loop of our own. At batch 32 one decode step of the 135M model is ~9 GFLOP, ~13 ms at this
machine's bf16 matmul peak, but a `generate` step takes ~100 ms: the rest is per-op overhead
(cache objects, mask building, logits processors, ~20 small ops per layer). This loop does the
same maths with fewer, larger ops (benchmarks/README.md measures each lever):

* **fused projections**: q/k/v is one matmul, gate/up is one matmul. The fused tensors *are* the
  weights: the HF module's ``q_proj.weight`` etc. are views into them, so weight sync through the
  HF state dict (``load_weights``) writes straight into what the loop reads. The one extra copy
  is the oneDNN-packed layout of each matmul weight (``_Linear``), made on the first `generate`
  after a sync or a ``sleep``.
* **a preallocated KV cache**: keys (layers, B, kv_heads, head_dim, P+T) and values
  (layers, B, kv_heads, P+T, head_dim), written in place.
* **prefill once per prompt**: each distinct prompt runs once and its KV is copied to its group's
  K rows (the group shares the prompt, so its K first-token distributions are the same row).
* **finished rows leave the batch**: when enough rows have hit EOS the cache is compacted, so the
  tail of long completions does not pay for the short ones.
* **continuous batching** (``slots``, roles/slots.py): with fewer decode slots than rows (a budget
  of KV cache), a finished row's slot goes to the next waiting row between two steps, its prompt's
  KV copied from its group's prefill into a ring of cache columns; a row draws with uniforms of its
  own (row, token index), so its samples do not depend on its slot or the slot count.
* **rows joining a running decode** (``sample_feed``, the endpoint's requests: roles/endpoint.py):
  between two steps new rows are prefilled and take free slots (the state grown for them), and each
  row is handed back the moment it ends (roles/slots.py: Admissions).
* **logits only where sampled**: the lm_head (576 x 49152, a fifth of the model's FLOPs per token)
  runs on the last position only.
* **weights between decode steps** (``between_steps``, partial rollouts): a hook its owner sets is
  called before every decode step and may load new weights; the rows running go on under them and
  each token records the version that drew it (``Rollouts.token_version``). The CUDA twin calls it
  where its host looks, every ``CHECK_EVERY`` steps (rollout_static.py).

What is sampled is exactly ``HFRollout``'s distribution: softmax(logits / T), top-p after, and
the recorded sampler log-prob is log softmax(logits / T) of the drawn token. Numerics mirror
transformers' bf16 forward (RMSNorm in float32, RoPE in the weights' dtype), so greedy completions
match `generate` token for token (tests/roles/test_rollout_fast.py). Architectures: ``llama``, and
``qwen2`` without sliding window (q/k/v biases); anything else falls back to ``HFRollout``.
Stop strings (multi-turn tool episodes) also go through ``HFRollout``'s path.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from rlpost.roles import sampling
from rlpost.roles.slots import Admissions, Batch, Prefixes, left_padded, row_uniforms
from rlpost.roles.rollout_hf import HFRollout, continue_ids, top_p_truncate
from rlpost.types.batch import Rollouts

SUPPORTED = ("llama", "qwen2")
# Compact the decode batch once this fraction of its rows has finished: compaction copies the
# whole cache, so doing it on every finished row would cost more than it saves.
COMPACT_FRACTION = 0.25
# Decode slots of a decode that admits rows while it runs (``sample_feed``) when ``slots`` is 0.
FEED_SLOTS = 64


def supported(model) -> bool:
    c = model.config
    return (c.model_type in SUPPORTED and getattr(c, "hidden_act", "silu") == "silu"
            and not getattr(c, "use_sliding_window", False) and getattr(c, "mlp_bias", False) is False)


class _Linear:
    """y = x W^T (+ b) with W in oneDNN's blocked layout while sampling, when this torch build has it.

    Repacking a bf16 weight once for oneDNN measured 1.2-1.6x faster per matmul here than
    F.linear, which reorders on every call (the lm_head: 5.7 ms against 8.8 ms at batch 32). The
    packed copy is opaque, so it is stale after every weight sync, and it is 0.27 GB for the 135M
    model: ``FastRollout`` packs on the first ``generate`` after a sync (0.2 s) and frees the
    copies in ``sleep``, which the loop calls before the trainer's update (the run's memory peak)."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None):
        self.weight, self.bias, self.packed = weight, bias, None

    def pack(self) -> None:
        try:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), 32)
        except (AttributeError, RuntimeError):  # a build without oneDNN: plain F.linear
            self.packed = None

    def __call__(self, x: Tensor) -> Tensor:
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


class _Layer:
    """One decoder layer's weights: fused q/k/v (and bias), o, fused gate/up, down, the two norms."""

    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        bias = _fuse([attn.q_proj, attn.k_proj, attn.v_proj], "bias") if attn.q_proj.bias is not None else None
        self.qkv = _Linear(_fuse([attn.q_proj, attn.k_proj, attn.v_proj]), bias)
        self.o = _Linear(attn.o_proj.weight)
        self.gate_up = _Linear(_fuse([mlp.gate_proj, mlp.up_proj]))
        self.down = _Linear(mlp.down_proj.weight)
        self.norm_in, self.norm_post = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        self.linears = [self.qkv, self.o, self.gate_up, self.down]


def _fuse(linears, attr: str = "weight") -> Tensor:
    """Concatenate the linears' weights (or biases) along the output dim, and make each linear's own
    parameter a view into the fused tensor, so the model holds one copy and a state-dict copy_ into
    the HF parameter updates the fused weights too."""
    parts = [getattr(m, attr) for m in linears]
    fused = torch.cat([p.detach() for p in parts], dim=0).contiguous()
    start = 0
    for m, p in zip(linears, parts):
        view = fused[start : start + p.shape[0]]
        setattr(m, attr, torch.nn.Parameter(view, requires_grad=p.requires_grad))
        start += p.shape[0]
    return fused


class FastRollout:
    """The rollout role on this decode loop. It holds an ``HFRollout`` over the same model (by
    composition): that one owns the sampler's copy of the weights, its sync and its sleep, turns
    rows into prompts and samples into a batch, and samples with stop strings (tool episodes)."""

    def __init__(self, model: torch.nn.Module, tokenizer, dtype: torch.dtype | None = None, slots: int = 0):
        self.hf = HFRollout(model, tokenizer, dtype)  # None: the dtype the precision probe chose
        self.model, self.tok, self.dtype = self.hf.model, tokenizer, self.hf.dtype
        self.last_metrics: dict = {}
        c = self.model.config
        self.nh, self.nkv = c.num_attention_heads, c.num_key_value_heads
        self.hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.eps = c.rms_norm_eps
        core = self.model.model
        self.layers = [_Layer(layer) for layer in core.layers]
        self.embed, self.norm = core.embed_tokens.weight, core.norm.weight
        self.lm_head = _Linear(self.model.get_output_embeddings().weight)  # the embedding itself when tied
        self.rotary = core.rotary_emb
        self.packed = False  # the matmul weights are in oneDNN's layout (_Linear) until the next sync or sleep
        # Decode slots: rows decoded at once, each freed slot refilled by a waiting row (roles/slots.py);
        # 0: one slot per row of the call (every row at once, the fastest on a CPU while memory allows)
        self.slots = slots
        # Partial rollouts (dist.partial_rollouts, distributed/actors.py): called with this engine between
        # two decode steps, it may load new weights; the batch then records each token's version
        self.between_steps: Callable[["FastRollout"], None] | None = None
        self.token_version: Tensor | None = None  # (B, T) int64 of the last call, when between_steps is set
        self.admitting: Admissions | None = None  # the rows joining the running decode, under sample_feed

    @property
    def version(self) -> int:
        return self.hf.version

    @property
    def eos_ids(self) -> Tensor:  # the end-of-sequence ids are the HFRollout's: one place decides
        return self.hf.eos_ids

    @property
    def eos_set(self) -> set[int]:
        return self.hf.eos_set

    def render(self, rows: list[dict]) -> list[str]:
        return self.hf.render(rows)

    @torch.no_grad()
    def generate(self, rows: list[dict], n: int, temperature: float, top_p: float, max_new_tokens: int) -> Rollouts:
        """n completions of each row; temperature 0 = greedy (no log-probs recorded)."""
        enc = self.hf.encode(rows)
        start, self.token_version = self.version, None
        completion, sampler_logp, floor = self._sample((enc.input_ids, enc.attention_mask), n, temperature, top_p,
                                                       max_new_tokens)
        out = self.hf.assemble(enc, rows, n, completion, sampler_logp, floor)
        if self.between_steps is not None and self.token_version is not None:  # weights may have changed mid-call
            out.token_version = self.token_version * out.completion_mask
            out.policy_version = start  # the oldest token's: the staleness bound holds for every token
        return out

    def sample_ids(self, seqs: list[list[int]], temperature: float, top_p: float, max_new_tokens: int,
                   stop_strings: list[str]) -> list[tuple[list[int], list[float], str]]:
        """As ``HFRollout.sample_ids`` (rollout_hf.continue_ids), on this loop when there are no stop strings."""
        return continue_ids(self, seqs, temperature, top_p, max_new_tokens, stop_strings)

    @property
    def admits(self) -> bool:
        """Whether rows may join a running decode (``sample_feed``): this CPU loop's, not its CUDA twin's."""
        return type(self)._decode is FastRollout._decode

    def sample_feed(self, feed: Callable, done: Callable, temperature: float, top_p: float) -> int:
        """Decode rows as they come (the endpoint's requests, roles/endpoint.py): ``feed(room)`` gives
        up to ``room`` rows (prompt ids, max_new) or none (room None: all that wait), asked first and
        then between every two decode steps, and each row joins the running decode (roles/slots.py:
        Admissions); ``done(i, ids, logps, how)`` gets row i's drawn ids and sampler log-probs the moment
        it ends ('eos' or 'length'; i counts the rows in the order fed). A row draws as ``sample_ids``
        draws it without stop strings. Returns the rows decoded."""
        first = feed(None)
        if not first:
            return 0
        ids, mask = left_padded([r[0] for r in first], self.tok.pad_token_id)
        limits = [r[1] for r in first]
        admit = Admissions(self, feed, done, self.slots or max(len(first), FEED_SLOTS), limits)
        return self.decode_admitting(admit, (ids, mask.bool()), 1, (temperature, top_p, max(limits)))

    def decode_admitting(self, admit, prompt: tuple[Tensor, Tensor], n: int, sample: tuple[float, float, int]) -> int:
        """Decode ``prompt`` (left-padded ids, boolean mask), ``n`` rows a prompt, while ``admit`` lets rows
        join between steps: its ``first`` (the first rows' limits), ``poll``, ``slots`` and ``report``
        (roles/slots.py: Admissions; a rollout worker's chunks: roles/chunk_stream.py). sample: (temperature,
        top_p, max_new). Returns the rows decoded."""
        self._pack()
        self.admitting = admit
        try:
            with torch.no_grad():
                return self._decode(*prompt, n, *sample)
        finally:
            self.admitting = None

    def close(self) -> None:
        self.hf.close()

    # --- the forward, mirroring transformers' Llama numerics -------------------------------------

    def _rms(self, x: Tensor, w: Tensor) -> Tensor:
        return w * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)

    def rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:  # x (b, s, h, hd); cos, sin (b, s, 1, hd)
        """transformers' x * cos + rotate_half(x) * sin, with rotate_half(x) = (-x2, x1) written as
        roll(x) = (x2, x1) times a ``sin`` whose first half is negated (cos_sin): the same products,
        bit for bit, in two ops fewer."""
        return x * cos + x.roll(x.shape[-1] // 2, -1) * sin

    def _layers(self, x: Tensor, cos: Tensor, sin: Tensor, cache: tuple[Tensor, Tensor], kmask: Tensor) -> Tensor:
        """Prefill: run all layers on x (b, s, H), the prompts, whose tokens fill cache slots [0, s);
        attention (SDPA) sees the slots where the boolean kmask (b, 1, s, s) is True. Writes their K/V
        into the cache: keys transposed (layers, B, nkv, hd, L), so a decode step's q @ K needs no copy
        (``_step``), and values (layers, B, nkv, L, hd). RoPE turns q and k in one go: they sit side by
        side in qkv."""
        kc, vc = cache
        b, s, _ = x.shape
        nq, nk = self.nh * self.hd, self.nkv * self.hd
        for i, L in enumerate(self.layers):
            qkv = L.qkv(self._rms(x, L.norm_in))  # (b, s, nq + 2 nk)
            qk = self.rope(qkv[..., : nq + nk].view(b, s, self.nh + self.nkv, self.hd), cos, sin)
            q, k = qk[:, :, : self.nh].transpose(1, 2), qk[:, :, self.nh :].transpose(1, 2)  # (b, heads, s, hd)
            kc[i, :b, :, :, :s] = k.transpose(-1, -2)
            vc[i, :b, :, :s] = qkv[..., nq + nk :].view(b, s, self.nkv, self.hd).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, kc[i, :b, :, :, :s].transpose(-1, -2), vc[i, :b, :, :s],
                                               attn_mask=kmask, enable_gqa=self.nkv != self.nh)
            x = self._mlp(x + L.o(o.transpose(1, 2).reshape(b, s, nq)), L)
        return x

    def _step(self, x: Tensor, cos: Tensor, sin: Tensor, views: list[tuple[Tensor, Tensor]], at: int,
              kmask: Tensor) -> Tensor:
        """One decode step through all layers, in few ops (a step is ~2,100 small ops at a few rows,
        each ~5 us of dispatch): x (b, 1, H) one new token per row at cache column ``at``; ``views``:
        each layer's cache for the live rows, keys (b, nkv, hd, C) and values (b, nkv, C, hd); cos, sin
        (b, 1, hd); kmask (b, 1, 1, L) additive (``attend_step``) over the first L columns, the
        columns written so far (the whole ring once it has wrapped, roles/slots.py)."""
        b, nh, nkv, hd, cols = x.shape[0], self.nh, self.nkv, self.hd, kmask.shape[-1]
        nq, nk = nh * hd, nkv * hd
        for L, (kl, vl) in zip(self.layers, views):
            qkv = L.qkv(self._rms(x, L.norm_in))  # (b, 1, nq + 2 nk)
            qk = self.rope(qkv[:, 0, : nq + nk].view(b, nh + nkv, hd), cos, sin)  # (b, nh + nkv, hd)
            kl[..., at] = qk[:, nh:]  # this token's keys, column at of (b, nkv, hd, L)
            vl[:, :, at] = qkv[:, 0, nq + nk :].view(b, nkv, hd)
            o = self.attend_step(qk[:, :nh], kl[..., :cols], vl[:, :, :cols], kmask)
            x = self._mlp(x + L.o(o.view(b, 1, nq)), L)
        return x

    def attend_step(self, q: Tensor, kt: Tensor, v: Tensor, kmask: Tensor) -> Tensor:  # -> (b, nh * hd)
        """A decode step's attention: q (b, nh, hd), one query per row, over keys kt (b, nkv, hd, L)
        and values v (b, nkv, L, hd). Two small bmms, which measured ~10x faster than CPU SDPA's flash
        kernel at this size, with q stacked by kv head (each kv head serves nh / nkv consecutive query
        heads, transformers' repeat_kv order), so they need no broadcast copies and their output is
        already in transformers' head order. The float32 kmask (b, 1, 1, L) of 0 and -inf is added to
        the scores: 0 + scores * scale is eager's float32 scores * scale exactly, in one op where a
        boolean mask took three; softmax in float32 as in eager (tests check the bits)."""
        b, (nkv, hd, L), g = q.shape[0], kt.shape[1:], self.nh // self.nkv
        s = torch.bmm(q.reshape(b * nkv, g, hd), kt.view(b * nkv, hd, L))  # (b nkv, g, L)
        p = torch.add(kmask, s.view(b, nkv, g, L), alpha=hd**-0.5).softmax(-1).to(v.dtype)
        return torch.bmm(p.view(b * nkv, g, L), v.view(b * nkv, L, hd)).view(b, nkv * g * hd)

    def _mlp(self, x: Tensor, L) -> Tensor:  # x + the layer's SwiGLU MLP of its post-attention norm
        gate, up = L.gate_up(self._rms(x, L.norm_post)).chunk(2, dim=-1)
        return x + L.down(F.silu(gate) * up)

    def _logits(self, x: Tensor) -> Tensor:  # (b, H) last-position states -> (b, V) float32
        return self.lm_head(self._rms(x, self.norm)).float()

    def cos_sin(self, pos: Tensor) -> tuple[Tensor, Tensor]:  # pos (b, s) -> (b, s, 1, hd) each
        """transformers' rotary cos and sin at these positions; sin with its first half negated (rope)."""
        cos, sin = self.rotary(self.embed[:1], pos)
        sin = torch.cat((-sin[..., : self.hd // 2], sin[..., self.hd // 2 :]), dim=-1)
        return cos.unsqueeze(2), sin.unsqueeze(2)

    # --- sampling -----------------------------------------------------------------------------

    def _sample(self, prompt: tuple[Tensor, Tensor], n: int, temperature: float, top_p: float, max_new_tokens: int,
                stop_strings: list[str] | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        input_ids, attention_mask = prompt  # (B, P) each: the left-padded prompts, their mask
        if stop_strings:
            return self.hf._sample(prompt, n, temperature, top_p, max_new_tokens, stop_strings)
        self._pack()
        with torch.no_grad():  # not inference_mode: its tensors could not enter the trainer's autograd graph
            return self._decode(input_ids, attention_mask.bool(), n, temperature, top_p, max_new_tokens)

    def _pack(self) -> None:
        self.hf._check_awake()
        if not self.packed:
            for lin in self.linears():
                lin.pack()  # the current weights in oneDNN's layout, until the next sync or sleep (_Linear)
            self.packed = True

    def _decode(self, ids: Tensor, mask: Tensor, n: int, temperature: float, top_p: float,
                max_new: int) -> tuple[Tensor, Tensor, Tensor | None] | int:
        """(completion (G*n, T) int64 padded after EOS, sampler log-probs (G*n, T) float32, top-p
        thresholds (G*n, T) float32 or None: HFRollout._sample's contract), on ``self.slots`` decode
        slots (0: one per row), each freed slot refilled by the next waiting row (roles/slots.py).
        Under ``sample_feed`` (``admitting``) rows also join between steps, each handed back as it ends;
        returns the rows decoded."""
        G, P, admit = *ids.shape, self.admitting
        B = G * n
        S = min(B, self.slots) if self.slots else B
        st = _State(self, S, P + max_new, B, max_new)
        st.floor = torch.zeros(B, max_new) if 0 < top_p < 1.0 and temperature > 0 else None
        st.key = sampling.new_key(ids.device) if temperature > 0 else torch.zeros(2, dtype=torch.long)
        batch = Batch(self, Prefixes(self, ids, mask, -(-S // n)), n, (temperature, top_p, max_new, self.eos_ids),
                      admit.first if admit else None)
        b, col, steps, views = 0, P, 0, None  # b: the live slots are the first b; col: the step's cache column
        while True:
            if admit is not None and admit.poll(st, batch, b, col):  # rows joining; the state grew for them
                views = None
            b = self._fill(batch, st, b, col, admit)
            live = ~st.finished[:b]
            if not bool(live.any()):
                break
            if self.between_steps is not None:  # only where a step follows: weights taken after the last token
                self._take_weights()           # would change no token and count as taken in flight
            if not batch.waiting and 1 - live.float().mean() >= COMPACT_FRACTION:  # drop finished rows
                b = st.compact(live.nonzero().squeeze(1))
            if views is None or len(views[0][0]) != b:  # each layer's cache, live rows only
                views = [(k[:b], v[:b]) for k, v in zip(st.k, st.v)]
            at, C = col % st.C, st.C
            st.mask[:b, at] = 0.0  # the column this step writes is each row's from now on
            cos, sin = self.cos_sin(st.pos[:b, None])
            x = self._step(self.embed[st.tok[:b]][:, None], cos[:, 0], sin[:, 0], views, at,
                           st.mask[:b, None, None, : max(min(col + 1, C), st.reach)])
            before = st.finished[:b].clone() if admit is not None else None
            self._record(st, b, self._logits(x[:, 0]), (temperature, top_p, max_new))
            if admit is not None:  # each row handed back as it ends
                admit.report(st, (st.finished[:b] & ~before).nonzero().squeeze(1))
            col, steps = col + 1, steps + 1
        self.last_metrics = {"rollout/decode_steps": steps, "rollout/slots": len(st.mask)}
        if admit is not None:
            return batch.B
        out = st.collect(self.eos_ids)
        self.token_version = st.ver[:, : out[0].shape[1]]
        return out

    def _fill(self, batch: Batch, st: "_State", b: int, col: int, admit: Admissions | None) -> int:
        """Freed slots (and, admitting, new ones) to the next waiting rows (a first token may be EOS: look
        again); the live slots' count, which only grows here."""
        while batch.waiting:
            free = admit.slots(st, b) if admit is not None else st.finished[:b].nonzero().squeeze(1).tolist()
            if not free and b == 0:  # the decode's first rows
                free = list(range(len(st.mask)))
            if not free:
                break
            idx = self._enter(batch, st, free, col)
            b = max(b, int(idx.max()) + 1)
            if admit is not None:
                admit.report(st, idx[st.finished[idx]])
        return b

    def _enter(self, batch: Batch, st: "_State", slots: list[int], col: int) -> Tensor:
        """``batch.enter`` (roles/slots.py), each entering row's first token stamped with the version held
        now (its prompt's cached prefill may be older under continuous batching; its recorded
        log-prob is the one that drew it either way)."""
        idx = batch.enter(st, slots, col)
        st.ver[st.slot[idx], 0] = self.version
        return idx

    def _take_weights(self) -> None:
        """The hook between two decode steps (partial rollouts): its owner may load new weights now.
        The rows running go on under them; the keys and values cached so far stay as the old weights
        wrote them (as AReaL's interruptible generation keeps them), and each token records the
        version and the log-prob that drew it, which is all the importance correction needs."""
        self.between_steps(self)
        if not self.packed:  # load_weights dropped the packed copies: this call's remaining steps want them
            for lin in self.linears():
                lin.pack()
            self.packed = True

    def _record(self, st: "_State", b: int, logits: Tensor, sample: tuple[float, float, int]) -> None:
        """Draw the next token of the first ``b`` slots' rows, each with its own (row, token index)
        uniform, and record it for the rows still running."""
        temperature, top_p, max_new = sample
        rows, t = st.slot[:b], st.t[:b]
        tok, lp, floor = self.draw_tokens(logits, temperature, top_p, row_uniforms(st, rows, t))
        live = ~st.finished[:b]
        r, c = rows[live], t[live]
        st.out[r, c], st.logp[r, c], st.ver[r, c] = tok[live], lp[live], self.version
        if st.floor is not None:
            st.floor[r, c] = floor[live]
        st.tok[:b], st.pos[:b], st.t[:b] = tok, st.pos[:b] + 1, t + live
        st.finished[:b] |= torch.isin(tok, self.eos_ids) | (st.t[:b] >= st.limit[:b])

    def draw_tokens(self, logits: Tensor, temperature: float, top_p: float,
              u: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """(token (b,), its log-prob under the distribution drawn from: softmax(logits / T),
        truncated to top-p and renormalised when top_p < 1; the top-p threshold (b,) or None);
        greedy when temperature is 0. ``u`` (b,): each row's uniform (sampling.uniforms), torch.rand's when None."""
        if temperature == 0:
            return logits.argmax(-1), logits.new_zeros(len(logits)), None
        if top_p >= 1.0:  # the full softmax: a two-level inverse CDF, a few passes over the logits (roles/sampling.py)
            tok, lp = sampling.draw(logits / temperature, u)
            return tok, lp, None
        logp = (logits / temperature).log_softmax(-1)  # (b, V) the policy the trainer optimises
        # the trainer truncates at the same threshold (Rollouts.sampler_floor)
        logp, floor = top_p_truncate(logp, top_p)
        # Inverse-CDF sampling: one uniform per row against the cumulative distribution. Exact;
        # the profiler charged torch.multinomial 25 ms per step, but end to end the two measured
        # the same (benchmarks/rollout_levers.py: 1.02x).
        cdf = logp.exp().cumsum(-1)  # (b, V)
        u = (torch.rand(len(cdf), device=cdf.device) if u is None else u)[:, None] * cdf[:, -1:]
        tok = torch.searchsorted(cdf, u, side="right").squeeze(1).clamp(max=cdf.shape[1] - 1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(1), floor

    def load_weights(self, state: dict[str, Tensor], version: int | None = None) -> None:
        """Weight sync: the HF parameters are views into the fused weights, so the copy lands
        there; the packed copies are stale and go."""
        self.hf.load_weights(state, version)
        self._unpack()

    def sleep(self, discard_weights: bool = False) -> None:
        """Free the packed weight copies (0.27 GB here) until the next ``generate``, and the
        weights too when asked (HFRollout.sleep)."""
        self._unpack()
        self.hf.sleep(discard_weights)

    def _unpack(self) -> None:
        for lin in self.linears():
            lin.packed = None
        self.packed = False

    def linears(self) -> list[_Linear]:
        """Every packed matmul weight: each layer's four, then the lm_head."""
        return [*(lin for L in self.layers for lin in L.linears), self.lm_head]


class _State:
    """The CPU loop's decode state (what roles/slots.py reads and writes by name): the ring KV cache of
    ``S`` slots x ``C`` columns, each slot's additive mask, next token, position, tokens drawn, output
    row and finished flag, and the B output rows."""

    def __init__(self, engine: FastRollout, S: int, C: int, B: int, max_new: int):
        layers, nkv, hd = len(engine.layers), engine.nkv, engine.hd
        self.C = C
        # zeros, not empty: a row admitted mid-decode may read columns no row wrote (masked, but 0 * NaN is NaN)
        self.k = torch.zeros(layers, S, nkv, hd, C, dtype=engine.dtype)  # keys, transposed
        self.v = torch.zeros(layers, S, nkv, C, hd, dtype=engine.dtype)
        self.mask = torch.full((S, C), float("-inf"))
        self.tok, self.pos, self.t, self.slot = (torch.zeros(S, dtype=torch.long) for _ in range(4))
        self.limit = torch.full((S,), max_new)  # each slot's row is done after this many tokens
        self.reach = 0  # columns every step reads at least (admitted rows whose prompt wrapped: all C)
        self.finished = torch.ones(S, dtype=torch.bool)
        self.out = torch.full((B, max_new), engine.tok.pad_token_id, dtype=torch.long)
        self.logp = torch.zeros(B, max_new)
        self.ver = torch.zeros(B, max_new, dtype=torch.long)  # the weight version that drew each token
        self.floor: Tensor | None = None
        self.key: Tensor | None = None
        self.rkey: Tensor | None = None  # (B, 2) each row's own key, where rows joined with theirs (slots.row_uniforms)

    def compact(self, keep: Tensor) -> int:
        """Move the ``keep`` slots to the front; returns how many there are."""
        m = len(keep)
        for c in (self.k, self.v):
            c[:, :m] = c[:, keep]  # the right side is a gathered copy, so overlapping rows are safe
        for t in (self.mask, self.tok, self.pos, self.t, self.slot, self.limit, self.finished):
            t[:m] = t[keep]
        return m

    def collect(self, eos: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """The output rows cut to the longest completion (up to its EOS), as `generate` returns them."""
        max_new = self.out.shape[1]
        is_eos = torch.isin(self.out, eos)
        T = int(torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, max_new).max())
        return self.out[:, :T], self.logp[:, :T], self.floor[:, :T] if self.floor is not None else None
