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

import os
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


def untie(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """``state`` with each tensor once: a name whose tensor is an earlier name's (the same storage, offset, shape
    and strides: a tied lm_head is the input embedding under a second name) is left out, so a push casts and sends
    it once (the embedded model: 134.5M values, not 162.8M); the receiver puts it back (``retie``)."""
    seen, out = set(), {}
    for name, t in state.items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        if t.numel() and key in seen:
            continue
        seen.add(key)
        out[name] = t
    return out


def tied(model: torch.nn.Module) -> list[list[str]]:
    """The names of each parameter ``model`` holds under more than one name (a tied head and its embedding)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def retie(state: dict[str, Tensor], groups: list[list[str]]) -> dict[str, Tensor]:
    """``state`` as ``untie`` sent it, with every name of a tied group (``tied``) that it left out given the
    group's sent tensor: the receiver's head and embedding are one tensor again."""
    out = dict(state)
    for group in groups:
        sent = next((out[name] for name in group if name in out), None)
        for name in group if sent is not None else ():
            out.setdefault(name, sent)
    return out


class Unreachable(RuntimeError):
    """A process group's members did not meet at its rank 0's address in time: one line naming the
    address and what to change (raised inside an actor; the driver stops the run with its message)."""


def node_ip() -> str:
    """This node's address as Ray knows it (``ray start --node-ip-address``), which the other nodes reach."""
    import ray

    return ray.util.get_node_ip_address()


def address(host: str = "") -> str:
    """host:port for a process group's TCP store on this node (its rank 0 calls it, inside its actor):
    the node's address, and a port free on it. The port is let go before the store binds it again, a
    race that only another program grabbing the same port in that instant can lose."""
    host = host or node_ip()
    with socket.socket() as s:
        s.bind((host, 0))
        return f"{host}:{s.getsockname()[1]}"


def interface_of(ip: str, interfaces: dict[str, list[str]]) -> str | None:
    """The name of the interface that carries ``ip`` ({name: its addresses}), or None."""
    return next((name for name, addrs in interfaces.items() if ip in addrs), None)


def pin_interface(ip: str) -> None:
    """Make gloo and NCCL talk through the interface that carries this node's address. Left alone,
    gloo binds the address this machine's hostname resolves to, often 127.0.0.1 (/etc/hosts), which
    the other nodes cannot reach; a user's GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME win."""
    import psutil

    name = interface_of(ip, {n: [a.address for a in addrs] for n, addrs in psutil.net_if_addrs().items()})
    if name is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", name)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", name)


def unreachable(what: str, addr: str, timeout_s: float, error: BaseException) -> Unreachable:
    """The one line a member that could not meet the others stops the run with."""
    cause = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    return Unreachable(f"{what} could not meet at {addr} within dist.rendezvous_timeout_s={timeout_s:g} s from "
                       f"{node_ip()} ({cause}): let the nodes reach each other on that address's ports (a firewall), "
                       "start each node with an address the others reach (ray start --node-ip-address), or name the "
                       "interface with GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME")


class Broadcast:
    """One member of the weight-sync group: rank 0 sends, the others receive."""

    def __init__(self, addr: str, rank: int, world: int, on_gpu: bool, timeout_s: float = 1800,
                 meet_s: float | None = None):
        """timeout_s: how long a broadcast may wait for a member (busy with its chunk); meet_s: how long
        the members may take to meet at ``addr`` (dist.rendezvous_timeout_s; default timeout_s)."""
        host, port = addr.rsplit(":", 1)
        meet = meet_s or timeout_s
        try:
            store = dist.TCPStore(host, int(port), world, is_master=rank == 0, timeout=timedelta(seconds=meet))
            if on_gpu:
                self.pg = dist.ProcessGroupNCCL(store, rank, world)
                self.device = torch.device("cuda", torch.cuda.current_device())
            else:
                self.pg = dist.ProcessGroupGloo(store, rank, world, timedelta(seconds=timeout_s))
                self.device = device.CPU
        except (RuntimeError, OSError) as e:  # torch's DistNetworkError / DistStoreError are RuntimeErrors
            raise unreachable(f"the weight-sync group (member {rank} of {world})", addr, meet, e) from None
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
