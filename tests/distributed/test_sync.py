"""The broadcast weight-sync group (distributed/sync.py) between plain processes on gloo."""

import multiprocessing as mp

import pytest
import torch

from rlpost.distributed import sync
from rlpost.distributed.topology import free_port


def state():
    g = torch.Generator().manual_seed(0)
    return {"b.weight": torch.randn(3, 5, generator=g).to(torch.bfloat16), "a.bias": torch.randn(7, generator=g),
            "c.scale": torch.randn(2, 2, 2, generator=g), "d.count": torch.arange(4)}


def member(addr, rank, world, sp, out):
    """A receiving member: what arrived against what rank 0 sent (the forked copy of ``state()``),
    bit for bit, in each tensor's own dtype and shape; the differences go back as strings."""
    got = sync.Broadcast(addr, rank, world, on_gpu=False, timeout_s=60).receive(sp)
    sent = state()
    wrong = [k for k, v in sent.items() if k not in got or got[k].dtype != v.dtype or not torch.equal(got[k], v)]
    out.put((rank, sorted(got), wrong))


def test_every_worker_receives_exactly_what_rank_0_sent():
    sent = state()
    sp = sync.spec(sent)
    assert [n for n, _, _ in sp] == sorted(sent)  # one order on every member
    addr, world = f"127.0.0.1:{free_port()}", 3
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=member, args=(addr, r, world, sp, out)) for r in (1, 2)]
    for p in procs:
        p.start()
    sync.Broadcast(addr, 0, world, on_gpu=False, timeout_s=60).send(sent)
    got = sorted(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert got == [(1, sorted(sent), []), (2, sorted(sent), [])]


def test_broadcast_needs_a_distributed_topology():
    from helpers import tiny_cfg

    from rlpost.types.errors import ConfigError

    with pytest.raises(ConfigError, match="dist.weight_sync=broadcast .* dist.topology=disaggregated or async"):
        tiny_cfg("dist.weight_sync=broadcast")
