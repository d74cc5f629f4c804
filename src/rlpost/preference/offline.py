"""`rlpost sft` and `rlpost dpo`: training on fixed data with the RL trainer's machinery.

Both reuse ``Trainer.accumulate`` / ``Trainer.step`` (micro-batches with exact accumulation, bf16
autocast over float32 master weights, fused AdamW, the lr schedule) with their own loss function
over the same ``Rollouts`` batch. The only differences from RL are where the rows come from and
which loss is minimised:

  SFT  completion-only negative log-likelihood: prompt tokens carry no loss (they are not in the
       completion mask), every completion token of the batch weighs the same (token mean).
  DPO  one loss from preference/losses.py (dpo, ipo, kto, orpo, simpo) over pairs; a pair is a
       group of two rows (chosen, rejected) sharing a prompt. The reference's log-probs are
       computed once for the whole dataset before training (the reference is frozen), not per step.

The result is a transformers folder (``RUN_DIR/model``) that ``model.name=RUN_DIR/model`` loads
for the next stage.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from rlpost import config
from rlpost.algorithms import core
from rlpost.batch import Rollouts
from rlpost.checkpoint import write_atomic
from rlpost.models import load_policy
from rlpost.preference import data, losses
from rlpost.roles.critic import Critic
from rlpost.roles.reference import Reference
from rlpost.roles.trainer import Trainer


def task_rows(cfg: config.Config, kind: str) -> tuple[list[dict], list[dict]]:
    """Rows built from the RL task when pref.data is empty: the correct answer is the completion
    (SFT) or the chosen one, an answer off by 1..5 the rejected one (preference)."""
    from rlpost.envs import build_task

    task = build_task(cfg)
    rng = random.Random(cfg.run.seed)

    def convert(row: dict) -> dict:
        ans = int(row["answer"])
        out = {"prompt": row["messages"], "answer": row["answer"]}
        if kind == "sft":
            return {**out, "completion": str(ans)}
        return {**out, "chosen": str(ans), "rejected": str(ans + rng.choice([-1, 1]) * rng.randint(1, 5))}

    return [convert(r) for r in task.train], [convert(r) for r in task.heldout]


def load_rows(cfg: config.Config, kind: str) -> tuple[list[dict], list[dict], int]:
    """(train rows, held-out rows, rows skipped as malformed)."""
    p = cfg.pref
    if not p.data:
        return (*task_rows(cfg, kind), 0)
    rows = data.read_rows(p.data)
    if p.eval_data:
        heldout = data.read_rows(p.eval_data)
    else:
        cut = max(1, int(len(rows) * (1 - p.heldout_frac)))
        rows, heldout = rows[:cut], rows[cut:]
    parse = data.sft_pair if kind == "sft" else data.preference_triple
    rows, bad_train = data.check_rows(rows, parse, p.data, p.on_bad_row)
    heldout, bad_heldout = data.check_rows(heldout, parse, p.eval_data or p.data, p.on_bad_row)
    return rows, heldout, bad_train + bad_heldout


# --- losses over a micro-batch ---------------------------------------------------------------


def sft_loss(logp: torch.Tensor, batch: Rollouts) -> tuple[torch.Tensor, dict]:
    nll = core.token_mean(-logp, batch.completion_mask, batch.loss_tokens, batch.loss_seqs)  # ()
    return nll, {"sft/nll": core.masked_mean(-logp.detach(), batch.completion_mask).item()}


def rm_scores(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) the value head's output at each row's last completion token (its EOS)."""
    return (values * core.last_token(mask)).sum(1)


def make_rm_loss(p: config.PrefConfig):
    def loss_fn(logp: torch.Tensor, batch: Rollouts, values: torch.Tensor) -> tuple[torch.Tensor, dict]:
        s = rm_scores(values, batch.completion_mask).view(-1, 2)  # (pairs, 2)
        margin = torch.full((len(s),), p.rm_margin) if p.rm_margin > 0 else None
        loss, m = losses.bradley_terry_loss(s[:, 0], s[:, 1], margin=margin)
        return loss * len(s) / (batch.loss_seqs / 2), m

    return loss_fn


def pair_sums(token_logp: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) per-row sums -> (pairs, 2) sums and (pairs, 2) lengths; rows 2i, 2i+1 are a pair."""
    total, count, _ = losses.sequence_logps(token_logp, mask)  # (B,) each
    return total.view(-1, 2), count.view(-1, 2)  # (pairs, 2) each


def make_dpo_loss(p: config.PrefConfig):
    """The micro-batch loss for pref.loss; scaled by this micro-batch's share of the mini-batch's pairs."""

    def loss_fn(logp: torch.Tensor, batch: Rollouts) -> tuple[torch.Tensor, dict]:
        mask = batch.completion_mask
        s, n = pair_sums(logp, mask)  # (pairs, 2) each
        r, _ = pair_sums(batch.ref_logp, mask) if batch.ref_logp is not None else (None, None)
        if p.loss == "dpo":
            loss, m = losses.dpo_loss(s[:, 0], s[:, 1], r[:, 0], r[:, 1], beta=p.beta, label_smoothing=p.label_smoothing)
        elif p.loss == "ipo":
            loss, m = losses.ipo_loss(s[:, 0], s[:, 1], r[:, 0], r[:, 1], beta=p.beta, chosen_len=n[:, 0], rejected_len=n[:, 1])
        elif p.loss == "simpo":
            loss, m = losses.simpo_loss(s[:, 0], s[:, 1], n[:, 0], n[:, 1], beta=p.beta, gamma=p.simpo_gamma)
        elif p.loss == "orpo":
            mean = s / n.clamp(min=1)  # (pairs, 2) per-token mean log-probs
            loss, m = losses.orpo_loss(mean[:, 0], mean[:, 1], -mean[:, 0], lam=p.orpo_lambda)
        else:  # kto: the pairs give one desirable and one undesirable example each
            pol, ref = s.reshape(-1), r.reshape(-1)  # (B,)
            desirable = torch.tensor([True, False]).repeat(len(s))
            z0 = losses.kto_kl_ref_point(pol.detach(), ref)
            loss, m = losses.kto_loss(pol, ref, desirable, z0, beta=p.beta)
        share = len(s) / (batch.loss_seqs / 2)  # pairs here / pairs in the mini-batch
        return loss * share, m

    return loss_fn


def batch_order(lengths: list[int], batch_size: int, by_length: bool, rng: random.Random) -> list[int]:
    """A shuffled row order. With by_length, rows are sorted by length inside windows of 50
    batches and the batches are shuffled: rows of similar length share a batch, so less padding
    is computed, while batch order stays random (length-grouped sampling, as TRL/HF Trainer do)."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    if not by_length:
        return order
    window = 50 * batch_size
    order = [i for w in range(0, len(order), window) for i in sorted(order[w:w + window], key=lengths.__getitem__)]
    batches = [order[b:b + batch_size] for b in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return [i for b in batches for i in b]


# --- the loop --------------------------------------------------------------------------------


def train_offline(cfg: config.Config, run_dir: Path, kind: str) -> dict:
    """SFT (kind='sft'), a DPO-family loss (kind='dpo') or a Bradley-Terry reward model (kind='rm')
    on fixed rows; returns the summary (also RUN_DIR/summary.json)."""
    torch.set_num_threads(cfg.run.threads or os.cpu_count())
    torch.manual_seed(cfg.run.seed)
    p, t0 = cfg.pref, time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    config.save(cfg, run_dir / "config.yaml")
    rows, heldout, skipped = load_rows(cfg, kind)
    if skipped:
        say(f"skipped {skipped} malformed rows (pref.on_bad_row=skip)")
    loaded = load_policy(cfg.model.name, dtype=torch.float32, seed=cfg.run.seed)
    tok = loaded.tokenizer
    enc = (lambda rs: data.encode_sft(tok, rs, p.max_len)) if kind == "sft" else (lambda rs: data.encode_pairs(tok, rs, p.max_len))
    rows_per_seq = 1 if kind == "sft" else 2  # sequences per row: a pair is two
    train_b, held_b = enc(rows), enc(heldout)
    reference = None
    if kind == "dpo" and p.loss not in ("orpo", "simpo"):  # reference-free losses need none
        reference = Reference(loaded.model, 1.0, 32, cfg.trainer.autocast_bf16, cfg.trainer.share_prompt_prefix)
        train_b.ref_logp, held_b.ref_logp = reference.logprobs(train_b), reference.logprobs(held_b)  # once, cached
        reference.model = None  # frozen numbers are all it was for
    mini = p.batch_size * rows_per_seq
    micro = max(rows_per_seq, min(cfg.trainer.micro_batch_size or mini, mini) // rows_per_seq * rows_per_seq)
    steps_per_epoch = max(1, len(rows) // p.batch_size)
    head = Critic(loaded.model, "shared") if kind == "rm" else None  # the RM: a scalar head on the LM's trunk
    trainer = Trainer(loaded.model, cfg.trainer, 1.0, mini, micro, steps_per_epoch * p.epochs,
                      cfg.model.gradient_checkpointing, critic=head, critic_lr=cfg.algo.critic_lr)
    loss_fn = {"sft": sft_loss, "dpo": make_dpo_loss(p) if kind == "dpo" else None, "rm": make_rm_loss(p)}[kind]
    before = evaluate_offline(trainer, held_b, loss_fn)
    history, rng = [], random.Random(cfg.run.seed)
    bar = tqdm(total=steps_per_epoch * p.epochs, desc=kind, unit="step", disable=not cfg.run.progress, file=sys.stderr)
    for epoch in range(p.epochs):
        order = batch_order(train_b.completion_mask.view(len(rows), -1).sum(1).tolist(), p.batch_size,
                            p.group_by_length, rng)
        for s in range(steps_per_epoch):
            idx = [r * rows_per_seq + j for r in order[s * p.batch_size:(s + 1) * p.batch_size] for j in range(rows_per_seq)]
            mb = train_b.select(torch.tensor(idx))
            mb.old_logp = mb.sampler_logp  # no importance ratio in these losses: skip its recomputation
            m = trainer.accumulate(mb, loss_fn, first_epoch=False)
            m["actor/grad_norm"], m["actor/lr"] = trainer.step()[0], trainer.opt.param_groups[0]["lr"]
            history.append({"step": len(history) + 1, "epoch": epoch, **m})
            bar.update(1)
            bar.set_postfix(loss=f"{m['actor/loss']:.4f}")
    bar.close()
    after = evaluate_offline(trainer, held_b, loss_fn)
    out = save_model(loaded.model, tok, run_dir / "model", head)
    summary = {"kind": kind, "loss": "sft" if kind == "sft" else p.loss, "heldout_before": before, "heldout_after": after,
               "rows": len(rows), "heldout_rows": len(heldout), "skipped_rows": skipped, "steps": len(history),
               "wall_minutes": (time.perf_counter() - t0) / 60, "model": str(out)}
    write_atomic(run_dir / "metrics.jsonl", "".join(json.dumps(h) + "\n" for h in history))
    write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def train_stage(cfg: config.Config, run_dir: Path, kind: str) -> dict:
    """`rlpost sft|rm|dpo` and a pipeline stage: online DPO when kind='dpo' and pref.online_rounds > 0
    (preference/online.py), else training on fixed rows."""
    if kind == "dpo" and cfg.pref.online_rounds > 0:
        from rlpost.preference.online import run_online_dpo

        return run_online_dpo(cfg, run_dir)
    return train_offline(cfg, run_dir, kind)


@torch.no_grad()
def evaluate_offline(trainer: Trainer, held: Rollouts, loss_fn) -> dict:
    """Held-out loss and (DPO) the implicit reward accuracy and margin, micro-batch by micro-batch."""
    sums: dict[str, float] = {}
    n = len(held)
    held.norm_tokens, held.norm_seqs = float(held.completion_mask.sum()), n
    for i in range(0, n, trainer.micro):
        mb = held.select(slice(i, i + trainer.micro))
        out = trainer.forward(mb)
        loss, m = loss_fn(out.logp, mb, **({"values": out.values} if trainer.critic is not None else {}))
        sums["loss"] = sums.get("loss", 0.0) + loss.item()
        for k, v in m.items():
            sums[k] = sums.get(k, 0.0) + v * len(mb) / n
    return sums


def save_model(model, tokenizer, folder: Path, head: Critic | None = None) -> Path:
    """A transformers folder the next stage loads with model.name=FOLDER (written, then renamed);
    a reward model adds its scalar head as value_head.safetensors."""
    import shutil

    from safetensors.torch import save_file

    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if head is not None:
        save_file({k: v.contiguous() for k, v in head.head.state_dict().items()}, tmp / "value_head.safetensors")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder


def say(message: str) -> None:
    print(f"rlpost: {message}", file=sys.stderr, flush=True)
