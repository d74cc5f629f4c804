"""The own engine's GPU path: a static KV cache, a decode step of fixed shapes, captured once as a
CUDA graph, that samples on the device and never waits for the host.

Why. On an H100 a decode step of a 0.5B model at 128 rows reads 0.8 GB of weights, ~0.25 ms at the
HBM's pace; transformers' `generate` took ~28 ms a step there, the time to launch its few thousand
small kernels one by one from Python. A CUDA graph launches them all at once. Capturing needs
every tensor a step touches to keep its address and shape from one step to the next, so:

* **the arena** (``_Arena``): the KV cache for the decode slots and a fixed number of columns
  (prompt + completion, rounded up to ``COLUMNS``), used as a ring (roles/slots.py), the token each
  slot feeds next, its position, its tokens drawn (its output column) and output row, the ring
  column (a device scalar the step advances itself), the additive attention mask, the finished
  flags, the call's sampling key and the output buffers. Allocated once and reused by every
  ``generate`` it fits (a larger one replaces it, ``GROW``). A small model's arena, graphs and
  sampler weights stay through the trainer's update (``KEEP_FRACTION`` of the GPU's memory): a
  larger one's go in ``sleep``, and the next ``generate`` captures again;
* **one step function** (``_advance``): feed each slot's token, write its keys and values at the
  ring column, attend over every column (the mask hides those not its row's), draw the next token
  (roles/sampling.py, on the device, with the uniform of the row and token index), record it and its
  log-prob at its row's output column, flag slots that drew EOS or max_new tokens. The captured
  graph and the eager path (the CPU, where the tests run it against `generate`) call this same
  function; capture is the thin wrapper ``_runner``;
* **EOS checked every few steps** (``CHECK_EVERY``): the host looks at the finished flags once per
  that many steps, the only synchronisation of the loop. A finished slot writes to a scratch row until then;
* **continuous batching** (``slots``, 0: one per row): with fewer slots than rows, a finished slot
  takes the next waiting row when the host looks, its prompt's KV copied from its group's prefill
  (roles/slots.py). The slot table (which row, which position, which output column) is data the
  captured step reads, not a shape, so refilling captures nothing new;
* **weights between rounds** (``between_steps``, partial rollouts): where the host looks, its owner
  may load new weights; they are copied in place, at the addresses the graphs read, and each token
  records the version it was drawn with (a device scalar the step writes beside the token);
* **rows that finish free their slot**: once no row waits, the batch runs at a size from a short
  ladder of buckets (the slots, then powers of two down to ``MIN_BUCKET``); once the live rows fit a
  smaller bucket they are moved to the front of the arena and that bucket's graph takes over. Every
  bucket is captured before the prompts are prefilled, since capturing runs (warms up) the step.

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
from rlpost.roles import sampling
from rlpost.roles.rollout_fast import FastRollout
from rlpost.roles.slots import Batch, Prefixes

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
    """Every tensor a decode step reads or writes, at fixed addresses: ``rows`` decode slots x
    ``columns`` cache columns (a ring, roles/slots.py), and ``outputs`` output rows plus one scratch
    row, where finished slots write."""

    def __init__(self, engine: "StaticRollout", rows: int, outputs: int, columns: int):
        layers, nkv, hd, dtype, dev = len(engine.layers), engine.nkv, engine.hd, engine.dtype, engine.dev
        self.rows, self.outputs, self.columns = rows, outputs, columns
        # zeros, not empty: a warm-up step reads the cache and the mask before anything is written
        self.k = torch.zeros(layers, rows, nkv, hd, columns, dtype=dtype, device=dev)  # keys, transposed
        self.v = torch.zeros(layers, rows, nkv, columns, hd, dtype=dtype, device=dev)
        self.tok = torch.zeros(rows, dtype=torch.long, device=dev)  # the token each slot feeds next
        self.pos = torch.zeros(rows, dtype=torch.long, device=dev)  # its position id
        self.col = torch.zeros(1, dtype=torch.long, device=dev)  # the ring column it goes to (every slot's)
        self.t = torch.zeros(rows, dtype=torch.long, device=dev)  # each slot's tokens drawn: its next output column
        self.mask = torch.zeros(rows, columns, device=dev)  # additive: 0 where a slot attends, -inf elsewhere
        self.finished = torch.zeros(rows, dtype=torch.bool, device=dev)
        self.slot = torch.arange(rows, device=dev)  # decode slot -> output row
        self.key = torch.zeros(2, dtype=torch.long, device=dev)  # the call's sampling key (sampling.uniforms)
        self.limit = torch.zeros(1, dtype=torch.long, device=dev)  # max_new: a slot that drew this many is done
        self.scratch_row = outputs
        self.out = torch.zeros(outputs + 1, columns, dtype=torch.long, device=dev)
        self.logp = torch.zeros(outputs + 1, columns, device=dev)
        self.floor = torch.zeros(outputs + 1, columns, device=dev)
        self.ver = torch.zeros(outputs + 1, columns, dtype=torch.long, device=dev)  # the version that drew each
        self.version = torch.zeros(1, dtype=torch.long, device=dev)  # the weights' version now (partial rollouts)
        positions = torch.arange(columns, device=dev)[None]
        cos, sin = engine.cos_sin(positions)  # (1, columns, 1, hd): the rotary table, once
        self.cos, self.sin = cos[0, :, 0], sin[0, :, 0]  # (columns, hd)
        self.graphs: dict[tuple, object] = {}  # (bucket, temperature, top_p) -> its step, captured or eager
        self.pool = None  # the captured graphs' shared memory pool

    def scratch(self) -> None:
        """A state any step may run on (warm-up and capture run real steps): nothing finished,
        every column attended, counters at 0."""
        self.tok.zero_(), self.pos.zero_(), self.col.zero_(), self.t.zero_(), self.mask.zero_()
        self.finished.zero_(), self.key.zero_()
        self.limit.fill_(self.columns)
        self.slot.copy_(torch.arange(self.rows, device=self.slot.device))


class StaticRollout(FastRollout):
    """``FastRollout`` on a static arena, its decode step a CUDA graph where the model is on CUDA
    (``capture``), run eagerly elsewhere: the same function either way (module docstring)."""

    def __init__(self, model: torch.nn.Module, tokenizer, dtype: torch.dtype | None = None, slots: int = 0):
        super().__init__(model, tokenizer, dtype, slots)
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
            qk = self.rope(qkv[:, 0, : nq + nk].view(b, nh + nkv, hd), cos, sin)  # (b, nh + nkv, hd)
            kl.index_copy_(3, a.col, qk[:, nh:, :, None])
            vl.index_copy_(2, a.col, qkv[:, 0, nq + nk :].reshape(b, nkv, 1, hd))
            o = self.attend_step(qk[:, :nh], kl, vl, mask[:, None, None, :])
            x = self._mlp(x + L.o(o.view(b, 1, nq)), L)
        self._emit(a, b, self._logits(x[:, 0]), temperature, top_p)
        a.pos[:b] += 1
        a.col.add_(1).remainder_(a.columns)  # the ring's next column (roles/slots.py)

    def _emit(self, a: _Arena, b: int, logits: Tensor, temperature: float, top_p: float) -> None:
        """Draw each of the first ``b`` slots' next token from ``logits`` (b, V), with the uniform of
        its (row, token index), and record it, its log-prob and top-p threshold at its row's output
        column; a slot already finished writes to the scratch row. A slot that has drawn max_new is done."""
        done, t = a.finished[:b], a.t[:b]
        tok, lp, floor = self.draw_tokens(logits, temperature, top_p, sampling.uniforms(a.key, a.slot[:b], t))
        where = (a.slot[:b].masked_fill(done, a.scratch_row), t.clamp(max=a.columns - 1))
        a.out.index_put_(where, tok)
        a.logp.index_put_(where, lp)
        a.ver.index_put_(where, a.version.expand(b))
        if floor is not None:
            a.floor.index_put_(where, floor)
        a.t[:b] = t + (~done).long()
        done |= (tok[:, None] == self.eos_dev).any(1) | (a.t[:b] >= a.limit)  # torch.isin may sort, and sync
        a.tok[:b] = tok

    def _runner(self, a: _Arena, b: int, temperature: float, top_p: float):
        """The step for batch size ``b`` as a callable: ``_advance`` itself, or on CUDA its graph's
        replay. The first time this process makes a step it runs it WARMUP times first (on CUDA on
        a side stream, as capturing asks): that moves the arena, which the caller resets (``_prepare``)."""
        key = (b, temperature, top_p)
        if key not in a.graphs:
            def step():
                return self._advance(a, b, temperature, top_p)
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

    def _sample(self, prompt: tuple[Tensor, Tensor], n: int, temperature: float, top_p: float, max_new_tokens: int,
                stop_strings: list[str] | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        input_ids, attention_mask = prompt  # (B, P) each: the left-padded prompts, their mask
        if stop_strings:
            return self.hf._sample(prompt, n, temperature, top_p, max_new_tokens, stop_strings)
        self.hf._check_awake()
        home = input_ids.device
        with torch.no_grad():
            out = self._decode(input_ids.to(self.dev), attention_mask.to(self.dev).bool(), n, temperature, top_p,
                               max_new_tokens)
        return tuple(x.to(home) if x is not None else None for x in out)

    def _arena_for(self, rows: int, outputs: int, columns: int) -> _Arena:
        """The arena, replaced by a larger one (its graphs dropped) when this call needs more slots,
        output rows or columns."""
        a = self.arena
        if a is None or a.rows < rows or a.outputs < outputs or a.columns < columns:
            if a is not None and a.columns < columns:  # lengths vary: leave room for the next few
                columns = max(columns, int(a.columns * GROW))
            if a is not None:
                rows, outputs, columns = max(rows, a.rows), max(outputs, a.outputs), max(columns, a.columns)
            self.arena = None  # the old one's memory first
            self.arena = _Arena(self, rows, outputs, -(-columns // COLUMNS) * COLUMNS)
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
        top-p thresholds (G*n, T) or None), on ``self.slots`` decode slots (0: one per row), each
        freed slot refilled by the next waiting row between rounds of steps (roles/slots.py)."""
        G, P = ids.shape
        B = G * n
        S = min(B, self.slots) if self.slots else B
        ladder = buckets(S)
        a = self._arena_for(S, B, P + max_new)
        metrics = self._prepare(a, ladder, temperature, top_p)
        # The decode's own state: every slot empty (finished, writing to the scratch row) until a row enters.
        a.out.fill_(self.tok.pad_token_id), a.logp.zero_(), a.floor.zero_(), a.ver.zero_()
        a.version.fill_(self.version)
        a.finished.fill_(True), a.slot.fill_(a.scratch_row), a.limit.fill_(max_new), a.col.fill_(P)
        a.key.copy_(sampling.new_key(self.dev) if temperature > 0 else torch.zeros(2, dtype=torch.long))
        batch = Batch(self, Prefixes(self, ids, mask, -(-S // n)), n, (temperature, top_p, max_new, self.eos_dev))
        self._enter(a, batch, list(range(S)), P)  # each prompt prefilled once, its KV copied to its rows' slots
        metrics["rollout/decode_steps"] = self._run(a, batch, ladder, (temperature, top_p, max_new))
        metrics["rollout/slots"] = S
        self.last_metrics = metrics
        out = self._collect(a, B, max_new, temperature > 0 and top_p < 1.0)
        self.token_version = a.ver[:B, : out[0].shape[1]].clone() if self.between_steps is not None else None
        return out

    def _enter(self, a: _Arena, batch: Batch, slots: list[int], col: int) -> None:
        """``batch.enter`` (roles/slots.py), each entering row's first token stamped with the version held now."""
        idx = batch.enter(a, slots, col)
        a.ver[a.slot[idx], 0] = a.version

    def _run(self, a: _Arena, batch: Batch, ladder: list[int], sample: tuple[float, float, int]) -> int:
        """Rounds of decode steps until every row has entered and finished. Between rounds the host
        looks at the slots (the loop's one synchronisation, every CHECK_EVERY steps): finished slots
        take the next waiting rows; once none waits, the live slots move into a smaller bucket when
        they fit one; with partial rollouts (``between_steps``) its owner may load new weights, in place
        at the addresses the graphs read, and the round's tokens record the version they were drawn
        with. A round ends early when its least advanced row must be done by then."""
        temperature, top_p, max_new = sample
        b, col, steps = ladder[0], batch.prefixes.ids.shape[1], 0
        self.buckets_used = [b]
        while True:
            finished, t = a.finished[:b].tolist(), a.t[:b].tolist()
            while batch.waiting and any(finished):  # a row's first token may be EOS: look again
                self._enter(a, batch, [s for s, f in enumerate(finished) if f], col)
                finished, t = a.finished[:b].tolist(), a.t[:b].tolist()
            live = [s for s, f in enumerate(finished) if not f]
            if not live:
                return steps
            smaller = fitting(ladder, len(live)) if not batch.waiting else b
            if smaller < b:
                self._compact(a, torch.tensor(live, device=a.tok.device), smaller)
                b = smaller
                self.buckets_used.append(b)
            if self.between_steps is not None:  # only where a step follows (as the CPU loop)
                self.between_steps(self)
                a.version.fill_(self.version)
            run = min(CHECK_EVERY, max_new - min(t[s] for s in live))
            step = self._runner(a, b, temperature, top_p)
            for _ in range(run):
                step()
            col, steps = col + run, steps + run

    @staticmethod
    def _compact(a: _Arena, live: Tensor, b: int) -> None:
        """Move the ``live`` slots to the front of the arena; slots from there up to ``b`` are empty."""
        m = len(live)
        for c in (a.k, a.v):
            c[:, :m] = c[:, live]  # the right side is a gathered copy, so overlapping rows are safe
        for t in (a.tok, a.pos, a.mask, a.slot, a.t):
            t[:m] = t[live]
        a.finished[:m], a.finished[m:b] = False, True
        a.slot[m:b] = a.scratch_row

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
