"""The broadcast weight-sync group (distributed/sync.py) between plain processes on gloo."""

import multiprocessing as mp

import pytest
import torch

from rlpost.distributed import sync


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
    addr, world = sync.address("127.0.0.1"), 3
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


def test_the_interface_is_the_one_that_carries_the_node_address():
    nics = {"lo": ["127.0.0.1", "::1"], "eth0": ["192.0.2.7", "fe80::1"], "veth1": ["10.78.0.2"]}
    assert sync.interface_of("10.78.0.2", nics) == "veth1"
    assert sync.interface_of("192.0.2.7", nics) == "eth0"
    assert sync.interface_of("10.78.0.9", nics) is None


def test_a_rank_that_cannot_reach_rank_0_stops_in_bounded_time_naming_the_address(monkeypatch):
    import time

    from rlpost.distributed.actors import TrainerWorker

    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):  # _join pins them: not for the tests after this one
        monkeypatch.setenv(var, "lo")

    addr = sync.address("127.0.0.1")  # nobody listens there
    t0 = time.perf_counter()
    with pytest.raises(sync.Unreachable) as e:
        TrainerWorker._join(addr, rank=1, world=2, meet_s=2)  # private: the rendezvous without a Ray actor around it
    assert time.perf_counter() - t0 < 30
    msg = str(e.value)
    assert "\n" not in msg and addr in msg and "dist.rendezvous_timeout_s=2" in msg and "trainer rank 1 of 2" in msg


def test_each_actor_asks_ray_for_its_threads_scaled_to_fit_the_smallest_node():
    from rlpost.distributed.topology import cpu_share, cpus

    assert cpu_share([2, 2], [8, 4]) == 1.0  # fits: each asks for what it uses
    # 2 cores hosting a trainer and two workers, 1 thread each: two thirds of a CPU each
    assert cpu_share([1, 1, 1], [2.0]) == pytest.approx(2 / 3)
    assert cpu_share([4, 2, 2], [16, 4]) == 0.5  # the smallest node sets it
    assert cpus(1, 2 / 3) == 0.6666 and cpus(1, 1e-9) == 1e-4  # rounded down to Ray's step, never 0
    share = cpu_share([1, 2, 2], [2.0])
    assert cpus(1, share) + 2 * cpus(2, share) <= 2.0
