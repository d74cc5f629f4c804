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

Rows may also join a decode already running (``Admissions``, the OpenAI endpoint's requests): between
two steps they are prefilled together, enter free slots (new ones up to a budget), the ring widened
where their prompt and length need more columns (``grow``), and each row's tokens go back to its caller
the moment it ends.
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
    finished (slots,), key (2,), and the output rows out, logp, floor. Rows that join a running decode
    (``Admissions``) come as further parts (``add``), each with its own prefixes and per-row limits
    (max_new of each row, written to the state's per-slot ``limit``)."""

    def __init__(self, engine, prefixes: Prefixes, n: int, sample: tuple[float, float, int, Tensor],
                 limits: list[int] | None = None):
        self.e, self.prefixes, self.n = engine, prefixes, n
        self.temperature, self.top_p, self.max_new, self.eos = sample
        self.parts: list[tuple[int, Prefixes, int, list[int] | None]] = []  # (first row, prefixes, n, limits)
        self.B = 0
        self.next = 0  # the next row to enter
        self.entered = 0  # rows that have entered a slot (for the metrics)
        self.add(prefixes, n, limits)

    def add(self, prefixes: Prefixes, n: int = 1, limits: list[int] | None = None) -> None:
        """More rows: ``prefixes``' groups of ``n``, entering after the rows already here."""
        self.parts.append((self.B, prefixes, n, limits))
        self.B += len(prefixes.ids) * n

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
        dev = st.mask.device
        logits, limits = [], []
        for base, prefixes, n, lims in self.parts:
            mine = [(s, r - base) for s, r in zip(slots, rows.tolist()) if base <= r < base + len(prefixes.ids) * n]
            if mine:
                logits += self._place(st, prefixes, n, mine, col)
                limits += [lims[r] for _, r in mine] if lims is not None else []
        rows_d, idx = rows.to(dev), torch.tensor(slots, device=dev)
        u = row_uniforms(st, rows_d, torch.zeros_like(rows_d))
        tok, lp, floor = self.e.draw_tokens(torch.stack(logits), self.temperature, self.top_p, u)
        st.out[rows_d, 0], st.logp[rows_d, 0] = tok, lp
        if floor is not None:
            st.floor[rows_d, 0] = floor
        st.tok[idx], st.t[idx], st.slot[idx] = tok, 1, rows_d
        if limits:  # rows of their own lengths (admitted: the state has a per-slot limit)
            st.limit[idx] = torch.tensor(limits, device=dev)
            st.finished[idx] = (tok[:, None] == self.eos).any(1) | (st.limit[idx] <= 1)
        else:
            st.finished[idx] = (tok[:, None] == self.eos).any(1) | (self.max_new <= 1)
        self.entered += len(slots)
        return idx

    @staticmethod
    def _place(st, prefixes: Prefixes, n: int, mine: list[tuple[int, int]], col: int) -> list[Tensor]:
        """Each (slot, row of the part) given its group's prompt KV in the ring columns before ``col``,
        its mask and position; the groups' last logits, one per row in order."""
        C, P, dev = st.mask.shape[1], prefixes.ids.shape[1], st.mask.device
        logits = []
        groups = [r // n for _, r in mine]
        for g in sorted(set(groups)):  # a group's rows take its prompt's KV in one copy
            k, v, lg = prefixes.get(g)
            idx = torch.tensor([s for (s, _), h in zip(mine, groups) if h == g], device=dev)
            opened = torch.zeros(P, device=dev).masked_fill_(~prefixes.mask[g], float("-inf"))
            st.mask[idx] = float("-inf")
            for ring, prompt in segments(col, P, C):
                st.k[:, idx, ..., ring] = k[:, None, ..., prompt]
                st.v[:, idx, :, ring] = v[:, None, :, prompt]
                st.mask[idx, ring] = opened[prompt]
            st.pos[idx] = prefixes.pos[g, -1] + 1
            logits += [lg] * len(idx)
        return logits


def row_uniforms(st, rows: Tensor, t: Tensor) -> Tensor:
    """The uniforms (sampling.uniforms) of output ``rows`` at token indices ``t``: of the decode's one key
    and the row's number, or, where rows joined with keys of their own (``st.rkey`` (B, 2): each row's
    key pair with its number within its own call folded in), of those alone. A chunk's rows then draw as
    they would in a decode of their own, whichever decode they joined."""
    rkey = getattr(st, "rkey", None)
    if rkey is None:
        return sampling.uniforms(st.key, rows, t)
    return sampling.uniforms(rkey[rows].T, torch.zeros_like(rows), t)


def segments(col: int, P: int, C: int) -> list[tuple[slice, slice]]:
    """The ring columns col-P .. col-1 (mod C) as (cache columns, prompt columns) slices: one pair, or
    two where they wrap past column C - 1."""
    start = (col - P) % C
    if start + P <= C:
        return [(slice(start, start + P), slice(0, P))]
    return [(slice(start, C), slice(0, C - start)), (slice(0, P - (C - start)), slice(C - start, P))]


class Admissions:
    """Rows that join a running decode between two of its steps (the endpoint's requests,
    roles/endpoint.py). ``feed(room)`` gives up to ``room`` new rows, (prompt ids, max_new) each, or
    none; they are prefilled together as they come (one more part of the ``Batch``) and enter free
    slots, or new ones up to ``budget`` slots, the state grown to hold them (``grow``). ``done(i, ids,
    logps, how)`` gets each row's tokens the moment it ends (i: the row's number in the order fed, the
    decode's first rows included; how: 'eos' or 'length'), not when the decode does."""

    ROWS = 4096  # rows one decode admits at most (their output rows stay until it ends); later ones start the next

    def __init__(self, engine, feed, done, budget: int, first: list[int]):
        self.e, self.feed, self.done, self.budget, self.first = engine, feed, done, budget, first
        self.eos = set(engine.eos_set)

    def poll(self, st, batch: Batch, b: int, col: int) -> bool:
        """New rows from the feed into ``batch``, the state grown for them; True when it was
        (its tensors are new: views of them are stale)."""
        live = int((~st.finished[:b]).sum())
        room = min(self.budget - live - batch.waiting, self.ROWS - batch.B)
        rows = self.feed(room) if room > 0 else []
        if not rows:
            return False
        ids, mask = left_padded([r[0] for r in rows], self.e.tok.pad_token_id, st.mask.device)
        limits = [r[1] for r in rows]
        batch.add(Prefixes(self.e, ids, mask.bool(), len(rows)), 1, limits)
        P = ids.shape[1]
        if col < P:  # its prompt wraps to the ring's end: every column is read from now on
            st.reach = st.mask.shape[1]
        return grow(st, min(self.budget, live + batch.waiting), P + max(limits), batch.B, max(limits), col)

    def slots(self, st, b: int) -> list[int]:
        """The slots a waiting row may enter: the finished ones of the first ``b``, then those after."""
        return st.finished[:b].nonzero().squeeze(1).tolist() + list(range(b, st.mask.shape[0]))

    def report(self, st, slots: Tensor) -> None:
        """``done`` for the rows of these slots, which have just ended."""
        for s in slots.tolist():
            row, t = int(st.slot[s]), int(st.t[s])
            ids = st.out[row, :t].tolist()
            self.done(row, ids, st.logp[row, :t].tolist(), "eos" if ids and ids[-1] in self.eos else "length")


def left_padded(seqs: list[list[int]], pad: int, device=None) -> tuple[Tensor, Tensor]:
    """Token sequences left-padded to the longest: (ids, attention mask), (len(seqs), width) each."""
    width = max(map(len, seqs))
    ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs], device=device)
    return ids, torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], device=device)


def grow(st, slots: int, columns: int, rows: int, width: int, col: int) -> bool:
    """Room in the engine's state ``st`` for ``slots`` slots, ``columns`` ring columns, ``rows`` output
    rows of ``width`` tokens (each only grows, by half at least, so a decode grows it a few times);
    what it holds is kept, the ring's live columns moved to where the wider ring puts them (the
    absolute column a at a mod C: the step's column ``col`` stays every row's next). True if it grew."""
    S, C = st.mask.shape
    B, W = st.out.shape
    grew = slots > S or columns > C
    if grew:
        S2, C2 = max(slots, S), max(columns, C + C // 2) if columns > C else C
        a = torch.arange(col - C, col, device=st.mask.device)
        old, new = a % C, a % C2
        k = st.k.new_zeros(*st.k.shape[:1], S2, *st.k.shape[2:4], C2)
        k[:, :S, ..., new] = st.k[..., old]
        v = st.v.new_zeros(*st.v.shape[:1], S2, *st.v.shape[2:3], C2, *st.v.shape[4:])
        v[:, :S, :, new] = st.v[:, :, :, old]
        mask = st.mask.new_full((S2, C2), float("-inf"))
        mask[:S, new] = st.mask[:, old]
        st.k, st.v, st.mask, st.C = k, v, mask, C2
        for name in ("tok", "pos", "t", "slot", "limit"):
            setattr(st, name, torch.cat([getattr(st, name), getattr(st, name).new_zeros(S2 - S)]))
        st.finished = torch.cat([st.finished, st.finished.new_ones(S2 - S)])
        st.reach = C2 if st.reach else 0
    if rows > B or width > W:
        B2, W2 = max(rows, 2 * B) if rows > B else B, max(width, W)
        for name in ("out", "logp", "ver", "floor"):
            x = getattr(st, name)
            if x is not None:
                y = x.new_zeros(B2, W2)
                y[:B, :W] = x
                setattr(st, name, y)
    return grew
