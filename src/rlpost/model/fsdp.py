"""FSDP2 data parallelism for the trainer: shard a HF causal LM across the ranks of an already
initialised ``torch.distributed`` process group, and the few collectives the trainer needs
around it. The mesh takes its device type from the model's parameters; the trainer runs on CPU
today, so that is gloo (tests/model/test_fsdp.py runs 2 ranks).

Every rank holds 1/world of each parameter, gradient and AdamW moment. A forward all-gathers one
decoder layer at a time (and the root's embedding / norm / lm_head once), a backward
reduce-scatters the gradients. The trainer gives each rank its own rows of every mini-batch and
normalises each rank's loss by the *whole* mini-batch totals (``Rollouts.norm_tokens``), so the
per-rank gradients add up to the full-batch gradient: the reduce-scatter must SUM, not average
(``shard_causal_lm`` sets that). The trainer turns the sync off for all but the last
micro-batch (``set_requires_gradient_sync``), so it runs once per optimizer step. That saves
communication; syncing every micro-batch gives the same sum (FSDP2 adds each reduce-scatter
into the sharded .grad; checked by hand), while reducing the result again would double it.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict, set_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor


def rank_world() -> tuple[int, int]:
    """(this process's rank, number of ranks); (0, 1) without an initialised process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def shard_causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """Apply FSDP2 in place: each decoder layer its own unit, then the root (embedding, final
    norm and lm_head; a tied embedding/lm_head is one Parameter there, sharded once).

    Gradient reduction is a plain SUM: the trainer's per-rank losses already carry the
    1/(mini-batch total) factor, so FSDP's default average would divide by world a second
    time. ``set_gradient_divide_factor(1.0)`` alone asks for a PREMUL_SUM reduce op, which
    gloo lacks; with ``set_force_sum_reduction_for_comms`` FSDP sends ReduceOp.SUM and
    post-divides by the factor, and a factor of 1 skips that division."""
    device_type = next(model.parameters()).device.type
    mesh = init_device_mesh(device_type, (rank_world()[1],))
    for layer in model.get_decoder().layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in model.modules():  # both setters act on one module's own groups only
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    return model


def add_forward_method(model: torch.nn.Module, name: str, fn: Callable) -> None:
    """Make ``model.<name>(...)`` call ``fn(model, ...)`` inside the root's FSDP forward hooks.

    ``policy_forward`` runs the decoder and then the lm_head weight through ``ChunkedLogp``
    without ever calling the root's ``forward``. Registered this way, the root's parameters
    (embedding, norm, the tied head) are all-gathered before ``fn`` runs, so the head is a plain
    full tensor there, and its gradient is reduce-scattered with the rest after backward."""
    setattr(model, name, functools.partial(fn, model))
    register_fsdp_forward_method(model, name)


def full_tensor(t: Tensor) -> Tensor:
    """The whole tensor on every rank (a collective for a DTensor; the tensor itself otherwise)."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def full_state_dict(model: torch.nn.Module) -> dict[str, Tensor]:
    """The unsharded ``model.state_dict()`` on every rank: same keys as the unsharded model, plain
    tensors. Tied keys (embed_tokens / lm_head) share one DTensor: gathered once, returned twice."""
    gathered: dict[int, Tensor] = {}
    out = {}
    for k, v in model.state_dict().items():  # same key order on every rank: collectives line up
        if id(v) not in gathered:
            gathered[id(v)] = full_tensor(v).detach()
        out[k] = gathered[id(v)]
    return out


# Optimizer state as full (unsharded) tensors keyed by parameter name: rank 0 can write it as the
# one checkpoint, and any rank count whose model has the same names can load it back.
_FULL = StateDictOptions(full_state_dict=True)


def optimizer_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    return get_optimizer_state_dict(model, opt, options=_FULL)


def load_optimizer_state(model: torch.nn.Module, opt: torch.optim.Optimizer, state: dict) -> None:
    set_optimizer_state_dict(model, opt, state, options=_FULL)


def all_reduce_sums(values: dict[str, float], device: torch.device | None = None) -> dict[str, float]:
    """Sum each metric over the ranks (keys sorted so every rank packs the same order); the buffer
    goes on ``device``, the model's (NCCL reduces CUDA tensors only)."""
    keys = sorted(values)
    buf = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(buf)
    return dict(zip(keys, buf.tolist()))


def all_reduce(t: Tensor, op=dist.ReduceOp.SUM) -> Tensor:
    """``t`` reduced over the ranks, in place (float64 sums and maxima of diagnostics)."""
    dist.all_reduce(t, op=op)
    return t


def row_bounds(n: int, world: int) -> list[int]:
    """Contiguous near-equal shares of n rows: rank r owns rows bounds[r]:bounds[r + 1].
    Contiguous, not strided, so a GRPO group mostly stays on one rank and its prompt prefix
    is still shared in the forward."""
    return [r * n // world for r in range(world + 1)]


def micro_count(n: int, world: int, micro: int) -> int:
    """Micro-batches per rank for a mini-batch of n rows: the same number on every rank, since
    each FSDP forward and backward is a collective that all ranks must join."""
    return max(1, math.ceil(math.ceil(n / world) / micro))  # ceil(n / world): the largest share


def all_gather_rows(part: Tensor, n: int) -> Tensor:
    """Concatenate each rank's rows (its ``row_bounds(n, world)`` share) into the full (n, ...)
    tensor on every rank. Shares differ by at most a row, so pad to the longest and cut back."""
    rank, world = rank_world()
    bounds = row_bounds(n, world)
    padded = part.new_zeros((math.ceil(n / world), *part.shape[1:]))  # the largest share
    padded[: len(part)] = part
    chunks = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(chunks, padded)
    return torch.cat([c[: bounds[r + 1] - bounds[r]] for r, c in enumerate(chunks)])
