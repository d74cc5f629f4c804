"""`rlpost sft`, `rlpost rm` and `rlpost dpo`: training on fixed data with the RL trainer's machinery.

All reuse the RL trainer (``Trainer.train_step`` / ``evaluate``: micro-batches with exact
accumulation, bf16 autocast over float32 master weights where bf16 is fast (trainer.precision),
fused AdamW, the lr schedule) with their own loss function over the same ``Rollouts`` batch. The
only differences from RL are where the rows come from and which loss is minimised:

  SFT  completion-only negative log-likelihood: prompt tokens carry no loss (they are not in the
       completion mask), every completion token of the batch weighs the same (token mean).
  RM   a scalar head on the LM's trunk, trained with the Bradley-Terry loss on pairs.
  DPO  one loss from algorithms/preference.py (dpo, ipo, kto, orpo, simpo) over pairs; a pair is a
       group of two rows (chosen, rejected) sharing a prompt. The reference's log-probs are
       computed once for the whole dataset before training (the reference is frozen), not per step.

With ``model.lora_r > 0`` the policy trains LoRA adapters on a frozen base (model/lora.py, peft),
the RM's scalar head trains in full beside them, and DPO's reference is the base itself (its
log-probs are taken before the adapters exist).

The result is a transformers folder (``RUN_DIR/model``, adapters merged in) that
``model.name=RUN_DIR`` loads for the next stage; a LoRA run also keeps the adapters alone in
``RUN_DIR/adapter`` (peft's format).
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

from rlpost import build, config, machine
from rlpost.algorithms.preference import REFERENCE_FREE, make_dpo_loss, make_rm_loss, sft_loss
from rlpost.console import say
from rlpost.envs import build_task, data
from rlpost.model import encode, fit, lora, precision
from rlpost.model.checkpoint import write_atomic
from rlpost.model.load import load_policy_for, save_model
from rlpost.roles.critic import Critic
from rlpost.roles.reference import Reference
from rlpost.roles.trainer import Trainer
from rlpost.types.errors import DataError, RunError


def task_rows(cfg: config.Config, kind: str) -> tuple[list[dict], list[dict]]:
    """Rows built from the RL task when pref.data is empty: the correct answer is the completion
    (SFT) or the chosen one, an answer off by 1..5 the rejected one (preference)."""
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
    if not rows or not heldout:
        split = "pref.eval_data" if p.eval_data else f"pref.heldout_frac={p.heldout_frac:g}"
        raise DataError(f"pref.data: {p.data} leaves {len(rows)} training and {len(heldout)} held-out rows ({split}, "
                        f"{bad_train + bad_heldout} malformed rows skipped); both need at least one")
    return rows, heldout, bad_train + bad_heldout


def preflight(cfg: config.Config, kind: str) -> None:
    """What `rlpost sft|rsft|rm|dpo` checks before its run folder exists: this machine, the LoRA
    targets, and its rows (read and checked) with their prompts within the model's context."""
    machine.check(cfg)
    if cfg.model.lora_r > 0:
        fit.check_lora_targets(cfg.model.name, cfg.model.lora_targets)
    if kind == "rsft" or (kind == "dpo" and cfg.pref.online_rounds > 0):  # sampled from the task's prompts
        task = build_task(cfg)
        fit.check_prompts(cfg.model.name, task.train + task.heldout, cfg.rollout.max_new_tokens, "rollout.max_new_tokens",
                          f"task.name={cfg.task.name}")
        return
    rows, heldout, _ = load_rows(cfg, kind)
    parse = data.sft_pair if kind == "sft" else data.preference_triple
    prompts = [{"messages": parse(r, "")[0], **({"_line": r["_line"]} if "_line" in r else {})} for r in rows + heldout]
    fit.check_prompts(cfg.model.name, prompts, cfg.pref.max_len, "pref.max_len", cfg.pref.data or f"task.name={cfg.task.name}")


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
    cfg = build.resolve_precision(cfg)  # after saving: a resumed or copied run probes its own machine
    rows, heldout, skipped = load_rows(cfg, kind)
    if skipped:
        say(f"skipped {skipped} malformed rows (pref.on_bad_row=skip)")
    loaded = load_policy_for(cfg)
    build.on_device(cfg, loaded.model)  # run.device (resolved above); the roles move each batch to it
    tok = loaded.tokenizer
    enc = (lambda rs: encode.encode_sft(tok, rs, p.max_len)) if kind == "sft" else (lambda rs: encode.encode_pairs(tok, rs, p.max_len))
    rows_per_seq = 1 if kind == "sft" else 2  # sequences per row: a pair is two
    train_b, held_b = enc(rows), enc(heldout)
    reference = None
    if kind == "dpo" and p.loss not in REFERENCE_FREE:  # ORPO and SimPO compare the policy with itself
        reference = Reference(loaded.model, 1.0, 32, precision.trainer_bf16(cfg.trainer.precision), cfg.trainer.share_prompt_prefix,
                              forward=cfg.trainer.forward)
        train_b.ref_logp, held_b.ref_logp = reference.logprobs(train_b), reference.logprobs(held_b)  # once, cached
        reference.model = None  # frozen numbers are all it was for
    model = lora.wrap(loaded.model, cfg.model, cfg.run.seed) if cfg.model.lora_r > 0 else loaded.model
    mini = p.batch_size * rows_per_seq
    micro = max(rows_per_seq, min(cfg.trainer.micro_batch_size or mini, mini) // rows_per_seq * rows_per_seq)
    steps_per_epoch = max(1, len(rows) // p.batch_size)
    head = Critic(loaded.model, "shared") if kind == "rm" else None  # the RM: a scalar head on the LM's trunk
    trainer = Trainer(model, cfg.trainer, 1.0, mini, micro, steps_per_epoch * p.epochs,
                      cfg.model.gradient_checkpointing, critic=head, critic_lr=cfg.algo.critic_lr)
    loss_fn = {"sft": sft_loss, "dpo": make_dpo_loss(p) if kind == "dpo" else None, "rm": make_rm_loss(p)}[kind]
    before = trainer.evaluate(held_b, loss_fn)
    history, rng, streak = [], random.Random(cfg.run.seed), 0
    bar = tqdm(total=steps_per_epoch * p.epochs, desc=kind, unit="step", disable=not cfg.run.progress, file=sys.stderr)
    for epoch in range(p.epochs):
        order = batch_order(train_b.completion_mask.view(len(rows), -1).sum(1).tolist(), p.batch_size,
                            p.group_by_length, rng)
        for s in range(steps_per_epoch):
            idx = [r * rows_per_seq + j for r in order[s * p.batch_size:(s + 1) * p.batch_size] for j in range(rows_per_seq)]
            m = trainer.train_step(train_b.select(torch.tensor(idx)), loss_fn)
            history.append({"step": len(history) + 1, "epoch": epoch, **m})
            streak = streak + 1 if m["actor/nonfinite_steps"] else 0  # skipped by the trainer (roles/trainer.py)
            if streak >= cfg.trainer.max_nonfinite_steps:
                raise RunError(f"{streak} optimizer steps in a row with a non-finite loss or gradient (step {len(history)}); "
                               "stopped, no model written: try a lower trainer.lr")
            bar.update(1)
            bar.set_postfix(loss=f"{m['actor/loss']:.4f}")
    bar.close()
    after = trainer.evaluate(held_b, loss_fn)
    if lora.is_lora(model):  # the adapters alone, then a plain model with them folded in
        lora.save_adapter(model, tok, run_dir / "adapter")
        model = model.merge_and_unload()
    out = save_model(model, tok, run_dir / "model", head.head if head is not None else None)
    loss_name = {"sft": "sft", "rm": "bradley_terry" + (f" (margin {p.rm_margin})" if p.rm_margin else ""),
                 "dpo": p.loss}[kind]
    summary = {"kind": kind, "loss": loss_name, "heldout_before": before, "heldout_after": after,
               "rows": len(rows), "heldout_rows": len(heldout), "skipped_rows": skipped, "steps": len(history),
               "wall_minutes": (time.perf_counter() - t0) / 60, "model": str(out)}
    write_atomic(run_dir / "metrics.jsonl", "".join(json.dumps(h) + "\n" for h in history))
    write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary
