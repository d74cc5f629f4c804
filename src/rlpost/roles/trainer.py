"""Trainer role: forward, backward, optimizer step. It knows nothing about which algorithm runs:
``update(batch, loss_fn)`` takes the loss as a function of (logp, micro-batch).

One rollout batch is consumed as  epochs x mini-batches (one optimizer step each) x micro-batches
(one forward/backward each, gradients accumulated). The loss aggregators divide by mini-batch
totals, which the trainer writes on each micro-batch (``norm_tokens``, ``norm_seqs``), so the
accumulated gradient equals the gradient of the whole mini-batch at once.

``old_logp`` (the ratio's denominator) is the trainer's own log-prob under the weights that
sampled the batch, not the sampler's: a bf16 sampler and a float32 trainer disagree by a few
hundredths of a nat per token, and using the sampler's numbers would make the first ratio != 1
and clip tokens for no reason. When the batch is used in exactly one optimizer step, the first
forward already runs under those weights, so old_logp = logp.detach() costs nothing; otherwise
it is recomputed once, without grad, before the first step.

Which rows this process trains is its row plan (roles/row_plan.py, chosen by build.py): every row
(``LocalPlan``), or this rank's share under FSDP2 data parallelism (``ShardedPlan``).
"""

from __future__ import annotations

import functools
import math
from contextlib import nullcontext
from dataclasses import replace

import torch
from torch import Tensor

from rlpost.algorithms.core import masked_mean
from rlpost.model import device, fsdp, heap, lora, optim, packed, precision
from rlpost.model.load import enable_checkpointing
from rlpost.model.logprobs import HeadGrad, PolicyForward, Prefix, clear_cast_cache
from rlpost.roles.critic import Critic
from rlpost.roles.forward_plan import DeferredHead, DeviceSums, ForwardPlan, PromptsOnce, SamplerDiffs, Sizes
from rlpost.roles.row_plan import LocalPlan, ShardedPlan, sampler_diff_metrics
from rlpost.types.batch import Rollouts
from rlpost.types.roles import LossFn


def on_critic_home(verb):
    """The verb with the critic on the trainer's device (offload.critic: on the host between verbs)."""

    @functools.wraps(verb)
    def wrapped(self, *args, **kwargs):
        with self.critic_home:  # nested uses move once (device.Offloaded)
            return verb(self, *args, **kwargs)

    return wrapped


def on_host(sums: dict) -> dict:
    """``sums`` with every tensor read back as a float, all in one transfer (the first waits for the
    device to finish; per value, each would)."""
    keys = [k for k, v in sums.items() if isinstance(v, Tensor)]
    if not keys:
        return sums
    dev = sums[keys[0]].device  # the trainer's; a value elsewhere (a critic's device) is moved to it
    values = torch.stack([sums[k].detach().reshape(()).double().to(dev) for k in keys]).tolist()
    return {**sums, **dict(zip(keys, values))}


class Trainer:
    def __init__(self, model: torch.nn.Module, tcfg, sizes: Sizes, forward: ForwardPlan,
                 rows: LocalPlan | ShardedPlan | None = None, critic: Critic | None = None):
        """sizes: mini-batch, micro-batch and optimizer steps; forward: the forward plan (its route,
        body and levers, build.forward_plan); rows: which rows this process trains (roles/row_plan.py;
        every row by default). A ShardedPlan shards the model over the ranks of the already
        initialised process group; every rank must construct it with the same model and arguments.
        critic: PPO's (its own lr and offload.critic: roles/critic.py)."""
        self.model = model.float().train()  # on its device already (build.py); batches follow it
        self.device = device.of(self.model)
        self.critic = critic.float().train() if critic is not None else None
        self.cfg, self.forward_plan, self.sizes = tcfg, forward, sizes
        self.bf16 = precision.trainer_bf16(tcfg.precision)  # build.py resolved 'auto'; direct callers probe here
        self.mini, self.micro = sizes.mini_batch_size, sizes.micro_batch_size
        self.plan = rows or LocalPlan()
        if forward.checkpointing:
            enable_checkpointing([self.model,
                                  *([critic.trunk] if critic is not None and critic.trunk is not None else [])])
        self.prompts = PromptsOnce(forward.prompts_once, tcfg.micro_batch_tokens)
        self.updates = 0  # update() calls in this process, for the heap trims
        if not device.is_cuda(self.device):  # CPU-only lever: an update's memory comes back without page faults
            heap.keep_freed()
        # trainer.param_dtype=bfloat16: the masters' float32 starting points, before the tied lookup is split off
        modules = [self.model, *([self.critic] if self.critic is not None else [])]
        keep = precision.cast_keeping_float32(modules) if tcfg.param_dtype == "bfloat16" else None
        self._policy_forward, self.lookup = self.plan.prepare(self.model, self.critic)
        (packed.enable if forward.packed else packed.disable)(self.model)  # the route the plan chose
        self.step = forward.scoring.step  # trainer.compile (model/compiled.py): the head's passes, and the trunk's
        if self.step is not None and forward.packed:
            packed.trunk_of(self.model).compile(self.step)
        self.params = [p for p in self.model.parameters() if p.requires_grad and p is not self.lookup]
        self.critic_params = [p for p in self.critic.parameters() if p.requires_grad] if critic is not None else []
        self.critic_lr = critic.lr if critic is not None else 0.0
        # trainer.param_dtype=bfloat16: AdamW steps float32 masters of the bf16 parameters (model/precision.py)
        self.master = precision.MasterWeights(self.params + self.critic_params, keep) if keep is not None else None
        stepped = (lambda ps: [self.master.of(p) for p in ps]) if self.master is not None else list
        groups = [{"params": stepped(self.params), "lr": tcfg.lr}]
        if self.critic_params:  # its own learning rate and its own gradient clipping
            groups.append({"params": stepped(self.critic_params), "lr": self.critic_lr})
        self.opt, self.sched = optim.adamw(groups, tcfg, sizes.optimizer_steps)
        # offload.critic: the critic and its optimizer's tensors wait on the host while the rollout
        # samples, and come onto the device for each verb that uses them (model/device.py)
        self.critic_home = (device.Offloaded(self.critic, self.device, critic.offload, self.opt, groups[1]["params"])
                            if self.critic_params else nullcontext())

    def _autocast(self):
        return precision.autocast(self.bf16, self.device, cache=self.plan.cast_cache)

    def _forward(self, batch: Rollouts, entropy: str = "none", prefix: Prefix | None = None,
                 head_grad: HeadGrad | None = None) -> PolicyForward:
        """Policy log-probs (and the critic's values when there is one) for a micro-batch; prefix:
        its rows' prompts, already run (``PromptsOnce``); head_grad: the mini-batch's lm_head gradient."""
        with self._autocast():
            out = self._policy_forward(batch, self.forward_plan.scoring, entropy, prefix, head_grad)
            if self.critic is not None and not self.critic.shared:
                out.values = self.critic.values(batch, self.forward_plan.scoring.share_prefix)
        return out

    def _planned(self, rows: Rollouts, order: str) -> list[tuple[Rollouts, Tensor | None]]:
        """``rows`` cut into micro-batches (``plan.micro_batches``; by tokens with trainer.micro_batch_tokens),
        each trimmed to its own columns, with the packed trunk's layout of its fed tokens read now
        (``packed.plan_fed``): everything that reads the masks back to the host, before the first
        forward is queued (``DeviceSums`` says why)."""
        tokens = (self.cfg.micro_batch_tokens,) if self.cfg.micro_batch_tokens else ()
        parts = [(mb.trimmed(), idx) for mb, idx in self.plan.micro_batches(rows, self.micro, order, *tokens)]
        if packed.trunk_of(self.model) is not None:
            for mb, _ in parts:
                packed.plan_fed(mb.completion_mask)
        return parts

    @torch.no_grad()
    @on_critic_home
    def recompute(self, batch: Rollouts) -> tuple[Tensor, Tensor | None]:
        """(old_logp (B, T), old_values (B, T) or None) under the current weights, before any step."""
        home, batch = batch.device, batch.to(self.device)  # results go back where the batch came from
        T = batch.completion_ids.shape[1]

        def pad(x: Tensor) -> Tensor:  # trimmed columns back, as zeros
            return torch.nn.functional.pad(x, (0, T - x.shape[1]))

        with self._autocast():  # one bf16 cast of the weights for all micro-batches
            parts = self._planned(batch, "rows")
            outs = [(self._forward(mb), idx) for mb, idx in parts]
        logp = self.plan.gather([pad(o.logp) for o, idx in outs if idx is not None], batch)  # (B, T)
        values = (torch.cat([pad(o.values) for o, _ in outs]) * batch.completion_mask if self.critic is not None
                  else None)
        return logp.to(home), values.to(home) if values is not None else None

    @on_critic_home
    def update(self, batch: Rollouts, loss_fn: LossFn) -> dict:
        """Consume one rollout batch: epochs x mini-batches (an optimizer step each) x micro-batches
        (a forward/backward each, gradients accumulated); return metrics."""
        batch = batch.to(self.device)  # the trainer's own copy on its device (a no-op on the host)
        # A filtered batch (DAPO) may be short of the configured size: split it into as many
        # near-equal mini-batches as fit, at least one.
        n_mini = max(1, len(batch) // self.mini)
        bounds = torch.linspace(0, len(batch), n_mini + 1).round().long().tolist()
        lr = self.opt.param_groups[0]["lr"]  # the lr these steps use (the scheduler moves it after)
        if batch.old_logp is None and not (self.cfg.epochs == 1 and n_mini == 1):  # the ratio's denominator
            batch = replace(batch, old_logp=self.recompute(batch)[0])
        sums: dict[str, float] = {}
        steps, diffs = [], SamplerDiffs()
        for epoch in range(self.cfg.epochs):
            for m in range(n_mini):
                mini = batch.select(slice(bounds[m], bounds[m + 1]))
                metrics = self._mini_batch(mini, loss_fn, first_epoch=epoch == 0, diffs=diffs)
                for k, v in metrics.items():  # average over the epochs x mini-batches
                    runs = 1 if k == "actor/entropy" else self.cfg.epochs
                    sums[k] = sums.get(k, 0.0) + v / (n_mini * runs)
                steps.append(self._step())
        if self.step is not None:
            self.step.report()  # the compile's cost, said once, after the update that paid it
        return self._update_metrics(sums, steps, diffs, lr)

    def _mini_batch(self, mini: Rollouts, loss_fn: LossFn, first_epoch: bool = True,
                    diffs: SamplerDiffs | None = None) -> dict:
        """The algorithm's pass over one mini-batch: per micro-batch, forward, loss, backward; the
        gradients add up in .grad for the optimizer step after it.

        The mini-batch totals go on each micro-batch (a copy: the caller's batch is not touched), so the
        loss aggregators normalise by them and the accumulated gradient is the whole mini-batch's; under
        a sharded plan they are the whole mini-batch's over every rank, so each rank's metrics are
        shares whose sum over the ranks is the 1-rank value. One autocast context stays open across the
        micro-batches: autocast keeps its bf16 copy of each weight until the outermost context exits, so
        one cast serves them all (the weights do not change before the step); loss and backward run
        with it off. Micro-batches are of similar length, each cut to its own longest completion: rows by
        their own length when the prompts ran once ahead, else whole groups (each runs its groups'
        prompts) by their longest row."""
        mini = replace(mini, norm_tokens=float(mini.completion_mask.sum()), norm_seqs=len(mini))
        head, sums = DeferredHead(self.plan.head_grad(self.model), self.model), DeviceSums(mini)
        entropy = self.forward_plan.entropy(first_epoch)
        with self._autocast():
            prompts = self.prompts.run(self.model, mini, self.forward_plan.scoring, self.micro)  # lever: prompts once
            parts = self._planned(mini, "own_length" if prompts is not None else "groups")
            for i, (mb, idx) in enumerate(parts):
                self.plan.sync_gradients(self.model, last=i == len(parts) - 1)  # FSDP: the last one reduces
                given = prompts.take(idx, mb.prompt_ids.shape[1]) if prompts is not None else None
                out = self._forward(mb, entropy, given, head.grad)
                with torch.autocast(out.logp.device.type, enabled=False):  # the forward's device, not a fixed one
                    if mb.old_logp is None:  # single optimizer step: this forward runs under the sampling weights
                        mb = replace(mb, old_logp=out.logp.detach())
                    loss, metrics = loss_fn(out.logp, mb, values=out.values,
                                            entropy=out.entropy if self.forward_plan.loss_entropy else None)
                    loss.backward()
                if first_epoch:
                    metrics["actor/entropy"] = masked_mean(out.entropy.detach(), mb.completion_mask).double()
                    if diffs is not None:
                        diffs.add(mb)
                sums.add(loss, metrics, mb)
                head.flush(only_past_budget=True)
            if prompts is not None:
                prompts.backward()  # the prompts' share of the gradient, summed over the micro-batches
        head.flush()
        if diffs is not None:
            diffs.pick()
        return self.plan.reduce(on_host(sums.sums), self.device)

    def _update_metrics(self, sums: dict, steps: list[tuple[list[float], bool]], diffs: SamplerDiffs,
                        lr: float) -> dict:
        """``update``'s metrics: the mini-batches' means, the gradient norms and steps taken, and how far
        the sampler's recorded log-probs are from the trainer's under the same weights (bf16 sampler vs
        float32 trainer: the silent mismatch the importance ratio would absorb)."""
        sums.update(sampler_diff_metrics(torch.cat(diffs.picked), self.plan))
        grad_norms = [norms[0] for norms, _ in steps]
        critic_norms = [norms[1] for norms, _ in steps if len(norms) > 1]
        skipped = sum(not stepped for _, stepped in steps)
        sums["actor/grad_norm"] = sum(grad_norms) / len(grad_norms)
        sums["actor/lr"] = lr
        sums["actor/nonfinite_steps"] = skipped  # optimizer steps skipped: a NaN/inf loss or gradient
        sums["actor/optimizer_steps"] = len(steps) - skipped  # taken (0: the update changed nothing)
        if critic_norms:
            sums["critic/grad_norm"] = sum(critic_norms) / len(critic_norms)
        self.updates += 1
        # CPU-only lever: glibc's heap (heap.py); CUDA memory is the caching allocator's to manage.
        if self.updates % heap.TRIM_EVERY == 0 and not device.is_cuda(self.device):
            heap.trim()
        return sums

    def _step(self) -> tuple[list[float], bool]:
        """Clip, step, zero; return the pre-clip grad norms (the policy's, then the critic's own) and
        whether the step was taken. A NaN or infinite norm (a non-finite loss or gradient anywhere)
        skips the step: the weights and the optimizer's moments stay as they were, and the lr
        schedule does not advance. The loop counts these and stops a run that keeps making them."""
        if self.lookup is not None and self.lookup.grad is not None:  # fold the lookup's rows into the head's gradient
            head = self.model.get_output_embeddings().weight
            head = self.master.of(head) if self.master is not None else head  # the gradient the optimizer reads
            rows = self.lookup.grad.to(head.dtype)
            head.grad = rows.to_dense() if head.grad is None else head.grad.add_(rows)
            self.lookup.grad = None
        # Under FSDP the norm is a DTensor over the sharded gradients: full_tensor() is the global norm.
        norms = [float(fsdp.full_tensor(torch.nn.utils.clip_grad_norm_(g["params"], self.cfg.max_grad_norm)))
                 for g in self.opt.param_groups]
        if not all(math.isfinite(n) for n in norms):  # the global norm: every rank takes the same branch
            self.opt.zero_grad(set_to_none=True)
            return norms, False
        self.opt.step()
        if self.master is not None:
            self.master.weights_out()  # the stepped float32 masters, rounded into the bf16 weights
        clear_cast_cache()  # the weights changed in place (fused AdamW leaves _version alone)
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        return norms, True

    @on_critic_home
    def train_step(self, batch: Rollouts, loss_fn: LossFn) -> dict:
        """One optimizer step on ``batch`` (one mini-batch, cut into micro-batches), without the
        rollout diagnostics of ``update``: the offline recipes' verb (SFT, reward models, DPO, PRM)."""
        lr = self.opt.param_groups[0]["lr"]  # the lr this step uses (the scheduler moves it after)
        metrics = self._mini_batch(batch.to(self.device), loss_fn, first_epoch=False)
        norms, stepped = self._step()
        if self.step is not None:
            self.step.report()
        metrics.update({"actor/grad_norm": norms[0], "actor/lr": lr, "actor/nonfinite_steps": int(not stepped)})
        if len(norms) > 1:
            metrics["critic/grad_norm"] = norms[1]
        return metrics

    @torch.no_grad()
    @on_critic_home
    def evaluate(self, batch: Rollouts, loss_fn: LossFn) -> dict:
        """The loss (``loss``) and the loss's metrics over ``batch``, micro-batch by micro-batch,
        without gradients: a held-out evaluation (the offline recipes)."""
        sums: dict[str, float] = {}
        n = len(batch)
        batch = replace(batch.to(self.device), norm_tokens=float(batch.completion_mask.sum()), norm_seqs=n)
        for i in range(0, n, self.micro):
            mb = batch.select(slice(i, i + self.micro))
            out = self._forward(mb)
            loss, m = loss_fn(out.logp, mb, values=out.values, entropy=None)
            sums["loss"] = sums.get("loss", 0.0) + loss.item()
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v * len(mb) / n
        return sums

    def weights(self) -> dict[str, Tensor]:
        """What the rollout needs for weight sync (shared tensors; the receiver copies); with
        LoRA, the base with the adapters folded in, under the plain model's key names. Under data
        parallelism, the gathered full tensors on every rank (a collective: call it on all)."""
        return self.plan.weights(self.model)

    def checkpoint_weights(self) -> dict[str, Tensor]:
        """What a checkpoint stores: the float32 master weights, as ``weights()`` gives them here
        (a remote trainer's ``weights()`` is the sampler's copy; distributed/actors.py). With
        trainer.param_dtype=bfloat16, each trained weight's float32 master in place of its bf16
        rounding (found by storage: the tied lookup shares the head's); with LoRA, the merged bf16
        weights, the adapters' masters being in ``state_dict``."""
        weights = self.weights()
        if self.master is None or lora.is_lora(self.model):
            return weights
        masters = {p.data_ptr(): m.detach() for p, m in self.master.pairs}
        return {k: masters.get(v.data_ptr(), v) for k, v in weights.items()}

    def state_dict(self) -> dict:
        state = {"optimizer": self.plan.optimizer_state(self.model, self.opt), "scheduler": self.sched.state_dict()}
        if lora.is_lora(self.model):
            state["lora"] = lora.adapter_state(self.model)
        if self.critic is not None:  # the head, and the trunk when separate (a shared trunk is the policy)
            state["critic"] = self.critic.state_dict()
        if self.master is not None:  # the float32 masters of every trained weight, adapters and critic included
            state["master"] = self.master.state()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.plan.load_optimizer_state(self.model, self.opt, state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        # The config gives the hyperparameters, the checkpoint the state: a resume that changes the lr
        # (config.RESUMABLE) gets it from here on, at the schedule's current point.
        self.sched.base_lrs = [self.cfg.lr, self.critic_lr][: len(self.opt.param_groups)]
        for g, base, factor in zip(self.opt.param_groups, self.sched.base_lrs, self.sched.lr_lambdas):
            g["initial_lr"], g["lr"] = base, base * factor(self.sched.last_epoch)
        if "lora" in state:
            missing = self.model.load_state_dict(state["lora"], strict=False)
            assert not missing.unexpected_keys, missing.unexpected_keys
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
        if self.master is not None and "master" in state:  # last: the masters, and the bf16 weights rounded from them
            self.master.load(state["master"])

    def close(self) -> None:
        """Nothing to release in-process (a remote trainer's actors end here: distributed/actors.py)."""
