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


def test_untie_keeps_each_tensor_once_and_retie_puts_the_names_back():
    emb, w = torch.randn(5, 3), torch.randn(3, 3)
    state = {"emb": emb, "w": w, "head": emb, "head_view": emb.detach(), "rows": emb[1:], "t": emb.t(),
             "empty_a": torch.empty(0), "empty_b": torch.empty(0)}
    sent = sync.untie(state)
    # the same storage, offset, shape and strides is one tensor; a slice or a transpose of it is another, and
    # two empty tensors (storage address 0) are not taken for one
    assert list(sent) == ["emb", "w", "rows", "t", "empty_a", "empty_b"]
    back = sync.retie(sent, [["emb", "head", "head_view"], ["gone", "also_gone"]])
    assert back["head"] is back["emb"] and back["head_view"] is back["emb"]
    assert "gone" not in back and sync.retie(sent, []) == sent


def test_a_push_sends_the_tied_head_once_and_the_worker_samples_as_with_both_names():
    from functools import partial

    from helpers import digit_rows, tiny_cfg

    from rlpost import build
    from rlpost.distributed.actors import RolloutWorker, TrainerWorker
    from rlpost.observe import planner

    cfg = build.resolve_precision(tiny_cfg())
    trainer = TrainerWorker(threads=1)
    trainer.start(partial(build.trainer_from, cfg), None, cfg.rollout.dtype)
    model = trainer.trainer.model
    with torch.no_grad():  # weights the workers do not have yet
        model.get_input_embeddings().weight.add_(0.5)
    full = {k: v.detach().clone() for k, v in model.state_dict().items()}
    pushed = trainer.weights()
    # The tiny model (planner.TINY): 2 layers x (q, o 64 x 64, k, v 64 x 32, gate, up, down 64 x 128) = 73,728, the
    # embedding 76 x 64 = 4,864 (the head is the same tensor), 5 norms of 64 = 320: 78,912 values, not 83,776
    assert "lm_head.weight" not in pushed and "model.embed_tokens.weight" in pushed
    assert sum(v.numel() for v in pushed.values()) == 78_912 == planner.TINY.params
    assert sum(v.nbytes for v in pushed.values()) == planner.sync_bytes(planner.TINY, planner.Workload(
        sampler_bf16=False)) == 4 * 78_912  # rollout.dtype=float32 in the tiny runs
    assert [n for n, _, _ in trainer.weight_spec()] == sorted(pushed)  # the broadcast carries the same
    rows, kw = digit_rows(2, 0), dict(temperature=1.0, top_p=1.0, max_new_tokens=6)
    untied, both = (RolloutWorker(partial(build.sampler_from, cfg), None, 1, seed=0) for _ in range(2))
    untied.load_weights(pushed, 1)
    both.rollout.load_weights(full, 1)  # as before: every name, the head sent apart from the embedding
    head, emb = (untied.rollout.model.get_output_embeddings().weight,
                 untied.rollout.model.get_input_embeddings().weight)
    assert head.data_ptr() == emb.data_ptr() and torch.equal(emb, full["model.embed_tokens.weight"])
    a, b = untied.generate(7, rows, 4, kw)[0], both.generate(7, rows, 4, kw)[0]
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.sampler_logp, b.sampler_logp)
