"""Continuous batching for the own engines (rollout_fast.py on the CPU, rollout_static.py its CUDA twin):
which waiting row enters a freed decode slot, its prompt's KV from its group's prefill, and where in
the cache it goes.

Why. Rollouts are long-tailed: most rows stop early, a few run to the length cap. An engine that runs
a batch of rows to its longest row holds every slot until then, so a caller with a budget of S rows of
KV cache pays each wave of S rows its longest row. Here a row that finishes gives its slot to the next
waiting row between two decode steps, and a batch costs about its total tokens over S, plus the
longest row's own length.

The cache is a ring of C columns (C >= P + max_new for prompts of P columns): every decode step writes
each slot's new key at the same column, col mod C, so a step has one column index for all rows (the
CUDA graph's step reads it as data), and a row entering before step col has its prompt's KV placed in
the P columns just before it, col-P .. col-1 mod C. Where a key sits in the cache does not matter to
attention: RoPE put its position into it when it was written, and the additive mask (0 or -inf)
opens exactly the row's own columns. A row spans at most P + max_new - 1 columns, so the ring never
overwrites a live row's keys.

Each distinct prompt is prefilled once, in chunks of groups as their rows come up (``Prefixes``),
and its KV is copied into each of its group's rows as they enter: the prefix sharing the engines
had before, now per entering row. A row's first token is drawn from its group's last prefill logits
when it enters, with the uniform of (row, token 0) (sampling.uniforms), so what a row samples does
not depend on its slot or on when it entered.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlpost.model.logprobs import position_ids
from rlpost.roles import sampling


class Prefixes:
    """Each group's prompt prefilled once: its keys (layers, nkv, hd, P), values (layers, nkv, P, hd),
    last-position logits (V,), and the position of its last token; ``chunk`` groups at a time, the
    chunk holding the group asked for and those after it (rows enter in order)."""

    def __init__(self, engine, ids: Tensor, mask: Tensor, chunk: int):
        self.engine, self.ids, self.mask, self.chunk = engine, ids, mask, max(chunk, 1)
        self.pos = position_ids(mask)  # (G, P)
        self.lo = self.hi = 0
        self.k = self.v = self.logits = None

    def get(self, g: int) -> tuple[Tensor, Tensor, Tensor]:
        if not self.lo <= g < self.hi:
            self._fill(g)
        i = g - self.lo
        return self.k[:, i], self.v[:, i], self.logits[i]

    def _fill(self, g: int) -> None:
        e, hi = self.engine, min(len(self.ids), g + self.chunk)
        ids, mask = self.ids[g:hi], self.mask[g:hi]
        b, P, dev = hi - g, ids.shape[1], ids.device
        self.k = self.v = self.logits = None  # the last chunk's memory first
        kmask = torch.ones(P, P, dtype=torch.bool, device=dev).tril() & mask[:, None, None, :]  # (b, 1, P, P)
        kmask |= torch.eye(P, dtype=torch.bool, device=dev)  # a left pad attends itself (never read; avoids NaN)
        layers = len(e.layers)
        cache = (torch.empty(layers, b, e.nkv, e.hd, P, dtype=e.dtype, device=dev),
                 torch.empty(layers, b, e.nkv, P, e.hd, dtype=e.dtype, device=dev))
        x = e._layers(e.embed[ids], *e.cos_sin(self.pos[g:hi]), cache, kmask)  # (b, P, H)
        self.k, self.v, self.logits = cache[0], cache[1], e._logits(x[:, -1])
        self.lo, self.hi = g, hi


class Batch:
    """One decode's rows and slots: the prefixes' G groups of ``n`` rows each, entering slots in row
    order; ``sample``: (temperature, top_p, max_new, the EOS ids on the cache's device). ``st`` is the
    engine's state, read and written by name: k, v (the cache), mask (slots, C), tok, pos, t, slot,
    finished (slots,), key (2,), and the output rows out, logp, floor."""

    def __init__(self, engine, prefixes: Prefixes, n: int, sample: tuple[float, float, int, Tensor]):
        self.e, self.prefixes, self.n, self.B = engine, prefixes, n, len(prefixes.ids) * n
        self.temperature, self.top_p, self.max_new, self.eos = sample
        self.next = 0  # the next row to enter
        self.entered = 0  # rows that have entered a slot (for the metrics)

    @property
    def waiting(self) -> int:
        return self.B - self.next

    def enter(self, st, slots: list[int], col: int) -> Tensor:
        """Rows waiting enter ``slots`` (as many as wait), their prompts in the ring columns before
        ``col``; each draws its first token, recorded at output column 0. Returns the slots filled."""
        slots = slots[: self.waiting]
        if not slots:
            return torch.zeros(0, dtype=torch.long)
        rows = torch.arange(self.next, self.next + len(slots))
        self.next += len(slots)
        C, P = st.mask.shape[1], self.prefixes.ids.shape[1]
        dev = st.mask.device
        logits = []
        groups = (rows // self.n).tolist()
        for g in sorted(set(groups)):  # a group's rows take its prompt's KV in one copy
            k, v, lg = self.prefixes.get(g)
            idx = torch.tensor([s for s, h in zip(slots, groups) if h == g], device=dev)
            opened = torch.zeros(P, device=dev).masked_fill_(~self.prefixes.mask[g], float("-inf"))
            st.mask[idx] = float("-inf")
            for ring, prompt in segments(col, P, C):
                st.k[:, idx, ..., ring] = k[:, None, ..., prompt]
                st.v[:, idx, :, ring] = v[:, None, :, prompt]
                st.mask[idx, ring] = opened[prompt]
            st.pos[idx] = self.prefixes.pos[g, -1] + 1
            logits += [lg] * len(idx)
        rows_d, idx = rows.to(dev), torch.tensor(slots, device=dev)
        u = sampling.uniforms(st.key, rows_d, torch.zeros_like(rows_d))
        tok, lp, floor = self.e.draw_tokens(torch.stack(logits), self.temperature, self.top_p, u)
        st.out[rows_d, 0], st.logp[rows_d, 0] = tok, lp
        if floor is not None:
            st.floor[rows_d, 0] = floor
        st.tok[idx], st.t[idx], st.slot[idx] = tok, 1, rows_d
        st.finished[idx] = (tok[:, None] == self.eos).any(1) | (self.max_new <= 1)
        self.entered += len(slots)
        return idx


def segments(col: int, P: int, C: int) -> list[tuple[slice, slice]]:
    """The ring columns col-P .. col-1 (mod C) as (cache columns, prompt columns) slices: one pair, or
    two where they wrap past column C - 1."""
    start = (col - P) % C
    if start + P <= C:
        return [(slice(start, start + P), slice(0, P))]
    return [(slice(start, C), slice(0, C - start)), (slice(0, P - (C - start)), slice(C - start, P))]
