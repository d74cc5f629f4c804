"""The driver's face of the rollout workers: the loop's ``generate`` / ``load_weights`` verbs over
Ray actors, reading ahead of the loop under the async topology.

Work. A batch of prompts is cut into chunks (a few prompts x n samples each). A pump thread keeps
every worker busy with one chunk at a time (two under partial rollouts, below). Before it hands a
chunk to a worker whose weights are older than the newest published version, it queues
``load_weights`` on that worker first: an actor runs its calls in order, so weights change only
between chunks and every chunk knows the policy version that sampled it
(``Rollouts.policy_version``). Each chunk is sampled under its own seed
(run seed, chunk id), so which worker runs it, or a re-run after a crash, changes nothing.

Staleness (async). The pool holds the run's prompt stream and keeps ``max_staleness + 1`` batches
in the pipeline: when the loop asks for this step's prompts, it also queues the prompts the stream
will hand out in the next steps (``PromptStream.peek``: the same rows, the stream not advanced),
and returns the oldest batch. Rows the stream did not hand out (held-out evaluation) are sampled
at once, before anything queued. A batch is queued after the
weights of the step before it were published and consumed at most ``max_staleness`` steps later,
so by construction no sample lags the trained policy by more than the bound (admission control);
the lag is still measured when a batch is consumed, and a chunk over the bound is dropped,
counted and sampled again with the newest weights. ``max_staleness = 0`` is the synchronous loop:
nothing is queued before the weights it should use exist. Staleness counts weight versions
published after the one that sampled the chunk, i.e. trainer steps when ``dist.sync_every = 1``.

Partial rollouts (``partial``, dist.partial_rollouts, async only). A chunk no longer holds its
worker on the weights it began with: when weights are published, every worker running a chunk is
offered them at once (``RolloutWorker.offer_weights``), and its decode loop takes them between two
decode steps; rows running go on under the new weights. Each token records the version that drew
it and its sampler log-prob (``Rollouts.token_version``, ``sampler_logp``), so the importance
correction (TIS against pi_sampler) is per token already, the staleness metrics are counted per
token, and the bound is checked against the oldest token of a chunk (``policy_version``): the
admission control above keeps every token within it. A worker that dies mid-update, or anywhere
in a chunk, loses no row: its chunk is sampled again from its start, as below. A worker holds up to
two chunks at once (``depth``): the next one's rows join the decode running the last one's
(roles/chunk_stream.py), so its decode slots stay full while a chunk's long rows finish; its busy
time runs from when it took a chunk holding none until it holds none again.

Failure. A worker whose process dies (``RayActorError``) is replaced by a fresh one (at most
``MAX_RESTARTS`` times in a row for one worker before the run stops with the cause), which gets the
newest weights before its first chunk, and the chunk it held is queued again at the front. A chunk
whose ``generate`` raised is retried once on any worker, then dropped (its groups are missing from
that step's batch, which trains on the rest). Both are logged and counted in the metrics.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import ray
import torch

from rlpost.distributed.actors import Pushed
from rlpost.types.batch import Rollouts

# A worker that dies this many times in a row without finishing a chunk (it cannot even start:
# an import error, no memory) stops the run with its cause instead of being restarted forever.
MAX_RESTARTS = 3


@dataclass
class Chunk:
    id: int  # also the sampling seed's offset
    rows: list[dict]  # the prompts' task rows
    n: int  # samples per prompt
    kw: dict  # temperature, top_p, max_new_tokens
    attempts: int = 0  # generate calls that raised
    done: bool = False  # finished (result set) or dropped after a second failure (result None)
    result: Rollouts | None = None
    metrics: dict = field(default_factory=dict)  # the worker rollout's own last_metrics


@dataclass
class Batch:
    chunks: list[Chunk]
    bound: int | None  # staleness bound checked when the batch is consumed (None: not checked)

    def holds(self, rows: list[dict]) -> bool:
        """Whether these are the batch's prompts: the very row objects the stream handed out."""
        mine = [r for c in self.chunks for r in c.rows]
        return len(mine) == len(rows) and all(a is b for a, b in zip(mine, rows))


class RolloutPool:
    def __init__(self, spawn: Callable, n_workers: int, chunk_prompts: int, max_staleness: int,
                 initial_weights=None, version: int = 0, say: Callable[[str], None] = print, stream=None,
                 partial: bool = False):
        """spawn(i, weights) starts worker actor i (weights: an object ref, or None for the
        starting policy). stream: the loop's PromptStream, read ahead under async (None: sample
        only what is asked). partial: partial rollouts, weights offered to running chunks (module
        docstring; the workers' actors must run two calls at once)."""
        self.partial = partial
        self.spawn, self.say = spawn, say
        self.initial = initial_weights  # what a worker starts from until the first push
        self.workers = [spawn(i, initial_weights) for i in range(n_workers)]
        self.held = [version] * n_workers  # weight version each worker has (or has queued)
        self.deaths = [0] * n_workers  # deaths of each worker since it last finished a chunk
        self.weights_ref, self.version, self.pushes = None, version, [version]
        self.chunk_prompts, self.max_staleness = chunk_prompts, max_staleness
        self.pending: deque[Chunk] = deque()  # chunks waiting for a worker
        self.running: dict = {}  # ObjectRef -> (worker index, chunk, the worker's actor)
        # partial rollouts: a worker holds its next chunk too, to start its rows as the last one's end
        self.depth = 2 if partial else 1
        self.active = [0] * n_workers  # chunks each worker holds
        self.since = [0.0] * n_workers  # when it last went from none to one
        self.stream = stream
        self.ahead: deque[Batch] = deque()  # async: batches for the coming steps, oldest first
        self.next_id = 0
        self.cv = threading.Condition()
        self.busy_s, self.window_t0, self.sync_s = 0.0, time.perf_counter(), []
        self.counts = {"async/worker_restarts": 0, "async/dropped_stale_seqs": 0, "async/dropped_chunks": 0}
        if partial:
            self.counts["async/inflight_weight_loads"] = 0  # weights taken between decode steps
        self.last_metrics: dict = {}
        self.error: BaseException | None = None
        self.closed = False
        self.broadcast = False  # dist.weight_sync=broadcast (topology.place sets it): no restarts
        self.pushing: list = []  # the trainer's calls of the last broadcast
        self.thread = threading.Thread(target=self._pump, name="rollout-pool", daemon=True)
        self.thread.start()

    # --- the verbs the loop calls -------------------------------------------------------------

    def generate(self, rows: list[dict], n: int, temperature: float, top_p: float, max_new_tokens: int) -> Rollouts:
        """n completions of each row, spread over the workers; returns when all are done. Under
        async, rows the stream handed out were queued steps ago: the oldest queued batch is
        returned and the stream's next prompts are queued behind it (module docstring)."""
        kw = dict(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens)
        if self.stream is None or (self.ahead and not self.ahead[0].holds(rows)):  # evaluation, or not async
            return self._take(self._enqueue(rows, n, kw, front=True, bound=None))
        if not self.ahead:  # the first step: nothing queued yet
            self.ahead.append(self._enqueue(rows, n, kw, front=False, bound=self.max_staleness))
        if len(self.ahead) <= self.max_staleness:  # the coming steps' prompts, read by one probe of the stream
            probe = self.stream.fork()
            for _ in range(len(self.ahead) - 1):
                probe.next()
            for _ in range(len(self.ahead) - 1, self.max_staleness):
                self.ahead.append(self._enqueue(probe.next(), n, kw, front=False, bound=self.max_staleness))
        batch = self._take(self.ahead[0])
        self.ahead.popleft()
        return batch

    def load_weights(self, state, version: int | None = None) -> None:
        """Publish new weights (a dict, or an object ref from a remote trainer); each worker loads
        them before its next chunk. Returns once they are in the object store. Under
        dist.weight_sync=broadcast (``state`` is a ``Pushed``), every worker's part of the
        trainer's broadcast is queued now, behind the chunk it is running."""
        if isinstance(state, Pushed):
            self._receive(state, version)
            return
        ref = state if isinstance(state, ray.ObjectRef) else ray.put(state)
        ray.wait([ref], fetch_local=False)
        with self.cv:
            self.weights_ref, self.initial = ref, None
            self._new_version(version)
            if self.partial:  # running chunks take them between decode steps
                for i in {i for i, *_ in self.running.values()}:
                    self.workers[i].offer_weights.remote([ref], self.version)
                    self.held[i] = self.version
            self.cv.notify_all()

    def _receive(self, pushed: Pushed, version: int | None) -> None:
        ray.get(self.pushing)  # the previous broadcast's errors surface here, not never
        with self.cv:
            self._new_version(version)
            for i, w in enumerate(self.workers):
                w.receive_weights.remote(self.version)
                self.held[i] = self.version
            self.pushing, self.initial = pushed.refs, None
            self.cv.notify_all()

    def _new_version(self, version: int | None) -> None:
        """Called with the lock held: a push of ``version`` (None: the same version again)."""
        if version is not None and version != self.version:
            self.version = version
            self.pushes.append(version)

    def sleep(self, discard_weights: bool = False) -> None:
        """Nothing to free here: the workers are their own processes."""

    def close(self) -> None:
        self.closed = True
        self.thread.join(timeout=5)
        for w in self.workers:
            ray.kill(w)

    # --- queueing and consuming ----------------------------------------------------------------

    def _enqueue(self, rows: list[dict], n: int, kw: dict, front: bool, bound: int | None) -> Batch:
        # dist.chunk_prompts, or the batch split evenly over the workers (held-out evaluation too)
        size = self.chunk_prompts or math.ceil(len(rows) / len(self.workers))
        chunks = []
        for i in range(0, len(rows), size):
            chunks.append(Chunk(self.next_id, rows[i : i + size], n, kw))
            self.next_id += 1
        with self.cv:
            if front:
                self.pending.extendleft(reversed(chunks))
            else:
                self.pending.extend(chunks)
            self.cv.notify_all()
        return Batch(chunks, bound)

    def staleness(self, version: int) -> int:
        """Weight versions published after `version`: how far a sample lags the trained policy."""
        return len(self.pushes) - bisect.bisect_right(self.pushes, version)

    def _take(self, batch: Batch) -> Rollouts:
        """Wait for the batch's chunks; send any over the staleness bound back to be sampled again."""
        while True:
            with self.cv:
                self.cv.wait_for(lambda: self.error is not None or all(c.done for c in batch.chunks))
                if self.error is not None:
                    raise RuntimeError(f"rollout pool stopped: {self.error}") from self.error
                stale = [c for c in batch.chunks if c.result is not None and batch.bound is not None
                         and self.staleness(c.result.policy_version) > batch.bound]
                for c in stale:  # over-age: counted, then sampled again with the newest weights
                    self.counts["async/dropped_stale_seqs"] += len(c.result)
                    c.done, c.result = False, None
                self.pending.extendleft(reversed(stale))
                self.cv.notify_all()
                if not stale:
                    break
        parts = [c for c in batch.chunks if c.result is not None]
        if not parts:
            raise RuntimeError("every chunk of a rollout batch failed twice; the worker errors are logged above")
        out = Rollouts.cat([c.result for c in parts])
        self.last_metrics = self._metrics(parts, batch)
        return out

    def _metrics(self, parts: list[Chunk], batch: Batch) -> dict:
        lag = torch.tensor([self.staleness(c.result.policy_version) for c in parts for _ in range(len(c.result))])
        now = time.perf_counter()
        with self.cv:
            wall, busy = now - self.window_t0, self.busy_s
            self.window_t0, self.busy_s = now, 0.0
            # sampled sequences of later batches, waiting for the trainer
            waiting = sum(len(c.result) for b in self.ahead if b is not batch for c in b.chunks if c.result is not None)
            sync_s, self.sync_s = self.sync_s, []
        m = {"async/staleness_mean": lag.float().mean().item(), "async/staleness_max": int(lag.max()),
             "async/queue_depth": waiting,
             "async/rollout_idle_frac": min(1.0, max(0.0, 1 - busy / (len(self.workers) * wall))), **self.counts}
        if batch.bound is not None:  # sequences per staleness 0..bound
            m["hist/staleness"] = torch.bincount(lag, minlength=batch.bound + 1).tolist()
        m.update(self._token_staleness(parts))
        if sync_s:
            m["timing_s/worker_weight_load"] = sum(sync_s) / len(sync_s)
        for k in {k for c in parts for k in c.metrics}:  # the worker rollouts' own (e.g. tool calls)
            m[k] = sum(c.metrics.get(k, 0.0) for c in parts) / len(parts)
        return m

    def _token_staleness(self, parts: list[Chunk]) -> dict:
        """Partial rollouts: staleness per loss token (its own version's), and the share of rows whose
        tokens come from more than one version; {} where the chunks carry no token versions."""
        got = [c.result for c in parts if c.result.token_version is not None]
        if not got:
            return {}
        pushes = torch.tensor(self.pushes)
        lags, mixed = [], 0
        for r in got:
            v = r.token_version[r.completion_mask]  # (n,) each loss token's version
            lags.append(len(pushes) - torch.searchsorted(pushes, v, right=True))
            lo = r.token_version.masked_fill(~r.completion_mask, 1 << 62).amin(1)  # (B,)
            mixed += int((r.token_version.amax(1) > lo).sum())
        lag = torch.cat(lags).float()
        rows = sum(len(r) for r in got)
        return {"async/token_staleness_mean": lag.mean().item() if len(lag) else 0.0,
                "async/token_staleness_max": int(lag.max()) if len(lag) else 0,
                "async/mixed_version_rows": mixed / rows}

    # --- the pump thread -----------------------------------------------------------------------

    def _pump(self) -> None:
        try:
            while not self.closed:
                with self.cv:
                    self._dispatch()
                    refs = list(self.running)
                    if not refs:
                        self.cv.wait(0.05)
                        continue
                done, _ = ray.wait(refs, num_returns=1, timeout=0.05)
                for ref in done:
                    self._finish(ref)
        except BaseException as e:  # surfaced in the loop's thread by _take
            with self.cv:
                self.error = e
                self.cv.notify_all()

    def _dispatch(self) -> None:
        """Give each worker holding fewer than ``depth`` chunks the next one (the least loaded first),
        after the newest weights if it lacks them."""
        while self.pending and min(self.active) < self.depth:
            i = self.active.index(min(self.active))
            chunk = self.pending.popleft()
            if self.partial:  # the weights go with the chunk: the actor's calls may run side by side
                new = self.held[i] != self.version and self.weights_ref is not None
                ref = self.workers[i].generate.remote(chunk.id, chunk.rows, chunk.n, chunk.kw,
                                                      [self.weights_ref, self.version] if new else [])
                self.held[i] = self.version if new else self.held[i]
            else:
                if self.held[i] != self.version and self.weights_ref is not None:
                    self.workers[i].load_weights.remote(self.weights_ref, self.version)
                    self.held[i] = self.version
                ref = self.workers[i].generate.remote(chunk.id, chunk.rows, chunk.n, chunk.kw)
            self.running[ref] = (i, chunk, self.workers[i])
            if not self.active[i]:
                self.since[i] = time.perf_counter()
            self.active[i] += 1

    def _release(self, i: int) -> None:
        """Called with the lock held: worker i is done with one chunk; its busy time counts once it holds none."""
        self.active[i] -= 1
        if not self.active[i]:
            self.busy_s += time.perf_counter() - self.since[i]

    def _finish(self, ref) -> None:
        i, chunk, actor = self.running[ref]
        try:
            result, info = ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.OutOfMemoryError) as e:
            # the process died (Ray's memory monitor kills one as OutOfMemoryError): a new worker, the same chunk
            with self.cv:
                del self.running[ref]
                if actor is self.workers[i]:  # its other chunk's call fails too: one restart (which counts)
                    self._restart(i, e)
                self.pending.appendleft(chunk)
                self.cv.notify_all()
            return
        except ray.exceptions.RayTaskError as e:  # generate raised on this chunk: once more, then drop it
            chunk.attempts += 1
            self.say(f"rollout chunk {chunk.id} failed on worker {i} ({str(e).strip().splitlines()[-1]}); "
                     + ("retrying" if chunk.attempts < 2 else "dropping its prompts from this step"))
            result, info = None, {}
        with self.cv:
            del self.running[ref]
            if actor is self.workers[i]:  # not a call to the worker a restart replaced
                self.deaths[i] = 0
                self._release(i)
            if result is not None and not self.partial and result.policy_version < self.held[i]:
                # the load queued before this chunk failed (its weights object was lost with a node): the
                # chunk is labelled with the version the worker really held, and the next chunk sends again
                self.held[i] = result.policy_version
            if result is None and chunk.attempts < 2:
                self.pending.appendleft(chunk)
            else:
                chunk.done, chunk.result = True, result
                chunk.metrics = info.get("metrics", {})
                self.counts["async/dropped_chunks"] += result is None
                if info.get("sync_s"):
                    self.sync_s.append(info["sync_s"])
                if self.partial:
                    self.counts["async/inflight_weight_loads"] += info.get("inflight_loads", 0)
            self.cv.notify_all()

    def _restart(self, i: int, error: BaseException) -> None:
        """Called with the lock held: replace dead worker i; it syncs before its first chunk."""
        self.deaths[i] += 1
        if self.broadcast:
            raise RuntimeError(f"rollout worker {i} died ({error}) under dist.weight_sync=broadcast, where a new "
                               "worker cannot join the weight-sync group: resume the run from its last checkpoint "
                               "(rlpost train --resume RUN), or use dist.weight_sync=object_store, which restarts "
                               "workers")
        if self.deaths[i] > MAX_RESTARTS:
            raise RuntimeError(f"rollout worker {i} died {self.deaths[i]} times in a row: {error}")
        self.say(f"rollout worker {i} died ({type(error).__name__}); restarting it and re-issuing its chunk")
        try:
            ray.kill(self.workers[i])
        except Exception:  # already gone
            pass
        self.workers[i] = self.spawn(i, self.initial)
        if self.active[i]:  # the dead one's chunks: each is queued again as its call fails
            self.busy_s += time.perf_counter() - self.since[i]
        self.active[i] = 0
        self.held[i] = -1 if self.weights_ref is not None else self.version
        self.counts["async/worker_restarts"] += 1
