"""Weight sync by a collective broadcast (``dist.weight_sync=broadcast``), from the trainer's rank 0
to every rollout worker, as verl and OpenRLHF do: gloo on CPU, NCCL on GPU, the same code.

The default path (``object_store``) puts the weights into Ray's object store once per push and
each worker fetches them from there before its next chunk (pool.py). A broadcast instead moves
them straight from the trainer's process into each worker's, with no copy in the store: the
trainer flattens the state into one buffer per dtype, and every worker receives into a buffer of
the same size and splits it back into named tensors. What each tensor is (name, shape, dtype)
comes once, at set-up (``spec``), not with every push.

The group is its own, made from a TCP store at an address the trainer's rank 0 picks, not torch's
default process group (an FSDP trainer already uses that one for its ranks). Every member must
take part in every broadcast: a worker that dies cannot rejoin, so under this mode a dead worker
ends the run (pool.py says so), and the run resumes from its last checkpoint.
"""

from __future__ import annotations

import socket
from collections import defaultdict
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from rlpost.model import device

Spec = list[tuple[str, tuple[int, ...], torch.dtype]]  # (name, shape, dtype) of each tensor, in send order


def spec(state: dict[str, Tensor]) -> Spec:
    return [(name, tuple(t.shape), t.dtype) for name, t in sorted(state.items())]


def address() -> str:
    """host:port for the group's TCP store, on this machine (the trainer's rank 0 calls it, inside
    its actor): the node's address as Ray knows it, which the workers on other nodes can reach."""
    import ray

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return f"{ray.util.get_node_ip_address()}:{port}"


class Broadcast:
    """One member of the weight-sync group: rank 0 sends, the others receive."""

    def __init__(self, addr: str, rank: int, world: int, on_gpu: bool, timeout_s: float = 1800):
        host, port = addr.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), world, is_master=rank == 0, timeout=timedelta(seconds=timeout_s))
        if on_gpu:
            self.pg = dist.ProcessGroupNCCL(store, rank, world)
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.pg = dist.ProcessGroupGloo(store, rank, world, timedelta(seconds=timeout_s))
            self.device = device.CPU
        self.rank = rank

    def _bcast(self, flat: Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        self.pg.broadcast([flat], opts).wait()

    def send(self, state: dict[str, Tensor]) -> None:
        """Rank 0: every tensor of ``state``, one flat buffer per dtype."""
        by_dtype = defaultdict(list)
        for name, shape, dtype in spec(state):
            by_dtype[dtype].append(state[name].detach().to(self.device).reshape(-1))
        for dtype in sorted(by_dtype, key=str):
            self._bcast(torch.cat(by_dtype[dtype]))

    def receive(self, sp: Spec) -> dict[str, Tensor]:
        """A worker: the state rank 0 sent, as named tensors (views of one buffer per dtype)."""
        by_dtype = defaultdict(list)
        for name, shape, dtype in sp:
            by_dtype[dtype].append((name, shape))
        out = {}
        for dtype in sorted(by_dtype, key=str):
            items = by_dtype[dtype]
            sizes = [torch.Size(shape).numel() for _, shape in items]
            flat = torch.empty(sum(sizes), dtype=dtype, device=self.device)
            self._bcast(flat)
            for (name, shape), part in zip(items, flat.split(sizes)):
                out[name] = part.view(shape)
        return out
