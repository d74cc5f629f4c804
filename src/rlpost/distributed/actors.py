"""The two roles that move into Ray actors, and the trainer's proxy in the driver.

``RolloutWorker`` and ``TrainerWorker`` are plain classes (``ray.remote`` is applied in
topology.py), each building its role with the factory it is handed (``build.sampler_from`` /
``build.trainer_from``, around the same functions the colocated run uses), so a worker samples
and trains exactly as the single process does. ``RemoteTrainer`` gives the loop the trainer's verbs over an
actor handle.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

import ray
import torch

from rlpost.distributed import sync
from rlpost.model import device, heap, precision
from rlpost.roles.chunk_stream import ChunkStream
from rlpost.types.errors import RunError


@dataclass
class Pushed:
    """What ``RemoteTrainer.weights()`` returns under dist.weight_sync=broadcast: the trainer ranks'
    calls that are broadcasting the weights (the pool queues the matching receive on every worker)."""

    refs: list


class RolloutWorker:
    """One sampler in its own process: the rollout role and the version of the weights it holds.

    Partial rollouts (dist.partial_rollouts; the actor then runs two calls at once, topology.place):
    ``offer_weights`` arrives while ``generate`` runs and only leaves the weights' reference here;
    the decode loop's hook between two steps (``FastRollout.between_steps``) takes them, so rows
    that are running go on under the new weights and each token records its version."""

    def __init__(self, make_sampler: Callable, weights: dict | None, threads: int, seed: int):
        """make_sampler(weights): the rollout role over the starting policy with ``weights`` loaded when given."""
        torch.set_num_threads(threads)
        self.rollout = make_sampler(weights)
        model = sampler_model(self.rollout)
        self.tied = sync.tied(model) if model is not None else []  # pushes send a tied head once: sync.untie
        self.seed, self.sync_s = seed, 0.0
        self.lock, self.offered, self.inflight = threading.Lock(), None, 0  # partial rollouts
        self.turn = threading.Lock()  # chunks decoded one at a time (an engine that does not admit rows)
        self.stream: ChunkStream | None = None  # partial rollouts on an engine that admits rows: the decode thread
        self.reported = 0  # the stream's loads in flight counted in answers so far

    def offer_weights(self, box: list, version: int) -> None:
        """Partial rollouts: weights ``box[0]`` (an object reference, in a list so that Ray hands it over
        unfetched) of ``version``, for the running chunk to take between two decode steps; a newer
        offer replaces an older one not yet taken."""
        with self.lock:
            if self.offered is None or version > self.offered[1]:
                self.offered = (box[0], version)

    def _load_offer(self, engine) -> bool:
        """The stream's decode hook: load the offered weights, if newer than the engine's (the stream counts
        the loads itself, from the engine's version). True if it loaded."""
        with self.lock:
            offered, self.offered = self.offered, None
        if offered is not None and offered[1] > engine.version:
            self.load_weights(ray.get(offered[0]), offered[1])
            return True
        return False

    def _between_steps(self, engine) -> None:
        """The decode loop's hook for a chunk decoded alone: ``_load_offer``, each load counted in flight."""
        if self._load_offer(engine):
            with self.lock:
                self.inflight += 1

    def load_weights(self, state: dict, version: int) -> None:
        t0 = time.perf_counter()
        self.rollout.load_weights(sync.retie(state, self.tied), version)
        heap.trim()
        self.sync_s += time.perf_counter() - t0

    def join_sync(self, addr: str, rank: int, world: int, sp: sync.Spec, on_gpu: bool, meet_s: float) -> None:
        """Join the weight-sync group (dist.weight_sync=broadcast) as member ``rank``, meeting the
        others at ``addr`` within ``meet_s`` seconds."""
        sync.pin_interface(sync.node_ip())
        self.sync, self.spec = sync.Broadcast(addr, rank, world, on_gpu, meet_s=meet_s), sp

    def receive_weights(self, version: int) -> None:
        """Take part in the trainer's broadcast of version ``version`` and load what arrives."""
        t0 = time.perf_counter()
        state = self.sync.receive(self.spec)
        self.sync_s += time.perf_counter() - t0  # load_weights adds its own share
        self.load_weights(state, version)

    def generate(self, chunk_id: int, rows: list[dict], n: int, kw: dict, weights: list | None = None):
        """(the chunk's Rollouts, {seconds spent loading weights since the last chunk, metrics}).
        weights: partial rollouts only (None elsewhere): [object reference, version] to load before the
        chunk's prefill, or [] when the worker holds the newest; an actor's calls then run side by
        side (the pool hands a worker its next chunk before the last is done), so a separate
        load_weights call could land after the chunk began. On an engine that admits rows into a
        running decode the chunk joins the one running (roles/chunk_stream.py); on another, chunks
        take turns."""
        seed = self.seed * 1_000_003 + chunk_id  # the same samples on any worker
        if weights is not None:
            streams = getattr(self.rollout, "admits", False)
            self.rollout.between_steps = self._load_offer if streams else self._between_steps
            if weights:
                self.offer_weights(weights[:1], weights[1])
            if streams:
                with self.lock:  # the first two chunks arrive together: one stream, one decode thread
                    if self.stream is None:
                        self.stream = ChunkStream(self.rollout, self._load_offer)
                batch, _ = self.stream.submit(rows, n, kw, seed)
                with self.lock:  # the loads the stream took in flight since the last answer, each counted once
                    loads, self.reported = self.stream.loads - self.reported, self.stream.loads
                return self._answer(batch, loads)
        with self.turn:
            if weights is not None:
                self._between_steps(self.rollout)  # an offer that came after the last chunk ended, too
                self.inflight = 0  # taken before the first token: not in flight
            torch.manual_seed(seed)
            batch = self.rollout.generate(rows, n, **kw)
            with self.lock:
                loads, self.inflight = self.inflight, 0
            return self._answer(batch, loads)

    def _answer(self, batch, inflight_loads: int):
        """The chunk with what the pool counts: the weight loads taken while its rows ran, the seconds
        spent loading weights since the last answer, the engine's metrics."""
        with self.lock:
            info = {"sync_s": self.sync_s, "metrics": self.rollout.last_metrics, "inflight_loads": inflight_loads}
            self.sync_s = 0.0
        return batch, info


class TrainerWorker:
    """The trainer role in its own process; returns its busy seconds with each result. With
    world > 1 it is one rank of an FSDP2 data-parallel trainer (model/fsdp.py): every rank
    gets every call, and rank 0's answer is the one used. Made in two steps (topology.place):
    the actor, then ``start`` once rank 0 has said where the ranks meet (``rendezvous``)."""

    def __init__(self, threads: int):
        torch.set_num_threads(threads)
        self.rank = 0

    def rendezvous(self) -> str:
        """Rank 0: host:port where the ranks' process group meets: this node's address, a port free on it."""
        return sync.address()

    def start(self, make_trainer: Callable, weights: dict | None, sampler_dtype: str, rank: int = 0, world: int = 1,
              master: str = "", meet_s: float = 300.0) -> str:
        """make_trainer(weights, data_parallel): the trainer role over the starting policy (``weights``
        loaded when given), one rank of ``world`` meeting at ``master`` (rank 0's ``rendezvous``)
        within ``meet_s`` seconds when data_parallel; sampler_dtype: rollout.dtype. Returns this node's address."""
        if world > 1:
            self._join(master, rank, world, meet_s)
        self.rank = rank
        self.trainer = make_trainer(weights, data_parallel=world > 1)
        self.sampler_dtype = precision.sampler_dtype(sampler_dtype)
        return sync.node_ip()

    @staticmethod
    def _join(master: str, rank: int, world: int, meet_s: float) -> None:
        """torch's default process group over a TCP store at rank 0's ``master``: gloo on CPU, NCCL when
        the actor has a GPU. The store's timeout bounds the meeting; the collectives keep torch's own
        (a rank may wait on another behind a broadcast to a busy worker)."""
        host, port = master.rsplit(":", 1)
        sync.pin_interface(sync.node_ip())
        try:
            store = torch.distributed.TCPStore(host, int(port), world, is_master=rank == 0,
                                               timeout=timedelta(seconds=meet_s))
            torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo", store=store,
                                                 rank=rank, world_size=world)
        except (RuntimeError, OSError) as e:  # torch's DistNetworkError / DistStoreError are RuntimeErrors
            raise sync.unreachable(f"trainer rank {rank} of {world}", master, meet_s, e) from None

    def recompute(self, batch):
        t0 = time.perf_counter()
        return self.trainer.recompute(batch), time.perf_counter() - t0

    def update(self, batch, loss_fn):
        t0 = time.perf_counter()
        return self.trainer.update(batch, loss_fn), time.perf_counter() - t0

    def weights(self, for_sampler: bool = True) -> dict | None:
        """for_sampler: in the sampler's dtype (the workers cast to it anyway, and bf16 halves the
        bytes moved); else the float32 master weights, for a checkpoint. Every rank gathers (a
        collective); only rank 0's copy goes to the object store."""
        w = self.trainer.weights()
        if self.rank != 0:
            return None
        if for_sampler:  # a tied head once (the worker ties it back); a checkpoint keeps every name
            w = sync.untie(w)
        # To the host: the object store and the driver may have no GPU (a no-op on a CPU trainer).
        return {k: v.detach().to(device.CPU, self.sampler_dtype if for_sampler else v.dtype) for k, v in w.items()}

    def sync_address(self) -> str:
        return sync.address()

    def weight_spec(self) -> sync.Spec | None:
        """What each broadcast carries (names, shapes, the sampler's dtype); a collective, like weights()."""
        w = self.weights()
        return sync.spec(w) if w is not None else None

    def join_sync(self, addr: str, world: int, meet_s: float) -> None:
        """Rank 0 is member 0 of the weight-sync group (it sends); the other ranks only gather."""
        if self.rank == 0:
            sync.pin_interface(sync.node_ip())
            self.sync = sync.Broadcast(addr, 0, world, device.is_cuda(device.of(self.trainer.model)), meet_s=meet_s)

    def broadcast_weights(self) -> None:
        """Every rank gathers (a collective); rank 0 casts to the sampler's dtype where the weights
        are and broadcasts them to every rollout worker."""
        w = self.trainer.weights()
        if self.rank == 0:  # a tied head once, as weights() sends it (the spec was made from that)
            self.sync.send({k: v.detach().to(self.sampler_dtype) for k, v in sync.untie(w).items()})

    def state_dict(self) -> dict | None:
        state = self.trainer.state_dict()  # a collective under data parallelism
        return state if self.rank == 0 else None

    def load_state_dict(self, state: dict) -> None:
        self.trainer.load_state_dict(state)


class RemoteTrainer:
    """The trainer's verbs over actor handles (one per data-parallel rank; each call goes to all
    of them, rank 0 answers). ``weights()`` returns an object reference: the workers fetch the
    weights from the object store, never through the driver."""

    def __init__(self, handles: list, groups: tuple = ()):
        """groups: the run's Ray placement groups, removed with the trainer (topology.place)."""
        self.handles, self.groups = handles, groups
        self.busy_s, self.t_last = 0.0, None
        self.broadcast = False  # dist.weight_sync=broadcast: weights() starts a broadcast (topology.place sets it)

    def _all(self, verb: str, *args):
        """Call `verb` on every rank; rank 0's result (the ranks hold the same numbers)."""
        if len(self.handles) > 1:  # the batch goes into the object store once, not once per rank
            args = [ray.put(a) for a in args]
        try:
            return gather([getattr(h, verb).remote(*args) for h in self.handles])[0]
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as e:
            if isinstance(e, ray.exceptions.RayTaskError) and not peer_lost(e):
                raise  # the trainer's own error, with its traceback
            # Its process or node is gone, or a rank's collective lost its peer (which often says so first).
            raise RunError(f"a trainer rank died during {verb} ({lost(e)}): its process or node is gone; the run's "
                           "checkpoints are whole, and `rlpost train --resume RUN` continues from the last one on the "
                           "nodes left") from None

    def recompute(self, batch):
        out, busy = self._all("recompute", batch)
        self.busy_s += busy
        return out

    def update(self, batch, loss_fn) -> dict:
        metrics, busy = self._all("update", batch, loss_fn)
        self.busy_s += busy
        now = time.perf_counter()
        if self.t_last is not None:  # share of the time since the last update the trainer sat waiting
            metrics["async/trainer_idle_frac"] = max(0.0, 1 - self.busy_s / (now - self.t_last))
        self.busy_s, self.t_last = 0.0, now
        return metrics

    def weights(self):
        if self.broadcast:
            return Pushed([h.broadcast_weights.remote() for h in self.handles])
        return [h.weights.remote() for h in self.handles][0]

    def checkpoint_weights(self) -> dict:
        """The float32 master weights (``weights()`` is the sampler's bf16 copy)."""
        return self._all("weights", False)

    def state_dict(self) -> dict:
        return self._all("state_dict")

    def load_state_dict(self, state: dict) -> None:
        self._all("load_state_dict", state)

    def close(self) -> None:
        for h in self.handles:
            ray.kill(h)
        for g in self.groups:  # after the actors: removing a group kills what still runs in it
            ray.util.remove_placement_group(g)


def sampler_model(rollout) -> torch.nn.Module | None:
    """The torch model a rollout samples with (an episode wrapper's through its ``inner``); None where the engine
    keeps its own (vLLM)."""
    while rollout is not None and not isinstance(getattr(rollout, "model", None), torch.nn.Module):
        rollout = getattr(rollout, "inner", None)
    return rollout.model if rollout is not None else None


def gather(refs: list) -> list:
    """ray.get of every ref, where the first error raises at once: a rank that died leaves the
    others waiting in a collective, so waiting for them in order could take torch's whole timeout."""
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        ray.get(done)
    return ray.get(refs)


# How gloo and NCCL say that the other end of a collective went away (its process died, its node was lost).
PEER_LOST = re.compile(r"Connection (reset|closed) by peer|Broken pipe|remote process exited|NCCL communicator was "
                       r"aborted|DistNetworkError")


def peer_lost(error: BaseException) -> bool:
    return bool(PEER_LOST.search(str(error)))


def lost(error: BaseException) -> str:
    """An actor error's cause in a few words (Ray's own message runs to many lines)."""
    text = str(error)
    m = PEER_LOST.search(text)
    if m:
        return f"a collective's peer: {m[0]}"
    first = (text.strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first[:160]}" if first else type(error).__name__
