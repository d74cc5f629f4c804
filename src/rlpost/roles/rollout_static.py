"""The own engine's GPU path: a static KV cache, a decode step of fixed shapes, captured once as a
CUDA graph, that samples on the device and never waits for the host.

Why. On an H100 a decode step of a 0.5B model at 128 rows reads 0.8 GB of weights, ~0.25 ms at the
HBM's pace; transformers' `generate` took ~28 ms a step there, the time to launch its few thousand
small kernels one by one from Python. A CUDA graph launches them all at once. Capturing needs
every tensor a step touches to keep its address and shape from one step to the next, so:

* **the arena** (``_Arena``): the KV cache for the batch's rows and a fixed number of columns
  (prompt + completion, rounded up to ``COLUMNS``), the token each row feeds next, its position,
  the cache column and output column (device scalars the step advances itself), the additive
  attention mask, the finished flags and the output buffers. Allocated once and reused by every
  ``generate`` it fits (a larger one replaces it, ``GROW``). A small model's arena, graphs and
  sampler weights stay through the trainer's update (``KEEP_FRACTION`` of the GPU's memory): a
  larger one's go in ``sleep``, and the next ``generate`` captures again;
* **one step function** (``_advance``): feed each row's token, write its keys and values at the
  current column, attend over every column (the mask hides those not yet written), draw the next
  token (roles/sampling.py, on the device), record it and its log-prob at the output column, flag
  rows that drew EOS. The captured graph and the eager path (the CPU, where the tests run it
  against `generate`) call this same function; capture is the thin wrapper ``_runner``;
* **EOS checked every few steps** (``CHECK_EVERY``): the host looks at the finished flags once per
  that many steps, the only synchronisation of the loop. A finished row writes padding until then;
* **rows that finish free their slot**: the batch runs at a size from a short ladder of buckets
  (the batch, then powers of two down to ``MIN_BUCKET``); once the live rows fit a smaller bucket
  they are moved to the front of the arena and that bucket's graph takes over. Every bucket is
  captured before the prompts are prefilled, since capturing runs (warms up) the step.

The prefill (each distinct prompt once, its KV copied to its group's rows) and the maths of a
layer are ``FastRollout``'s (roles/rollout_fast.py), without its oneDNN weight packing. What is
sampled and recorded is the same distribution as ``HFRollout``'s: tests/roles/test_rollout_static.py
holds it to `generate` (greedy tokens, sampler log-probs, the sampled frequencies).
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import torch
from torch import Tensor

from rlpost.console import say
from rlpost.model import device
from rlpost.model.budgets import KEEP_FRACTION
from rlpost.model.logprobs import position_ids
from rlpost.roles.rollout_fast import FastRollout

CHECK_EVERY = 8  # decode steps between the host's looks at the finished flags (its one synchronisation)
MIN_BUCKET = 8  # the smallest batch a graph is captured for: below it a GPU step costs the same
COLUMNS = 64  # the cache's columns are a multiple of this
GROW = 1.25  # an arena too small is replaced by one this much larger (prompt lengths vary from step to step)
WARMUP = 2  # eager steps on a side stream before a bucket's first capture (cuBLAS and allocator set-up)


def buckets(rows: int) -> list[int]:
    """The batch sizes a decode of ``rows`` rows may run at, largest first: ``rows`` itself, then
    the powers of two below it down to MIN_BUCKET (128 -> 128, 64, 32, 16, 8; 100 -> 100, 64, ...)."""
    out, b = [rows], 1 << (max(rows - 1, 1)).bit_length() - 1
    while b >= MIN_BUCKET and b < rows:
        out.append(b)
        b //= 2
    return out


def fitting(ladder: list[int], live: int) -> int:
    """The smallest bucket that holds ``live`` rows."""
    return min(b for b in ladder if b >= live)


class _Arena:
    """Every tensor a decode step reads or writes, at fixed addresses: ``rows`` rows (and one
    scratch output row, where empty slots write) x ``columns`` cache columns."""

    def __init__(self, engine: "StaticRollout", rows: int, columns: int, dev: torch.device):
        layers, nkv, hd, dtype = len(engine.layers), engine.nkv, engine.hd, engine.dtype
        self.rows, self.columns = rows, columns
        # zeros, not empty: a warm-up step reads the cache and the mask before anything is written
        self.k = torch.zeros(layers, rows, nkv, hd, columns, dtype=dtype, device=dev)  # keys, transposed
        self.v = torch.zeros(layers, rows, nkv, columns, hd, dtype=dtype, device=dev)
        self.tok = torch.zeros(rows, dtype=torch.long, device=dev)  # the token each row feeds next
        self.pos = torch.zeros(rows, dtype=torch.long, device=dev)  # its position id
        self.col = torch.zeros(1, dtype=torch.long, device=dev)  # the cache column it goes to (every row's)
        self.t = torch.zeros(1, dtype=torch.long, device=dev)  # the output column the next draw goes to
        self.mask = torch.zeros(rows, columns, device=dev)  # additive: 0 where a row attends, -inf elsewhere
        self.finished = torch.zeros(rows, dtype=torch.bool, device=dev)
        self.slot = torch.arange(rows, device=dev)  # decode row -> output row (``rows``: the scratch row)
        self.out = torch.zeros(rows + 1, columns, dtype=torch.long, device=dev)
        self.logp = torch.zeros(rows + 1, columns, device=dev)
        self.floor = torch.zeros(rows + 1, columns, device=dev)
        positions = torch.arange(columns, device=dev)[None]
        cos, sin = engine._cos_sin(positions)  # (1, columns, 1, hd): the rotary table, once
        self.cos, self.sin = cos[0, :, 0], sin[0, :, 0]  # (columns, hd)
        self.graphs: dict[tuple, object] = {}  # (bucket, temperature, top_p) -> its step, captured or eager
        self.pool = None  # the captured graphs' shared memory pool

    def scratch(self) -> None:
        """A state any step may run on (warm-up and capture run real steps): nothing finished,
        every column attended, counters at 0."""
        self.tok.zero_(), self.pos.zero_(), self.col.zero_(), self.t.zero_(), self.mask.zero_()
        self.finished.zero_()
        self.slot.copy_(torch.arange(self.rows, device=self.slot.device))


class StaticRollout(FastRollout):
    """``FastRollout`` on a static arena, its decode step a CUDA graph where the model is on CUDA
    (``capture``), run eagerly elsewhere: the same function either way (module docstring)."""

    def __init__(self, model: torch.nn.Module, tokenizer, dtype: torch.dtype | None = None):
        super().__init__(model, tokenizer, dtype)
        self.dev = device.of(self.model)
        self.capture = device.is_cuda(self.dev)
        self.eos_dev = self.eos_ids.to(self.dev)
        self.arena: _Arena | None = None
        self.warm: set[tuple] = set()  # steps warmed up in this process: later captures skip it
        self.said = False  # the first capture's line
        self.buckets_used: list[int] = []  # the batch sizes the last decode ran at (tests read it)

    # --- the step ---------------------------------------------------------------------------------

    def _advance(self, a: _Arena, b: int, temperature: float, top_p: float) -> None:
        """One decode step of the arena's first ``b`` rows, in place: every shape fixed, no host sync."""
        nh, nkv, hd = self.nh, self.nkv, self.hd
        nq, nk = nh * hd, nkv * hd
        pos = a.pos[:b]
        cos, sin = a.cos[pos][:, None], a.sin[pos][:, None]  # (b, 1, hd)
        mask = a.mask[:b].index_fill_(1, a.col, 0.0)  # this step's column is attended from now on
        x = self.embed[a.tok[:b]][:, None]  # (b, 1, H)
        for i, L in enumerate(self.layers):
            kl, vl = a.k[i, :b], a.v[i, :b]  # (b, nkv, hd, C), (b, nkv, C, hd)
            qkv = L.qkv(self._rms(x, L.norm_in))  # (b, 1, nq + 2 nk)
            qk = self._rope(qkv[:, 0, : nq + nk].view(b, nh + nkv, hd), cos, sin)  # (b, nh + nkv, hd)
            kl.index_copy_(3, a.col, qk[:, nh:, :, None])
            vl.index_copy_(2, a.col, qkv[:, 0, nq + nk :].reshape(b, nkv, 1, hd))
            o = self._attend_step(qk[:, :nh], kl, vl, mask[:, None, None, :])
            x = self._mlp(x + L.o(o.view(b, 1, nq)), L)
        self._emit(a, b, self._logits(x[:, 0]), temperature, top_p)
        a.pos[:b] += 1
        a.col += 1

    def _emit(self, a: _Arena, b: int, logits: Tensor, temperature: float, top_p: float) -> None:
        """Draw each of the first ``b`` rows' next token from ``logits`` (b, V) and record it, its
        log-prob and top-p threshold at output column a.t (padding for rows already finished)."""
        tok, lp, floor = self._draw(logits, temperature, top_p)
        done, where = a.finished[:b], (a.slot[:b], a.t.expand(b))
        a.out.index_put_(where, tok.masked_fill(done, self.tok.pad_token_id))
        a.logp.index_put_(where, lp.masked_fill(done, 0.0))
        if floor is not None:
            a.floor.index_put_(where, floor.masked_fill(done, 0.0))
        done |= (tok[:, None] == self.eos_dev).any(1)  # torch.isin may sort, and sync, on a GPU
        a.tok[:b] = tok
        a.t += 1

    def _runner(self, a: _Arena, b: int, temperature: float, top_p: float):
        """The step for batch size ``b`` as a callable: ``_advance`` itself, or on CUDA its graph's
        replay. The first time this process makes a step it runs it WARMUP times first (on CUDA on
        a side stream, as capturing asks): that moves the arena, which the caller resets (``_prepare``)."""
        key = (b, temperature, top_p)
        if key not in a.graphs:
            step = lambda: self._advance(a, b, temperature, top_p)
            if key not in self.warm:
                self._warm_up(step)
                self.warm.add(key)
            a.graphs[key] = self._capture(a, step) if self.capture else step
        return a.graphs[key]

    def _warm_up(self, step) -> None:
        side = torch.cuda.Stream() if self.capture else None  # a CUDA device only: never in CI
        if side is not None:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side) if side is not None else nullcontext():
            for _ in range(WARMUP):
                step()
        if side is not None:
            torch.cuda.current_stream().wait_stream(side)

    @staticmethod
    def _capture(a: _Arena, step):
        """``step`` captured as a CUDA graph (a CUDA device only: never in CI); returns its replay."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=a.pool):  # the buckets share one pool: they never run at once
            step()
        a.pool = graph.pool()
        return graph.replay

    # --- a whole decode -----------------------------------------------------------------------------

    def _sample(self, input_ids: Tensor, attention_mask: Tensor, n: int, temperature: float, top_p: float,
                max_new_tokens: int, stop_strings: list[str] | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        if stop_strings:
            return self.hf._sample(input_ids, attention_mask, n, temperature, top_p, max_new_tokens, stop_strings)
        self.hf._check_awake()
        home = input_ids.device
        with torch.no_grad():
            out = self._decode(input_ids.to(self.dev), attention_mask.to(self.dev).bool(), n, temperature, top_p,
                               max_new_tokens)
        return tuple(x.to(home) if x is not None else None for x in out)

    def _arena_for(self, rows: int, columns: int) -> _Arena:
        """The arena, replaced by a larger one (its graphs dropped) when this call needs more rows or columns."""
        a = self.arena
        if a is None or a.rows < rows or a.columns < columns:
            if a is not None and a.columns < columns:  # lengths vary: leave room for the next few
                columns = max(columns, int(a.columns * GROW))
            rows = max(rows, a.rows if a is not None else 0)
            self.arena = None  # the old one's memory first
            self.arena = _Arena(self, rows, -(-columns // COLUMNS) * COLUMNS, self.dev)
        return self.arena

    def _prepare(self, a: _Arena, ladder: list[int], temperature: float, top_p: float) -> dict:
        """Every bucket's step made (captured on CUDA) before the decode's own state is set; the
        first capture of the run says in one line what it cost."""
        t0, fresh = time.perf_counter(), [b for b in ladder if (b, temperature, top_p) not in a.graphs]
        for b in fresh:
            a.scratch()
            self._runner(a, b, temperature, top_p)
        a.scratch()
        seconds = time.perf_counter() - t0
        if self.capture and fresh and not self.said:
            self.said = True
            kept = ("kept through the updates" if self.keeps() else
                    "given back before each update and captured again after it, without the warm-up")
            say(f"rollout: decode step captured as CUDA graphs for batch sizes {', '.join(map(str, fresh))} in "
                f"{seconds:.1f} s, warm-up included (paid once; the graphs and the KV cache are {kept})")
        return {"rollout/capture_s": seconds} if self.capture else {}

    def _decode(self, ids: Tensor, mask: Tensor, n: int, temperature: float, top_p: float,
                max_new: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """HFRollout._sample's contract, on the device: (completion (G*n, T), sampler log-probs (G*n, T),
        top-p thresholds (G*n, T) or None)."""
        G, P = ids.shape
        B, dev = G * n, ids.device
        ladder = buckets(B)
        a = self._arena_for(ladder[0], P + max_new)
        metrics = self._prepare(a, ladder, temperature, top_p)
        # 1. Prefill each distinct prompt once, then copy its KV to its group's n rows.
        pos = position_ids(mask)  # (G, P)
        kmask = torch.ones(P, P, dtype=torch.bool, device=dev).tril() & mask[:, None, None, :]  # (G, 1, P, P)
        kmask |= torch.eye(P, dtype=torch.bool, device=dev)  # a left pad attends itself (never read; avoids NaN)
        x = self._layers(self.embed[ids], *self._cos_sin(pos), (a.k, a.v), kmask)  # (G, P, H)
        if n > 1:
            a.k[:, :B, ..., :P] = a.k[:, :G, ..., :P].repeat_interleave(n, dim=1)
            a.v[:, :B, :, :P] = a.v[:, :G, :, :P].repeat_interleave(n, dim=1)
        # 2. The decode's own state: rows past B (up to the bucket) are empty slots, finished from the start.
        a.mask[:B, :P] = torch.zeros(B, P, device=dev).masked_fill_(~mask.repeat_interleave(n, 0), float("-inf"))
        a.mask[:B, P:] = float("-inf")  # each column is opened by the step that writes it
        a.pos[:B] = pos[:, -1].repeat_interleave(n) + 1
        a.col.fill_(P)
        a.finished[B:] = True
        a.slot[B:] = a.rows
        a.out.fill_(self.tok.pad_token_id), a.logp.zero_(), a.floor.zero_()
        self._emit(a, B, self._logits(x[:, -1]).repeat_interleave(n, dim=0), temperature, top_p)  # token 0
        metrics["rollout/decode_steps"] = self._run(a, ladder, temperature, top_p, max_new)
        self.last_metrics = metrics
        return self._collect(a, B, max_new, temperature > 0 and top_p < 1.0)

    def _run(self, a: _Arena, ladder: list[int], temperature: float, top_p: float, max_new: int) -> int:
        """Decode steps until every row has finished or max_new tokens are drawn; the host looks
        every CHECK_EVERY steps and moves the live rows into a smaller bucket when they fit one."""
        b, drawn, steps = ladder[0], 1, 0
        self.buckets_used = [b]
        while drawn < max_new:
            run = min(CHECK_EVERY, max_new - drawn)
            step = self._runner(a, b, temperature, top_p)
            for _ in range(run):
                step()
            drawn, steps = drawn + run, steps + run
            live = (~a.finished[:b]).nonzero().squeeze(1)  # the loop's one host synchronisation
            if len(live) == 0:
                break
            smaller = fitting(ladder, len(live))
            if smaller < b:
                self._compact(a, live, smaller)
                b = smaller
                self.buckets_used.append(b)
        return steps

    @staticmethod
    def _compact(a: _Arena, live: Tensor, b: int) -> None:
        """Move the ``live`` rows to the front of the arena; rows from there up to ``b`` are empty slots."""
        m = len(live)
        for c in (a.k, a.v):
            c[:, :m] = c[:, live]  # the right side is a gathered copy, so overlapping rows are safe
        for t in (a.tok, a.pos, a.mask, a.slot):
            t[:m] = t[live]
        a.finished[:m], a.finished[m:b] = False, True
        a.slot[m:b] = a.rows

    def _collect(self, a: _Arena, B: int, max_new: int, truncated: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        """The output rows cut to the longest completion (up to its EOS), as `generate` returns them."""
        out = a.out[:B, :max_new]
        is_eos = (out[..., None] == self.eos_dev).any(-1)  # (B, max_new)
        ends = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, max_new)  # each row's length
        T = int(ends.max())
        return out[:, :T].clone(), a.logp[:B, :T].clone(), a.floor[:B, :T].clone() if truncated else None

    # --- memory -----------------------------------------------------------------------------------

    def sleep(self, discard_weights: bool = False) -> None:
        """Free the arena and its graphs too (they hold the KV cache and the addresses of the
        weights, which discard_weights gives back): the next ``generate`` builds and captures them
        again. On CUDA a small model keeps all of it (``keeps``), its weights included."""
        if self.keeps():
            return
        self.arena = None
        super().sleep(discard_weights)

    def keeps(self) -> bool:
        """Whether ``sleep`` keeps the graphs: on CUDA, while the sampler's weights and the arena take
        at most KEEP_FRACTION of the GPU's memory."""
        if not self.capture or self.arena is None:
            return False
        a = self.arena
        held = sum(t.nbytes for t in (a.k, a.v)) + sum(p.nbytes for p in self.model.parameters())
        return held <= KEEP_FRACTION * torch.cuda.get_device_properties(self.dev).total_memory

    def load_weights(self, state: dict[str, Tensor], version: int | None = None) -> None:
        """Weight sync: the copy lands in place, at the addresses the graphs read (a discarded
        sampler's weights come back at new ones: ``sleep`` dropped its graphs already)."""
        self.hf.load_weights(state, version)
