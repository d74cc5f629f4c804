"""`rlpost sft`, `rlpost rm` and `rlpost dpo`: training on fixed data with the RL trainer's machinery.

All reuse the RL trainer (``Trainer.train_step`` / ``evaluate``: micro-batches with exact
accumulation, bf16 autocast over float32 master weights where bf16 is fast (trainer.precision),
fused AdamW, the lr schedule; built by build.py as every trainer is) with their own loss function
over the same ``Rollouts`` batch, inside the RL loop's scaffold (threads, run guard, run log and
sinks: ``train_offline``). The only differences from RL are where the rows come from and which
loss is minimised:

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

import random
import time
from pathlib import Path

import torch

from rlpost import build, config, machine
from rlpost.algorithms.preference import REFERENCE_FREE, make_dpo_loss, make_rm_loss, sft_loss
from rlpost.console import say, say_once
from rlpost.envs import build_task, data
from rlpost.model import encode, fit, lora
from rlpost.model.cores import Cores
from rlpost.model.load import load_policy_for, load_tokenizer, save_model
from rlpost.observe.loggers import Loggers
from rlpost.observe.runlog import RunLog
from rlpost.recipes.guard import RunGuard
from rlpost.roles.trainer import Trainer
from rlpost.types.batch import Rollouts
from rlpost.types.errors import DataError


def task_rows(cfg: config.Config, kind: str) -> tuple[list[dict], list[dict]]:
    """Rows built from the RL task when pref.data is empty: the correct answer is the completion
    (SFT) or the chosen one, an answer off by 1..5 the rejected one (preference)."""
    task = build_task(cfg.task)
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
    pref = cfg.pref
    if not pref.data:
        return (*task_rows(cfg, kind), 0)
    rows = data.read_rows(pref.data)
    if pref.eval_data:
        heldout = data.read_rows(pref.eval_data)
    else:
        cut = max(1, int(len(rows) * (1 - pref.heldout_frac)))
        rows, heldout = rows[:cut], rows[cut:]
    parse = data.sft_pair if kind == "sft" else data.preference_triple
    rows, bad_train = data.check_rows(rows, parse, pref.data, pref.on_bad_row)
    heldout, bad_heldout = data.check_rows(heldout, parse, pref.eval_data or pref.data, pref.on_bad_row)
    if pref.on_bad_row == "skip" and (fit.architecture(cfg.model.name)[1] or 0) > pref.max_len:
        # and the rows whose prompt leaves no room for pref.max_len (a pref.max_len past the context: preflight's line)
        long = fit.check_prompts(cfg.model.name, prompt_rows(rows + heldout, parse), pref.max_len, "pref.max_len",
                                 pref.data, ("pref.on_bad_row", "skip"))
        if long:
            n = len(rows)
            rows, heldout = fit.without(rows, heldout, long)
            # once: preflight reads the rows, then the run reads them again
            say_once(f"skipped {len(long)} rows whose prompt does not fit pref.max_len ({n - len(rows)} training; "
                     "pref.on_bad_row=skip)")
            bad_train += len(long)
    if not rows or not heldout:
        split = "pref.eval_data" if pref.eval_data else f"pref.heldout_frac={pref.heldout_frac:g}"
        raise DataError(f"pref.data: {pref.data} leaves {len(rows)} training and {len(heldout)} held-out rows "
                        f"({split}, {bad_train + bad_heldout} malformed rows skipped); both need at least one")
    if kind != "sft":
        same = sum(1 for _, chosen, rejected in (parse(r, pref.data) for r in rows) if chosen == rejected)
        if same:  # a pair whose two answers are one text gives the loss no signal (DPO's margin, the RM's: 0)
            say_once(f"pref.data: {same} of {len(rows)} training pairs have chosen == rejected: they teach nothing"
                + (" (all of them: this run cannot learn)" if same == len(rows) else ""))
    return rows, heldout, bad_train + bad_heldout


def preflight(cfg: config.Config, kind: str) -> None:
    """What `rlpost sft|rsft|rm|dpo` checks before its run folder exists: this machine, the LoRA
    targets, and its rows (read and checked) with their prompts within the model's context."""
    machine.check(cfg)
    if cfg.model.lora_r > 0:
        fit.check_lora_targets(cfg.model.name, cfg.model.lora_targets)
    if kind == "rsft" or (kind == "dpo" and cfg.pref.online_rounds > 0):  # sampled from the task's prompts
        task = build_task(cfg.task)
        if not task.train:
            raise config.ConfigError(build.NOTHING_TO_TRAIN)
        fit.check_prompts(cfg.model.name, task.train + task.heldout, cfg.rollout.max_new_tokens,
                          "rollout.max_new_tokens", f"task.name={cfg.task.name}")
        return
    rows, heldout, _ = load_rows(cfg, kind)
    parse = data.sft_pair if kind == "sft" else data.preference_triple
    fit.check_prompts(cfg.model.name, prompt_rows(rows + heldout, parse), cfg.pref.max_len, "pref.max_len",
                      cfg.pref.data or f"task.name={cfg.task.name}",
                      ("pref.on_bad_row" if cfg.pref.data else "", "refuse"))
    if cfg.pref.data:
        say_cut(cfg, rows, parse)


CUT_SAMPLE = 1000  # training rows whose completions are tokenized to tell how many pref.max_len cuts


def say_cut(cfg: config.Config, rows: list[dict], parse) -> None:
    """One line when completions are longer than pref.max_len (cut to it, as TRL's max_completion_length cuts
    them): their share among the first CUT_SAMPLE training rows."""
    tok = load_tokenizer(cfg.model.name)
    texts = [t for r in rows[:CUT_SAMPLE] for t in parse(r, "")[1:]]
    cut = sum(len(tok.encode(t, add_special_tokens=False)) >= cfg.pref.max_len for t in texts)
    if cut:
        say(f"pref.max_len: {cut} of {len(texts)} completions{' in the first rows' if len(rows) > CUT_SAMPLE else ''} "
            f"are longer than {cfg.pref.max_len} tokens and are cut there (the rest of each is not trained on); "
            "raise pref.max_len to keep more")


def prompt_rows(rows: list[dict], parse) -> list[dict]:
    """Each row's prompt as fit.check_prompts reads it: its messages, and its line where it has one."""
    return [{"messages": parse(r, "")[0], **({"_line": r["_line"]} if "_line" in r else {})} for r in rows]


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
    on fixed rows; returns the summary (also RUN_DIR/summary.json). Inside the RL loop's scaffold:
    torch's threads by free cores (model/cores.py), the run guard (a first SIGINT/SIGTERM finishes
    the step and saves RUN/model so far; non-finite steps in a row stop the run: recipes/guard.py),
    one metrics.jsonl line per step as it happens, to every run.loggers sink (observe/runlog.py)."""
    cores = Cores(cfg.run.threads)  # torch's threads: every core, fewer while other processes keep some busy
    torch.manual_seed(cfg.run.seed)
    pref, t0 = cfg.pref, time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    config.save(cfg, run_dir / "config.yaml")
    # a missing package stops us here, before any model loads
    sinks = Loggers(cfg.run.loggers, run_dir, config.to_dict(cfg))
    try:
        cfg = build.resolve_precision(cfg)  # after saving: a resumed or copied run probes its own machine
        rows, heldout, skipped = load_rows(cfg, kind)
        if skipped:
            say(f"skipped {skipped} rows, malformed or too long for the context (pref.on_bad_row=skip)")
        loaded = load_policy_for(cfg.model, cfg.run.seed)
        build.on_device(cfg, loaded.model)  # run.device (resolved above); the roles move each batch to it
        tok = loaded.tokenizer
        raw = pref.prompt_format == "raw"
        enc = ((lambda rs: encode.encode_sft(tok, rs, pref.max_len, raw)) if kind == "sft"
               else (lambda rs: encode.encode_pairs(tok, rs, pref.max_len, raw)))
        rows_per_seq = 1 if kind == "sft" else 2  # sequences per row: a pair is two
        train_b, held_b = enc(rows), enc(heldout)
        mini = pref.batch_size * rows_per_seq
        micro = max(rows_per_seq, min(cfg.trainer.micro_batch_size or mini, mini) // rows_per_seq * rows_per_seq)
        steps_per_epoch = max(1, len(rows) // pref.batch_size)
        if kind == "dpo" and pref.loss not in REFERENCE_FREE:  # ORPO and SimPO compare the policy with itself
            reference = build.make_pref_reference(cfg, loaded.model, micro)  # frozen: its numbers once, before training
            train_b.ref_logp, held_b.ref_logp = reference.logprobs(train_b), reference.logprobs(held_b)
        trainer = build.make_pref_trainer(cfg, loaded.model, mini, micro, steps_per_epoch * pref.epochs,
                                          value_head=kind == "rm")
        loss_fn = {"sft": sft_loss, "dpo": make_dpo_loss(pref) if kind == "dpo" else None,
                   "rm": make_rm_loss(pref)}[kind]
        before = trainer.evaluate(held_b, loss_fn)
        log = RunLog(run_dir, steps_per_epoch * pref.epochs, 0, cfg.run.progress, sinks, desc=kind, rollouts=False,
                     postfix=lambda m, history: {"loss": f"{m['actor/loss']:.4f}"})
        steps = run_epochs(trainer, train_b, rows_per_seq, loss_fn, cfg, cores, log,
                           save=lambda: save_trained(trainer, tok, run_dir))
    finally:
        sinks.close()  # (again is a no-op: the log closes them too)
    after = trainer.evaluate(held_b, loss_fn)
    out = save_trained(trainer, tok, run_dir)
    loss_name = {"sft": "sft", "rm": "bradley_terry" + (f" (margin {pref.rm_margin})" if pref.rm_margin else ""),
                 "dpo": pref.loss}[kind]
    return log.write_summary({"kind": kind, "loss": loss_name, "heldout_before": before, "heldout_after": after,
                              "rows": len(rows), "heldout_rows": len(heldout), "skipped_rows": skipped, "steps": steps,
                              "wall_minutes": (time.perf_counter() - t0) / 60, "model": str(out)})


def run_epochs(trainer: Trainer, data: Rollouts, rows_per_seq: int, loss_fn, cfg: config.Config, cores: Cores,
               log: RunLog, save) -> int:
    """pref.epochs passes over ``data`` (pref.batch_size rows a step, shuffled per epoch: batch_order)
    inside the run guard; ``save()`` writes what is trained so far when a stop signal comes. Returns
    the steps taken."""
    pref, n_rows = cfg.pref, len(data) // rows_per_seq
    steps_per_epoch = max(1, n_rows // pref.batch_size)
    rng = random.Random(cfg.run.seed)
    log.begin()
    try:
        with RunGuard(cfg, saved="model (RUN/model)",
                      after_nonfinite="no model is written. Try a lower trainer.lr") as guard:
            for step in guard.steps(1, steps_per_epoch * pref.epochs):
                epoch, s = divmod(step - 1, steps_per_epoch)
                if s == 0:  # a new epoch: a new order
                    order = batch_order(data.completion_mask.view(n_rows, -1).sum(1).tolist(), pref.batch_size,
                                        pref.group_by_length, rng)
                rows = order[s * pref.batch_size:(s + 1) * pref.batch_size]
                cores.adjust()
                m = trainer.train_step(data.select(torch.tensor([r * rows_per_seq + j for r in rows
                                                                 for j in range(rows_per_seq)])),
                                       loss_fn)
                guard.check_update(m, step)  # skipped by the trainer (roles/trainer.py); N in a row stop the run
                log.step(step, {"epoch": epoch, **m})
                if guard.finish_step():  # a stop signal: the model so far is saved, then the guard stops the run
                    save()
    finally:
        log.close()
    return step


def save_trained(trainer: Trainer, tokenizer, run_dir: Path) -> Path:
    """RUN_DIR/model (and RUN_DIR/adapter for a LoRA run: the adapters alone, then a plain model with
    them folded in), with the reward model's head when there is one."""
    model = trainer.model
    if lora.is_lora(model):
        lora.save_adapter(model, tokenizer, run_dir / "adapter")
        model = model.merge_and_unload()
    return save_model(model, tokenizer, run_dir / "model", trainer.critic.head if trainer.critic is not None else None)
