"""The trainer's row plan: which rows of a batch this process trains, and what it shares with other
processes. ``build.make_trainer`` picks one; the trainer calls its verbs and reads its two flags.

``LocalPlan``: every row here, as one process trains (the plain trainer).

``ShardedPlan``: data parallelism, FSDP2 over the ranks of the already initialised process group
(model/fsdp.py). Every rank builds the same Trainer and is handed the same full batch; each trains
on its own contiguous rows of every mini-batch, with the loss normalised by the whole mini-batch's
totals, so the per-rank gradients SUM to the full-batch gradient (FSDP's reduce-scatter is set to
sum, once per optimizer step). Metrics are summed over the ranks, which gives the 1-rank numbers
(they are token-share weighted by the whole mini-batch). ``gather`` and ``weights`` return full
tensors on every rank.

The verbs, the same on both:
  prepare(model, critic)        the policy's forward and the tied lookup's own leaf (or None)
  micro_batches(rows, micro, order)  [(micro-batch, its indices into rows or None for a stand-in)];
                                the local plan also cuts by tokens (trainer.micro_batch_tokens)
  sync_gradients(model, last)   whether this micro-batch's backward reduces the gradients
  head_grad(model)              a HeadGrad for the mini-batch's lm_head, or None
  reduce(sums, device)          a mini-batch's metric sums over every rank
  all_sum(t), all_max(t)        tensors reduced over every rank, in place
  gather(parts, rows)           this process's recomputed rows -> every row of ``rows``
and two flags: ``sharded`` (the trainer then runs the prompts per micro-batch, and the packed trunk
does not apply) and ``cast_cache`` (whether autocast may keep its bf16 casts across micro-batches).
  weights(model), optimizer_state(model, opt), load_optimizer_state(model, opt, state)
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
from torch import Tensor

from rlpost.algorithms.core import ratio_histogram
from rlpost.model import device, fsdp, lora
from rlpost.model.logprobs import HeadGrad, policy_forward
from rlpost.types.batch import Rollouts

# micro_batches' orders: the rows as they are (recompute), whole groups by their longest row (each
# micro-batch runs its groups' prompts), or rows by their own length (the prompts ran once ahead).
ORDERS = ("rows", "groups", "own_length")


def split_tied_embedding(model: torch.nn.Module) -> torch.nn.Parameter | None:
    """When the input embedding is the lm_head's weight (tied, as in SmolLM2), give the lookup its
    own leaf over the same storage, with a sparse gradient; return that leaf.

    Autograd sums the two uses of one tied leaf into a fresh dense 49152 x 576 tensor on every
    micro-batch (measured ~0.18 s each in the update profile, most of it first-touch page faults).
    As separate leaves, the head gets its dense gradient, the lookup a sparse one (a few hundred
    rows), and ``Trainer._step`` adds the rows into the head's gradient once per optimizer step.
    The optimizer holds only the head's leaf, so the shared storage is updated once."""
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if not (isinstance(emb, torch.nn.Embedding) and head is not None and emb.weight is head.weight
            and head.weight.requires_grad):
        return None
    emb.sparse = True
    emb.weight = torch.nn.Parameter(head.weight.detach(), requires_grad=True)  # same storage, own leaf
    return emb.weight


def ordered(rows: Rollouts, micro: int, order: str) -> Tensor:
    """(B,) the row order micro-batches are cut from (ORDERS); one micro-batch keeps the rows as they are."""
    if order == "rows" or micro >= len(rows):
        return torch.arange(len(rows))
    if order == "own_length":
        return torch.sort(rows.completion_mask.sum(1), stable=True).indices
    return rows.length_order()


def token_bounds(lengths: list[int], prompt: int, tokens: int) -> list[int]:
    """Bounds cutting rows, in the order given, into micro-batches of at most ``tokens`` tokens each: n
    rows whose longest completion is L make a grid of n x (prompt + L) tokens, L the longest wherever it
    stands among them (a long first row pads the short ones after it); each takes one row at least."""
    bounds, longest = [0], 0
    for i, length in enumerate(lengths):
        longest = max(longest, length)
        if i > bounds[-1] and (i + 1 - bounds[-1]) * (prompt + longest) > tokens:
            bounds.append(i)
            longest = length
    return bounds + [len(lengths)] if lengths else bounds


def at_group_starts(bounds: list[int], group_ids: Tensor) -> list[int]:
    """``bounds`` moved onto group boundaries of rows whose groups are contiguous (``group_ids`` in the
    order cut): each inner bound back to the last group start after the previous bound, or, where a
    group is longer than the cut, on to the next one; so no group is split and each micro-batch takes
    one group at least (a group larger than the budget makes a micro-batch of its own)."""
    n = len(group_ids)
    starts = [0, *(torch.nonzero(group_ids[1:] != group_ids[:-1]).flatten() + 1).tolist()]
    out = [0]
    for b in bounds[1:-1]:
        inside = [s for s in starts if out[-1] < s <= b]
        moved = inside[-1] if inside else next((s for s in starts if s > b), n)
        if out[-1] < moved < n:
            out.append(moved)
    return out + [n] if n else out


class LocalPlan:
    """Every row in this process. ``whole_groups``: a loss reads a group's rows together (DPO and the reward
    model's Bradley-Terry pairs: rows 2i, 2i + 1), so micro-batches keep each group whole, in the
    groups' order, whatever the order asked for and wherever micro_batch_size or micro_batch_tokens
    would have cut."""

    sharded = False
    cast_cache = True  # one bf16 cast of each weight serves every micro-batch of a mini-batch

    def __init__(self, whole_groups: bool = False):
        self.whole_groups = whole_groups

    def prepare(self, model: torch.nn.Module,
                critic: torch.nn.Module | None) -> tuple[Callable, torch.nn.Parameter | None]:
        return partial(policy_forward, model), split_tied_embedding(model)

    def micro_batches(self, rows: Rollouts, micro: int, order: str,
                      tokens: int = 0) -> list[tuple[Rollouts, Tensor | None]]:
        """``micro`` rows a micro-batch, or with ``tokens`` (trainer.micro_batch_tokens) as many as
        fit that many tokens (``token_bounds``). Sums, not means, cross micro-batch boundaries, so the
        order does not change the accumulated gradient."""
        if self.whole_groups and order == "own_length":
            order = "groups"  # rows by their own length would part a pair
        if not tokens:
            idx = ordered(rows, micro, order)
            bounds = [*range(0, len(rows), micro), len(rows)]
        else:
            mask, P = rows.completion_mask, rows.prompt_ids.shape[1]
            # (B,) through each row's last loss token, as Rollouts.trimmed cuts; at least 1, the one column
            # trimmed keeps where no row of a micro-batch has a loss token (a failed episode's empty mask)
            lengths = (mask.shape[1] - (mask.flip(1).cumsum(1) == 0).sum(1)).clamp(min=1)
            one = len(rows) * (P + int(lengths.max())) <= tokens if len(rows) else True
            idx = ordered(rows, len(rows) if one else 0, order)
            bounds = token_bounds(lengths[idx].tolist(), P, tokens)
        if self.whole_groups:
            bounds = at_group_starts(bounds, rows.group_ids[idx])
        return [(rows.select(idx[a:b]), idx[a:b]) for a, b in zip(bounds, bounds[1:])]

    def sync_gradients(self, model: torch.nn.Module, last: bool) -> None:
        pass

    def head_grad(self, model: torch.nn.Module) -> HeadGrad | None:
        # The lm_head's weight gradient, formed once after the last micro-batch (logprobs.HeadGrad).
        return HeadGrad() if model.get_output_embeddings() is not None else None

    def reduce(self, sums: dict[str, float], device: torch.device) -> dict[str, float]:
        return sums

    def all_sum(self, t: Tensor) -> Tensor:
        return t

    all_max = all_sum

    def gather(self, parts: list[Tensor], rows: Rollouts) -> Tensor:
        return torch.cat(parts)

    def weights(self, model: torch.nn.Module) -> dict[str, Tensor]:
        return lora.merged_state(model) if lora.is_lora(model) else model.state_dict()

    def optimizer_state(self, model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
        return opt.state_dict()

    def load_optimizer_state(self, model: torch.nn.Module, opt: torch.optim.Optimizer, state: dict) -> None:
        opt.load_state_dict(state)


class ShardedPlan:
    sharded = True
    # No cast cache: FSDP frees and re-gathers each layer's weights around every forward; with the
    # cache, bf16 casts reused across micro-batches gave the layers' linear weights wrong gradients
    # (measured: 2-rank gradient off by 0.08 at a 0.19 max against 1e-3 of bf16 noise; exact with
    # one micro-batch). Each forward casts afresh.
    cast_cache = False

    def prepare(self, model: torch.nn.Module,
                critic: torch.nn.Module | None) -> tuple[Callable, torch.nn.Parameter | None]:
        """FSDP2 over the policy. The tied embedding is NOT split into its own leaf here: that
        leaf would be a second Parameter over the head's storage, which sharding cannot keep
        shared; the tied Parameter is sharded once in the root unit and gets one dense gradient.
        ``policy_forward`` is registered as a root forward method so the head weight it hands
        to ``ChunkedLogp`` is the gathered full tensor, not this rank's shard."""
        if critic is not None or lora.is_lora(model):
            raise NotImplementedError("data_parallel supports the policy alone: no critic, no LoRA")
        if any(p.dtype != torch.float32 for p in model.parameters()):
            raise NotImplementedError("trainer.param_dtype=bfloat16 with data_parallel: FSDP2 shards float32 weights")
        self.model = model
        fsdp.shard_causal_lm(model)
        fsdp.add_forward_method(model, "policy_forward", policy_forward)
        return model.policy_forward, None

    def micro_batches(self, rows: Rollouts, micro: int, order: str) -> list[tuple[Rollouts, Tensor | None]]:
        """This rank's contiguous share of ``rows`` cut into micro-batches. Every rank gets the same
        number of them: each FSDP forward and backward is a collective all ranks must join. A rank
        with too few rows for that count runs a one-row stand-in (indices None) whose completion
        mask is empty, so it adds nothing to any loss, gradient or metric."""
        rank, world = fsdp.rank_world()
        bounds = fsdp.row_bounds(len(rows), world)
        mine = rows.select(slice(bounds[rank], bounds[rank + 1]))
        n_micro = fsdp.micro_count(len(rows), world, micro)
        idx = mine.length_order() if order != "rows" and len(mine) > 1 else torch.arange(len(mine))
        cuts = fsdp.row_bounds(len(mine), n_micro)
        out = []
        for i in range(n_micro):
            part = idx[cuts[i] : cuts[i + 1]]
            out.append((mine.select(part), bounds[rank] + part) if len(part) else (blank_row(rows), None))
        return out

    def sync_gradients(self, model: torch.nn.Module, last: bool) -> None:
        model.set_requires_gradient_sync(last)  # local accumulation until the last micro-batch

    def head_grad(self, model: torch.nn.Module) -> HeadGrad | None:
        return None  # the head's gradient is FSDP's to reduce-scatter with the rest

    def reduce(self, sums: dict[str, float], device: torch.device) -> dict[str, float]:
        return fsdp.all_reduce_sums(sums, device)

    def all_sum(self, t: Tensor) -> Tensor:
        return fsdp.all_reduce(t)

    def all_max(self, t: Tensor) -> Tensor:
        return fsdp.all_reduce(t, op=torch.distributed.ReduceOp.MAX)

    def gather(self, parts: list[Tensor], rows: Rollouts) -> Tensor:
        """Each rank's recomputed rows, all-gathered: every rank returns the full (B, T) at 1/world
        of the compute. No backward follows: the root's gathered weights are freed now (FSDP keeps
        the root unit unsharded after forward, expecting a backward to reshard it)."""
        self.model.reshard()
        return fsdp.all_gather_rows(torch.cat(parts) if parts else rows.sampler_logp[:0], len(rows))

    def weights(self, model: torch.nn.Module) -> dict[str, Tensor]:
        return fsdp.full_state_dict(model)  # a collective: every rank gathers

    def optimizer_state(self, model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
        # The full, unsharded state keyed by parameter name, the same on every rank (a collective),
        # so rank 0 alone can write it and every rank can load it.
        return fsdp.optimizer_state(model, opt)

    def load_optimizer_state(self, model: torch.nn.Module, opt: torch.optim.Optimizer, state: dict) -> None:
        fsdp.load_optimizer_state(model, opt, state)


def sampler_diff_metrics(diff: Tensor, plan: LocalPlan | ShardedPlan) -> dict:
    """The trainer's sampler-mismatch metrics, over every rank's tokens of the plan. How far the sampler's recorded
    log-probs are from the trainer's, from the per-token differences log pi_trainer - log pi_sampler (n_tokens,); under
    data parallelism, over all ranks' tokens (sums and maxima reduced before the mean is taken)."""
    # The histogram's bin edges live on the host (algorithms/core.py), so its input goes there; the
    # sums go on diff's device (the trainer's): NCCL reduces CUDA tensors only.
    hist = ratio_histogram(diff.exp().to(device.CPU))
    sums = torch.tensor([diff.abs().sum().item(), diff.numel(), *hist], dtype=torch.float64, device=diff.device)
    top = torch.tensor([diff.abs().max().item() if diff.numel() else 0.0], dtype=torch.float64, device=diff.device)
    plan.all_sum(sums)
    plan.all_max(top)
    n = sums[1].item()
    return {"actor/logp_diff_sampler_mean": sums[0].item() / n if n else 0.0,
            "actor/logp_diff_sampler_max": top.item(), "hist/sampler_ratio": [int(c) for c in sums[2:].tolist()]}


def blank_row(batch: Rollouts) -> Rollouts:
    """Row 0 of ``batch`` with an empty completion mask and zero advantages: a forward/backward
    on it contributes nothing to a loss aggregated over the mask (data-parallel padding)."""
    row = batch.select(slice(0, 1))
    row.completion_mask = torch.zeros_like(row.completion_mask)
    if row.advantages is not None:
        row.advantages = torch.zeros_like(row.advantages)
    return row
