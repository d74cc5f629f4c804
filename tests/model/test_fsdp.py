"""Data parallelism (FSDP2, 2 ranks on gloo) against one process without it (the real collectives, not a stand-in): the
same accumulated gradients, the same parameters after updates, the same metrics, full weights
on every rank, and optimizer state that round-trips."""

import copy
import os
import socket
import sys
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers import tcfg

from rlpost.algorithms.grpo import GRPO
from rlpost.model import fsdp
from rlpost.model.load import load_policy
from rlpost.model.logprobs import completion_logprobs
from rlpost.roles.row_plan import LocalPlan, ShardedPlan
from rlpost.build import trainer_over
from rlpost.roles.trainer import Trainer
from rlpost.types.batch import Rollouts

SEED, GROUP, MINI, MICRO = 3, 4, 8, 2  # 16 rows -> 2 mini-batches of 8 -> 4 rows a rank -> 2 micro-batches
# AdamW's first steps move each weight by about lr * sign(grad), so float rounding in a gradient
# entry near 0 can flip a step: the 1- vs 2-rank weight gap grows with lr (8e-6 at 1e-2, measured).
LR = 1e-3


def synthetic_batch(model, n_prompts: int = 4, P: int = 6, T: int = 8, seed: int = 0) -> Rollouts:
    """Random left-padded prompts (shared within each group of GROUP rows) and random completions
    of varied lengths; sampler log-probs are the model's own, advantages GRPO's."""
    g = torch.Generator().manual_seed(seed)
    B, V = n_prompts * GROUP, model.config.vocab_size
    prompt_len = torch.randint(2, P + 1, (n_prompts,), generator=g).repeat_interleave(GROUP)  # (B,)
    prompt_mask = torch.arange(P)[None, :] >= (P - prompt_len)[:, None]  # (B, P) left-padded
    prompt_ids = torch.randint(5, V, (n_prompts, P), generator=g).repeat_interleave(GROUP, 0) * prompt_mask  # (B, P)
    comp_len = torch.randint(1, T + 1, (B,), generator=g)  # (B,)
    completion_mask = torch.arange(T)[None, :] < comp_len[:, None]  # (B, T)
    batch = Rollouts(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask,
        completion_ids=torch.randint(5, V, (B, T), generator=g) * completion_mask, completion_mask=completion_mask,
        sampler_logp=torch.zeros(B, T), truncated=comp_len == T,
        group_ids=torch.arange(n_prompts).repeat_interleave(GROUP), rows=[{}] * B, completions=[""] * B,
    )
    with torch.no_grad():
        batch.sampler_logp = completion_logprobs(model, batch, 1.0)[0]  # (B, T)
    batch.reward = torch.rand(B, generator=g)
    batch.advantages = GRPO(group_size=GROUP).advantages(batch).tokens
    return batch


def make_trainer(data_parallel: bool, micro: int = MICRO, bf16: bool = False) -> Trainer:
    model = load_policy("tiny", dtype=torch.float32, seed=SEED).model
    # transformers' forward on both sides (the ranks cannot run packed): this compares the parallelism alone
    return trainer_over(model, tcfg(lr=LR, precision="bf16" if bf16 else "fp32", forward="hf"), 1.0,
                        mini_batch_size=MINI, micro_batch_size=micro, total_optimizer_steps=4,
                        plan=ShardedPlan() if data_parallel else LocalPlan())


def full_grads(tr: Trainer) -> dict:
    """Every parameter's whole gradient by name; the tied embedding/head under "tied" (1-rank:
    the head's dense gradient plus the split lookup's sparse rows, as Trainer.step folds them)."""
    head = tr.model.get_output_embeddings().weight
    out = {n: fsdp.full_tensor(p.grad) for n, p in tr.model.named_parameters() if p is not head and p is not tr.lookup}
    out["tied"] = fsdp.full_tensor(head.grad)
    if tr.lookup is not None:
        out["tied"] = out["tied"] + tr.lookup.grad.to_dense()
    return out


def scenario(data_parallel: bool, batch: Rollouts) -> dict:
    """The same calls on either trainer; every rank runs all of it (each verb is a collective)."""
    algo = GRPO(group_size=GROUP)
    out = {}
    # 1. One mini-batch's gradient, accumulated over 2 micro-batches a rank, before any step, in
    # float32 and under bf16 autocast.
    for bf16 in (False, True):
        tr = make_trainer(data_parallel, bf16=bf16)
        out[f"recompute_{bf16}"] = tr.recompute(batch)[0]
        # the mini-batch pass alone (private): the raw sum over the ranks' micro-batches, before the step
        # clips it and folds the lookup in, each gradient gathered whole (full_grads)
        mini = copy.deepcopy(batch.select(slice(0, MINI)))
        tr._mini_batch(mini, algo.loss)  # private: no public verb stops before the step
        out[f"grads_{bf16}"] = full_grads(tr)
    # 2. Whole updates: old log-probs recomputed, two mini-batches (two optimizer steps); then a
    # short batch of 5 rows at micro 1, where the ranks hold 2 and 3 rows (one pads with a blank).
    tr = make_trainer(data_parallel)
    out["metrics"] = tr.update(copy.deepcopy(batch), algo.loss)
    tr.micro = 1
    out["metrics_short"] = tr.update(copy.deepcopy(batch.select(slice(0, 5))), algo.loss)
    out["weights"] = {k: v.clone() for k, v in tr.weights().items()}
    if data_parallel:  # optimizer state back into a fresh trainer, read out again
        state = tr.state_dict()
        again = make_trainer(True)
        again.load_state_dict(state)
        out["state"], out["state_again"] = state, again.state_dict()
    return out


def _rank_main(rank: int, world: int, port: int, batch: Rollouts, path: str) -> None:
    torch.set_num_threads(1)  # two ranks on two cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    out = scenario(True, batch)
    if rank == 0:
        torch.save(out, path)
    # Tear down together, then leave without the interpreter's own exit: a CI run lost rank 1 to
    # SIGABRT ("terminate called without an active exception", a C++ thread destroyed while still
    # joinable) after its work was done, while rank 0 was still saving. A rank that finishes first
    # no longer closes its sockets under the other, and no C++ static destructor runs at exit.
    # An exception above still reaches the parent (mp.spawn's error file) before any of this.
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_ranks(batch: Rollouts, path: str, timeout: float = 120.0) -> dict:
    ctx = mp.spawn(_rank_main, args=(2, free_port(), batch, path), nprocs=2, join=False)
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=2):  # raises if a rank failed
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("ranks did not finish: a collective deadlocked")
    return torch.load(path, weights_only=False)


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def flat(state, prefix="") -> dict:
    """Nested optimizer state as {path: value}."""
    if isinstance(state, dict):
        return {k: v for key, sub in state.items() for k, v in flat(sub, f"{prefix}/{key}").items()}
    if isinstance(state, (list, tuple)):
        return {k: v for i, sub in enumerate(state) for k, v in flat(sub, f"{prefix}/{i}").items()}
    return {prefix: state}


@pytest.mark.slow  # 2 spawned ranks, each importing torch and transformers: 7-13 s on 2 cores
def test_two_ranks_match_one_process(tmp_path):
    batch = synthetic_batch(load_policy("tiny", dtype=torch.float32, seed=SEED).model)
    dp = run_two_ranks(batch, str(tmp_path / "rank0.pt"))
    one = scenario(False, batch)
    # Per-rank losses are normalised by the whole mini-batch, and FSDP sums them: the gathered
    # gradient is the 1-process one. (An average would halve it; AdamW alone would hide that.)
    assert max_diff(dp["grads_False"], one["grads_False"]) < 1e-6
    assert any(g.abs().sum() > 0 for g in one["grads_False"].values())
    assert torch.allclose(dp["recompute_False"], one["recompute_False"], atol=1e-6)
    # Under bf16 autocast only up to rounding: 1-rank micro 1, 2, 4, 8 differ by ~1e-3 among
    # themselves; a cast cache kept across FSDP micro-batches was off by 0.08 (gradients ~0.2).
    assert max_diff(dp["grads_True"], one["grads_True"]) < 1e-2
    assert (dp["recompute_True"] - one["recompute_True"]).abs().max() < 2e-2
    # After 3 optimizer steps (recompute, 2 mini-batches, then the padded short batch).
    assert max_diff(dp["weights"], one["weights"]) < 1e-5
    start = load_policy("tiny", dtype=torch.float32, seed=SEED).model.state_dict()
    assert max_diff(one["weights"], start) > 1e-3  # the updates moved the weights
    for key in ("actor/loss", "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy",
                "actor/grad_norm", "actor/logp_diff_sampler_mean", "actor/logp_diff_sampler_max"):
        for m in ("metrics", "metrics_short"):
            assert dp[m][key] == pytest.approx(one[m][key], rel=1e-4, abs=1e-6), (m, key)
    assert dp["metrics"]["hist/sampler_ratio"] == one["metrics"]["hist/sampler_ratio"]
    # The full optimizer state survives a save/load into a fresh data-parallel trainer.
    saved, again = flat(dp["state"]), flat(dp["state_again"])
    assert saved.keys() == again.keys() and any(isinstance(v, torch.Tensor) and v.numel() > 1 for v in saved.values())
    for k, v in saved.items():
        assert torch.equal(v, again[k]) if isinstance(v, torch.Tensor) else v == again[k], k
