"""A rollout worker's chunks decoded as one stream (partial rollouts: distributed/pool.py, actors.py).

Why. Sampling a chunk costs its longest row: the few long rows of a long-tailed chunk decode alone
while the slots of the rows that finished sit empty. Under partial rollouts a worker holds two
chunks (the pool hands it the next before the last is done), and here the next chunk's rows join
the decode that is running the last one's, between two of its steps, so the decode batch stays full
and a worker samples at about its total tokens over the engine's throughput.

How. One decode thread per worker runs ``FastRollout.decode_admitting`` with this stream as its
admissions (the interface of roles/slots.py: Admissions): the first waiting chunk starts a decode,
each later one joins it once its rows fit the slot budget, prefilled as a group of prompts (its
prefix shared by its ``n`` rows, as ever), and each row is handed back to its chunk as it ends. A
chunk's caller (an actor thread in ``submit``) waits for its rows and assembles its ``Rollouts``.

What a chunk samples does not depend on the company it keeps: each row draws with the uniforms of
(its chunk's key, its number within the chunk, its token index) (slots.row_uniforms), the chunk's key
being the first draw of a generator seeded with the chunk's seed, as a chunk decoded alone draws it.
Only float rounding, which depends on the batch a row's matmuls ran in, can tell them apart.

Weights. Only the decode thread loads weights (the engine's ``between_steps`` hook, before a decode
starts and between its steps); each token records its version, and a chunk's ``policy_version`` is
the version it joined under, its oldest token's. A chunk joins a running decode only if it samples
with the same temperature, top-p and length cap; otherwise it starts the next one. One decode admits
at most ``Admissions.ROWS`` rows (its output rows stay until it ends): later chunks start the next.
"""

from __future__ import annotations

import bisect
import threading
from collections import deque

import torch
from torch import Tensor

from rlpost.roles import sampling
from rlpost.roles.slots import Admissions, Prefixes, grow
from rlpost.types.batch import Rollouts


class Job:
    """One chunk: its rows, ``n`` samples each, how to sample, its encoded prompts and its key; filled
    row by row by the decode thread, ``done`` set once every row has ended (or the decode failed)."""

    def __init__(self, rows: list[dict], n: int, kw: dict, enc, key: Tensor):
        self.rows, self.n, self.kw, self.enc = rows, n, kw, enc
        self.B = len(rows) * n
        # (B, 2): each row's key pair, its number within the chunk folded in (slots.row_uniforms)
        self.keys = torch.stack([key[0].expand(self.B), (key[1] + torch.arange(self.B)) & sampling.M32], 1)
        self.out: list[tuple | None] = [None] * self.B  # each row's (ids, log-probs, versions, top-p floors)
        self.left, self.base, self.version = self.B, 0, 0
        self.joined_at = 0  # the stream's count of loads when it joined the decode
        self.loads = 0  # weight loads taken while its rows ran: the count's rise from joined_at to its last row's end
        self.done, self.error = threading.Event(), None


class ChunkStream:
    """The worker's stream of chunks into its engine's decode (module docstring)."""

    def __init__(self, engine, hook=None):
        """engine: a FastRollout (``admits``); hook(engine): the worker's weight hook, run before each
        decode starts (the engine runs it between steps itself)."""
        self.e, self.hook = engine, hook
        self.cv = threading.Condition()
        # the tokenizer, for the callers' threads one at a time (a fast tokenizer that pads can refuse a second
        # thread with "Already borrowed"); the decode thread never uses it
        self.tokenizing = threading.Lock()
        self.queue: deque[Job] = deque()  # chunks not yet in a decode
        self.jobs: list[Job] = []  # the running decode's, in the order they joined
        self.bases: list[int] = []  # their first output rows
        self.thread: threading.Thread | None = None
        self.kw: dict = {}
        self.first: list[int] = []
        self.budget = 0
        self.loads, self.seen = 0, 0  # versions the decode thread has seen change, the last seen
        self.decodes = self.submitted = 0  # decodes started, chunks queued

    def submit(self, rows: list[dict], n: int, kw: dict, seed: int) -> tuple[Rollouts, int]:
        """Sample ``n`` completions of each row (kw: temperature, top_p, max_new_tokens) under ``seed``,
        in whichever decode the chunk joins; returns once its last row has ended, with the weight
        loads taken while its rows ran (in flight)."""
        g = torch.Generator().manual_seed(seed)
        key = torch.randint(0, 1 << 32, (2,), dtype=torch.long, generator=g)
        with self.tokenizing:
            enc = self.e.hf.encode(rows)
        job = Job(rows, n, kw, enc, key)
        with self.cv:
            self.queue.append(job)
            self.submitted += 1
            if self.thread is None:
                self.thread = threading.Thread(target=self._serve, name="chunk-stream", daemon=True)
                self.thread.start()
            self.cv.notify_all()
        job.done.wait()
        if job.error is not None:
            raise RuntimeError(f"the decode this chunk ran in failed: {job.error!r}") from job.error
        return self._assemble(job), job.loads

    # --- the decode thread -------------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            with self.cv:
                self.cv.wait_for(lambda: bool(self.queue))
                first = self.queue.popleft()
            try:
                self._decode(first)
            except BaseException as e:  # noqa: BLE001 - every chunk of the decode hears of it, then the next starts
                for job in [first, *self.jobs]:
                    if not job.done.is_set():
                        job.error = e
                        job.done.set()
            self.jobs, self.bases = [], []

    def _decode(self, first: Job) -> None:
        self.decodes += 1
        if self.hook is not None:
            self.hook(self.e)  # weights offered while no decode ran
        kw = first.kw
        self.kw, self.first = kw, [kw["max_new_tokens"]] * first.B
        cap = self.e.slots or first.B
        self.budget = 2 * cap  # rows live or waiting: this chunk and the next
        self._join(first, None)
        enc = first.enc
        self.e.decode_admitting(self, (enc.input_ids, enc.attention_mask.bool()), first.n,
                                (kw["temperature"], kw["top_p"], kw["max_new_tokens"]))

    def _join(self, job: Job, st) -> None:
        job.base = self.bases[-1] + self.jobs[-1].B if self.jobs else 0
        job.version = self.seen = self.e.version
        job.joined_at = self.loads
        self.jobs.append(job)
        self.bases.append(job.base)
        if st is not None:
            st.rkey = torch.cat([st.rkey, job.keys.to(st.mask.device)])

    # --- the admissions interface (roles/slots.py: Admissions) ---------------------------------------

    def poll(self, st, batch, b: int, col: int) -> bool:
        """The next chunk into ``batch`` if it samples as this decode does and its rows fit the budget;
        True when the state grew for it."""
        if st.rkey is None:  # the decode's first step: its first chunk's keys
            st.rkey = self.jobs[0].keys.to(st.mask.device)
        self._count_loads()
        live = int((~st.finished[:b]).sum())
        with self.cv:
            job = self.queue[0] if self.queue else None
            if (job is None or job.kw != self.kw or live + batch.waiting + job.B > self.budget
                    or batch.B + job.B > Admissions.ROWS):
                return False
            self.queue.popleft()
        max_new = self.kw["max_new_tokens"]
        self._join(job, st)
        ids, mask = job.enc.input_ids.to(st.mask.device), job.enc.attention_mask.to(st.mask.device).bool()
        batch.add(Prefixes(self.e, ids, mask, len(ids)), job.n, [max_new] * job.B)
        if col < ids.shape[1]:  # its prompt wraps to the ring's end: every column is read from now on
            st.reach = st.mask.shape[1]
        slots = min(self.e.slots or self.budget, live + batch.waiting)
        return grow(st, slots, ids.shape[1] + max_new, batch.B, max_new, col)

    slots = Admissions.slots  # the slots a waiting row may enter: the finished ones of the first b, then those after

    def report(self, st, slots: Tensor) -> None:
        """Each ended row's tokens to its chunk; a chunk whose last row ended is done."""
        self._count_loads()
        for s in slots.tolist():
            row, t = int(st.slot[s]), int(st.t[s])
            job = self.jobs[bisect.bisect_right(self.bases, row) - 1]
            floor = st.floor[row, :t].clone() if st.floor is not None else None
            job.out[row - job.base] = (st.out[row, :t].clone(), st.logp[row, :t].clone(), st.ver[row, :t].clone(),
                                       floor)
            job.left -= 1
            if not job.left:
                job.loads = self.loads - job.joined_at
                job.done.set()

    def _count_loads(self) -> None:
        """Count a change of the engine's weights (loaded by its hook between two steps)."""
        if self.e.version != self.seen:
            self.loads, self.seen = self.loads + 1, self.e.version

    # --- a chunk's batch ---------------------------------------------------------------------------

    def _assemble(self, job: Job) -> Rollouts:
        """The chunk's Rollouts from its rows, as ``FastRollout.generate`` returns a chunk decoded alone:
        completions padded to the longest, each token's version, the version it joined under."""
        T = max(1, *(len(o[0]) for o in job.out))
        completion = torch.full((job.B, T), self.e.tok.pad_token_id, dtype=torch.long)
        logp, ver = torch.zeros(job.B, T), torch.zeros(job.B, T, dtype=torch.long)
        floor = torch.zeros(job.B, T) if job.out[0][3] is not None else None
        for r, (ids, lp, v, fl) in enumerate(job.out):
            completion[r, : len(ids)], logp[r, : len(ids)], ver[r, : len(ids)] = ids.cpu(), lp.cpu(), v.cpu()
            if floor is not None:
                floor[r, : len(ids)] = fl.cpu()
        with self.tokenizing:
            out = self.e.hf.assemble(job.enc, job.rows, job.n, completion, logp, floor)
        out.token_version = ver * out.completion_mask
        out.policy_version = job.version
        return out
