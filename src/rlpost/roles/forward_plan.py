"""The trainer's forward plan: how its forward runs, chosen once (``build.forward_plan``) beside the
row plan (roles/row_plan.py), and the levers it hands the trainer's update.

The route to the hidden states: rlpost's packed trunk (``packed``, model/packed.py) or transformers'
forward, and on it, per batch (model/routes.py), the prompts given for the whole mini-batch (the
prompts-once lever), each distinct prompt once per micro-batch (``scoring.share_prefix``), or the
full forward (no prompt repeats, or activation checkpointing, which turns the KV cache off). The
log-prob body: ``ChunkedLogp`` where the head is plain, else the full logits (``scoring.chunked``).

The levers, each a small object with the one thing it changes; none changes the maths, only where
and when it is done (each has a test that the gradient or the metrics are the same without it):

  PromptsOnce    a mini-batch's prompts run once ahead of its micro-batches (trainer.prompts_once)
  DeferredHead   the lm_head's weight gradient formed once per mini-batch (model/chunked.py: HeadGrad)
  SamplerDiffs   trainer vs sampler log-probs on the loss tokens, picked once per mini-batch
  DeviceSums     a mini-batch's metrics summed on the device, read back once at its end
  the row plan's ``sync_gradients``: under FSDP, only the last micro-batch's backward reduces
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.model import budgets, device
from rlpost.model.logprobs import HeadGrad, Prefix, Scoring, prompt_prefix
from rlpost.types.batch import Rollouts


@dataclass(frozen=True)
class Sizes:
    """How the trainer cuts a rollout batch: rows per optimizer step (mini-batch) and per forward and
    backward (micro-batch), and how many optimizer steps the run takes (the lr schedule's length)."""
    mini_batch_size: int
    micro_batch_size: int
    optimizer_steps: int


@dataclass(frozen=True)
class ForwardPlan:
    scoring: Scoring  # temperature, the shared prompt prefix, the body, a value head on the policy's trunk
    packed: bool = False  # route: rlpost's packed trunk (trainer.forward, model/packed.py)
    prompts_once: bool = False  # lever: each mini-batch's prompts run once (PromptsOnce)
    loss_entropy: bool = False  # the loss reads the entropy, with grad (entropy bonus, entropy-shaped advantage)
    checkpointing: bool = False  # activation checkpointing on the policy (and a separate critic's trunk)

    def entropy(self, first_epoch: bool) -> str:
        """What the forward computes of the entropy: with grad for the loss, else as a diagnostic on the
        first pass over a batch, else nothing (model/logprobs.py: ENTROPY_MODES)."""
        return "grad" if self.loss_entropy else "detached" if first_epoch else "none"


class PromptsOnce:
    """Lever: the mini-batch's prompts run once ahead of its micro-batches (model/routes.py: Prefix),
    which then take rows of similar length from any group. ``run`` gives None, to run them per
    micro-batch as before, where the plan has it off, where there is one micro-batch (nothing to share
    across), or where the prompts' activations, held until the last micro-batch, would outgrow one
    micro-batch's (P + T) tokens, which is what micro_batch_size (or micro_batch_tokens) bounds."""

    def __init__(self, on: bool, micro_tokens: int):
        self.on, self.micro_tokens = on, micro_tokens

    def run(self, model: torch.nn.Module, mini: Rollouts, scoring: Scoring, micro_rows: int) -> Prefix | None:
        """Called inside the mini-batch's autocast; micro_rows: the trainer's micro-batch size."""
        P, T = mini.prompt_ids.shape[1], mini.completion_ids.shape[1]
        budget = self.micro_tokens or micro_rows * (P + T)  # one micro-batch's tokens, at most
        if not self.on or len(mini) * (P + T) <= budget:
            return None
        if len(torch.unique_consecutive(mini.group_ids)) * P > budget:
            return None
        return prompt_prefix(model, mini, value_head=scoring.value_head)


class DeferredHead:
    """Lever: the lm_head weight's gradient over the mini-batch's micro-batches, formed once at its end
    (``HeadGrad``), flushed early past ``budgets.head_grad_bytes``. ``grad`` is what the forward is
    handed (None where the row plan gives none: FSDP reduces the head's gradient with the rest)."""

    def __init__(self, grad: HeadGrad | None, model: torch.nn.Module):
        self.grad, self.model = grad, model
        self.budget = budgets.head_grad_bytes(device.is_cuda(device.of(model)))

    def flush(self, only_past_budget: bool = False) -> None:
        if self.grad is not None and (not only_past_budget or self.grad.held() > self.budget):  # (budgets.py says why)
            self.grad.flush(self.model.get_output_embeddings().weight)


class SamplerDiffs:
    """Lever: log pi_trainer - log pi_sampler on the loss tokens of the first pass over a batch. Each
    micro-batch leaves its differences and mask (``add``, nothing read back); ``pick`` indexes them
    once per mini-batch (a boolean index reads back a count, which would wait for the backward)."""

    def __init__(self):
        self.pending: list[tuple[Tensor, Tensor]] = []
        self.picked: list[Tensor] = []  # (n_tokens,) each

    def add(self, mb: Rollouts) -> None:
        self.pending.append((mb.old_logp - mb.sampler_logp, mb.completion_mask))

    def pick(self) -> None:
        self.picked.extend(d[m] for d, m in self.pending)
        self.pending = []


class DeviceSums:
    """Lever: a mini-batch's metrics summed on the device in float64, read back once at its end (by
    ``trainer.on_host``). Reading a value back after a micro-batch would wait for its backward to
    finish before the next forward is queued; on a GPU the launch-bound forward could run beside it.
    The loss adds up over micro-batches; the algorithm's metrics are per-token means, so each is
    weighted by its micro-batch's share of the mini-batch's tokens."""

    def __init__(self, mini: Rollouts):
        self.norm_tokens = mini.norm_tokens
        self.sums: dict[str, float | Tensor] = {}

    def add(self, loss: Tensor, metrics: dict, mb: Rollouts) -> None:
        self.sums["actor/loss"] = self.sums.get("actor/loss", 0.0) + loss.detach().double()
        share = mb.completion_mask.sum().double() / max(self.norm_tokens, 1.0)
        for k, v in metrics.items():
            self.sums[k] = self.sums.get(k, 0.0) + share * v
