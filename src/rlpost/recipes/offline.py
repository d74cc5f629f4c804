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

Checkpoints are the RL loop's (model/checkpoint.py: atomic, verified when read): every
``run.checkpoint_every`` steps, after the last step, and when a stop signal comes. Beside the
weights and the optimizer, ``state.pt`` keeps the data order (the epoch's shuffled row order and
the shuffling RNG's state, under ``stream``), the held-out loss before training and ``algo_name``
(``offline_name``: sft, rm, or dpo:LOSS), so ``rlpost sft|dpo|rm --resume RUN_DIR`` continues with
the very batches an uninterrupted run would have taken, and a checkpoint of another kind of run is
refused by name.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Callable

import torch

from rlpost import build, config, machine
from rlpost.algorithms.preference import REFERENCE_FREE, make_dpo_loss, make_rm_loss, sft_loss
from rlpost.console import say, say_once
from rlpost.envs import build_task, data
from rlpost.model import checkpoint, encode, fit, lora
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


def epoch_steps(rows: int, batch_size: int) -> int:
    """Optimizer steps an epoch: every row trains once, the last batch smaller where batch_size does not divide
    the rows (as HF's Trainer with its default dataloader_drop_last=False)."""
    return max(1, -(-rows // batch_size))


def batch_order(lengths: list[int], batch_size: int, by_length: bool, rng: random.Random) -> list[int]:
    """A shuffled row order, cut into batches of batch_size in turn (the last one smaller where it does not
    divide). With by_length, rows are sorted by length inside windows of 50 batches and the full batches
    are shuffled, the smaller one kept last: rows of similar length share a batch, so less padding is
    computed, while batch order stays random (length-grouped sampling, as TRL/HF Trainer do)."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    if not by_length:
        return order
    window = 50 * batch_size
    order = [i for w in range(0, len(order), window) for i in sorted(order[w:w + window], key=lengths.__getitem__)]
    batches = [order[b:b + batch_size] for b in range(0, len(order), batch_size)]
    last = [batches.pop()] if batches and len(batches[-1]) < batch_size else []
    rng.shuffle(batches)
    return [i for b in batches + last for i in b]


# --- the loop --------------------------------------------------------------------------------


def offline_name(cfg: config.Config, kind: str) -> str:
    """What an offline run's checkpoints record as ``algo_name``: its command, and for dpo the loss."""
    return f"dpo:{cfg.pref.loss}" if kind == "dpo" else kind


def resume_point(cfg: config.Config, run_dir: Path, kind: str) -> tuple[Path, tuple[dict, dict, dict]]:
    """(folder, (weights, trainer state, run state)) of the newest intact checkpoint of ``run_dir``
    (corrupt ones are passed over with a line each); one of another kind of run is refused by name."""
    found = checkpoint.load_latest(run_dir)
    if found is None:
        raise config.ConfigError(f"--resume {run_dir}: no intact checkpoint to resume from")
    checkpoint.check_fits(found[0], offline_name(cfg, kind), kind == "rm", cfg.model.lora_r > 0,
                          cfg.trainer.param_dtype == "bfloat16")
    return found


def train_offline(cfg: config.Config, run_dir: Path, kind: str, resume: bool = False, unit: str = "step") -> dict:
    """SFT (kind='sft'), a DPO-family loss (kind='dpo') or a Bradley-Terry reward model (kind='rm')
    on fixed rows; returns the summary (also RUN_DIR/summary.json). Inside the RL loop's scaffold:
    torch's threads by free cores (model/cores.py), the run guard (a first SIGINT/SIGTERM finishes
    the step and saves a checkpoint and RUN/model so far; non-finite steps in a row stop the run:
    recipes/guard.py), one metrics.jsonl line per step as it happens, to every run.loggers sink
    (observe/runlog.py). ``resume``: go on from the newest intact checkpoint (the CLI has checked
    the folder and the config). ``unit``: what its steps are called in the stop lines ("round 2's step"
    for a round of rsft or online DPO, whose model is then RUN/round_2/model)."""
    cores = Cores(cfg.run.threads)  # torch's threads: every core, fewer while other processes keep some busy
    torch.manual_seed(cfg.run.seed)
    pref, t0 = cfg.pref, time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / "config.yaml").exists():  # the CLI wrote it (a resume's, or --start-over's, is the run's own)
        config.save(cfg, run_dir / "config.yaml")
    ckpt, (weights, trainer_state, state) = resume_point(cfg, run_dir, kind) if resume else (None, (None, None, {}))
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
        steps_per_epoch = epoch_steps(len(rows), pref.batch_size)
        if kind == "dpo" and pref.loss not in REFERENCE_FREE:  # ORPO and SimPO compare the policy with itself
            reference = build.make_pref_reference(cfg, loaded.model, micro)  # frozen: its numbers once, before training
            train_b.ref_logp, held_b.ref_logp = reference.logprobs(train_b), reference.logprobs(held_b)
        if weights is not None and cfg.model.lora_r == 0:  # (with LoRA the base stays; the adapters are in trainer.pt)
            checkpoint.load_into(loaded.model, weights, "the checkpoint's model.safetensors")
        weights = None  # in the model now: not a second copy to the run's end
        trainer = build.make_pref_trainer(cfg, loaded.model, mini, micro, steps_per_epoch * pref.epochs,
                                          value_head=kind == "rm", pairs=rows_per_seq == 2)
        loss_fn = {"sft": sft_loss, "dpo": make_dpo_loss(pref) if kind == "dpo" else None,
                   "rm": make_rm_loss(pref)}[kind]
        start = 0
        if resume:
            start = load_state(trainer, trainer_state, state)
            trainer_state = None
        before = state["offline_before"] if resume else trainer.evaluate(held_b, loss_fn)
        total = steps_per_epoch * pref.epochs
        if start > total:
            raise config.ConfigError(f"{run_dir} is at step {start} (its newest checkpoint), past the {total} steps of "
                                     f"pref.epochs={pref.epochs}")
        log = RunLog(run_dir, total, start, cfg.run.progress, sinks, ckpt, desc=kind, rollouts=False,
                     postfix=lambda m, history: {"loss": f"{m['actor/loss']:.4f}"})
        minutes = state.get("minutes", 0.0)  # a resumed run's wall time counts its earlier starts
        steps = run_epochs(trainer, train_b, rows_per_seq, loss_fn, cfg, cores, log,
                           save=lambda: save_trained(trainer, tok, run_dir), start=start, stream=state.get("stream"),
                           unit=unit, model_dir="RUN" if unit == "step" else run_dir.name,
                           save_checkpoint=checkpointer(cfg, run_dir, kind, trainer, log, before,
                                                        lambda: minutes + (time.perf_counter() - t0) / 60))
    finally:
        sinks.close()  # (again is a no-op: the log closes them too)
    after = trainer.evaluate(held_b, loss_fn)
    out = save_trained(trainer, tok, run_dir)
    loss_name = {"sft": "sft", "rm": "bradley_terry" + (f" (margin {pref.rm_margin})" if pref.rm_margin else ""),
                 "dpo": pref.loss}[kind]
    return log.write_summary({"kind": kind, "loss": loss_name, "heldout_before": before, "heldout_after": after,
                              "rows": len(rows), "heldout_rows": len(heldout), "skipped_rows": skipped, "steps": steps,
                              "wall_minutes": minutes + (time.perf_counter() - t0) / 60, "model": str(out)})


def checkpointer(cfg: config.Config, run_dir: Path, kind: str, trainer: Trainer, log: RunLog, before: dict,
                 minutes) -> Callable[[int, dict], None]:
    """``save_checkpoint(step, stream)`` for run_epochs: the trainer's weights and state, the data order
    (``stream``), the RNG, the held-out loss before training and ``minutes()``, the run's wall time."""
    saved = {"algo_name": offline_name(cfg, kind), "heldout_before": None, "offline_before": before}

    def save_checkpoint(step: int, stream: dict) -> None:
        state = {**saved, "step": step, "stream": stream, "torch_rng": torch.get_rng_state(), "minutes": minutes()}
        checkpoint.save(run_dir, step, checkpoint.Saved(trainer.checkpoint_weights(), trainer.state_dict(), state),
                        cfg.run.keep_checkpoints, metrics=log.history)

    return save_checkpoint


def load_state(trainer: Trainer, trainer_state: dict, state: dict) -> int:
    """Put a checkpoint's optimizer, schedule, adapters, head and RNG back; the step it was taken after.
    State that fits its schema but not this run (an optimizer of other parameters) is one line
    (checkpoint.fitting); the data order and the loss before training are checked here, used later."""
    with checkpoint.fitting(state["step"]):
        trainer.load_state_dict(trainer_state)
        torch.set_rng_state(state["torch_rng"])
        order, rng = state["stream"]["order"], state["stream"]["rng"]
        if not (isinstance(order, list) and all(isinstance(i, int) for i in order)):
            raise ValueError("stream.order is not a list of row numbers")
        random.Random().setstate(rng)
        if not isinstance(state["offline_before"], dict):
            raise ValueError("offline_before is not the held-out loss's metrics")
    return state["step"]


def run_epochs(trainer: Trainer, data: Rollouts, rows_per_seq: int, loss_fn, cfg: config.Config, cores: Cores,
               log: RunLog, save, start: int = 0, stream: dict | None = None, save_checkpoint=None,
               unit: str = "step", model_dir: str = "RUN") -> int:
    """pref.epochs passes over ``data`` (pref.batch_size rows a step, shuffled per epoch: batch_order)
    inside the run guard, from step ``start`` + 1; ``save()`` writes what is trained so far when a
    stop signal comes. ``save_checkpoint(step, stream)`` is called every run.checkpoint_every steps,
    after the last and on a stop signal; ``stream`` (a checkpoint's) is the data order to go on
    with: the epoch's row order and the shuffling RNG's state. ``unit``, ``model_dir``: the stop lines' words
    (train_offline's). Returns the steps taken."""
    pref, n_rows = cfg.pref, len(data) // rows_per_seq
    steps_per_epoch = epoch_steps(n_rows, pref.batch_size)
    total = steps_per_epoch * pref.epochs
    rng, order = random.Random(cfg.run.seed), None
    if stream is not None:  # a resume: the order of the epoch it stopped in, and the RNG that draws the next
        rng.setstate(stream["rng"])
        order = stream["order"]
    step = start
    log.begin()
    try:
        with RunGuard(cfg, saved=f"checkpoint (and {model_dir}/model so far)", unit=unit,
                      after_nonfinite="no model is written. Try a lower trainer.lr") as guard:
            for step in guard.steps(start + 1, total):
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
                stop = guard.finish_step()  # a stop signal: saved, then the guard stops the run
                every = cfg.run.checkpoint_every and step % cfg.run.checkpoint_every == 0
                if save_checkpoint is not None and (stop or every or step == total):
                    save_checkpoint(step, {"order": order, "rng": rng.getstate()})
                if stop:
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
