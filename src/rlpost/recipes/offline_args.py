"""`rlpost sft | rsft | dpo | rm`: their parsers and their start, new or ``--resume``, checked before torch
loads (the config, the run folder, what a resume may change); recipes/pipeline.py's ``train_stage`` then
trains (recipes/offline.py, rsft.py, online.py)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rlpost import config, machine, names, runconfig
from rlpost.config_check import IGNORED, READ, refuse_ignored
from rlpost.console import say
from rlpost.observe import runfolder
from rlpost.types import folders
from rlpost.types.errors import DataError


def add_parsers(sub, options: str) -> None:
    """The four commands' arguments: a recipe and overrides, or --resume RUN_DIR and overrides."""
    for kind, what in (("sft", "supervised fine-tuning, completion-only loss"),
                       ("rsft", "rejection-sampling SFT: SFT on the policy's own samples the verifier accepts"),
                       ("dpo", "preference optimisation: pref.loss = dpo | ipo | kto | orpo | simpo"),
                       ("rm", "Bradley-Terry reward model (a scalar head on the LM)")):
        k = sub.add_parser(kind, help=what, epilog=options, formatter_class=argparse.RawDescriptionHelpFormatter,
                           description=f"{what[0].upper() + what[1:]}, " + (
                               "of the task's prompts (pref.online_rounds rounds)"
                               if kind == "rsft" else "on pref.data (or rows built from the task)"
                               + (", or with pref.online_rounds on pairs of the policy's own samples"
                                  if kind == "dpo" else ""))
                           + ". Writes RUN_DIR/model (a trained run; one whose rounds trained nothing says so).")
        k.add_argument("args", nargs="*", metavar="RECIPE|key=value", help="a recipe YAML, then dotted overrides")
        k.add_argument("--resume", metavar="RUN_DIR",
                       help=f"continue an rlpost {kind} run from "
                       + ("the end of its last round (a round sampled but not trained trains its rows, from its "
                          "newest intact checkpoint)" if kind == "rsft" else "its newest intact checkpoint")
                       + ("; online DPO (pref.online_rounds) from the end of its last round, as rsft"
                          if kind == "dpo" else "")
                       + "; overrides may change only what a resume can (run.threads, trainer.lr, ...: an error "
                       "lists them)")
        k.add_argument("--start-over", action="store_true",
                       help="with --resume: a run folder with nothing to go on from (stopped before its first "
                            "checkpoint, or its base model's measure) trains again from the start, its metrics "
                            "replaced, instead of refusing")


def main(args, recipe: str | None, overrides: list[str], keys: list[str], names_run, training) -> int:
    """A new run of `rlpost KIND` (``args.command``) or, with --resume, one going on; ``keys``: the keys the
    user typed (refused where KIND would ignore them); ``names_run``: cli.py's, for the stop line's hint;
    ``training(name)``: cli.py's, the functions that load torch (``preflight``, ``train_stage``,
    ``newest_intact``), imported once the config has passed."""
    if args.resume:
        return resume(args, recipe, overrides, keys, names_run, training)
    if getattr(args, "start_over", False):
        raise config.ConfigError("--start-over: only with --resume RUN_DIR")
    refuse_trl_names(overrides)
    refuse_ignored(args.command, keys)
    cfg = machine.check(config.load(recipe, overrides))
    if (reads := reads_as(cfg, args.command)) != args.command:  # dpo on fixed rows samples nothing
        refuse_ignored(reads, keys)
    refuse_unread_rows(cfg, args.command, keys)
    refuse_unread_loss_knobs(cfg, args.command, keys)
    run_dir = folders.run_path(cfg.run.out_dir, cfg.run.name or f"{args.command}-{time.strftime('%Y%m%d-%H%M%S')}")
    runfolder.check_new(run_dir, "pick another run.name", "run.name")
    training("preflight")(cfg, args.command)  # its rows and the model's limits, before the folder exists
    with names_run(run_dir), runfolder.claim(run_dir, "new") as rf:
        folders.mark(run_dir, "run", command=args.command)  # its own --resume takes it, no other (runfolder.made_by)
        rf.write_config(cfg)
        say(f"run folder {run_dir}")
        summary = training("train_stage")(cfg, run_dir, args.command)
    print(json.dumps(summary))
    return 0


def refuse_trl_names(overrides: list[str]) -> None:
    """A bare key from TRL's DPOConfig, SFTConfig or RewardConfig (``beta=0.1``, ``num_train_epochs=2``): the line
    names its key under these commands (names.PREFERENCE), where config.load would name RL's."""
    for item in overrides:
        key, _, value = item.partition("=")
        if "=" in item and "." not in key and key.strip():
            raise config.ConfigError(f"{key}: expected section.field, e.g. pref.beta{names.pref_hint(key, value)}")


def reads_as(cfg: config.Config, command: str) -> str:
    """The entry of config_check.IGNORED that says what `rlpost COMMAND` reads under ``cfg``: dpo on fixed rows
    (pref.online_rounds=0) reads less than online DPO, ``dpo_rows``."""
    return "dpo_rows" if command == "dpo" and cfg.pref.online_rounds == 0 else command


def refuse_unread_rows(cfg: config.Config, command: str, keys: list[str]) -> None:
    """sft, rm and dpo on fixed rows train on pref.data's rows, or without it on rows built from the task: one
    line for a key typed for the source they do not read (task.* beside pref.data; pref.eval_data,
    pref.heldout_frac, pref.on_bad_row without it), which was taken and dropped. Online DPO samples from the
    task's prompts: pref.data and its keys are refused there (rsft's are, by config_check.IGNORED)."""
    pref = cfg.pref
    if command == "dpo" and in_rounds(cfg, command):
        for key in keys:
            if key in ("pref.data", "pref.eval_data", "pref.prompt_format"):
                raise config.ConfigError(f"{key}: online DPO (pref.online_rounds={pref.online_rounds}) samples its "
                                         f"pairs from task.name={cfg.task.name}'s prompts; drop it, or "
                                         "pref.online_rounds=0 to train on pref.data's pairs")
        return
    if command not in ("sft", "rm") and reads_as(cfg, command) != "dpo_rows":
        return
    for key in keys:
        if pref.data and key.startswith("task."):
            raise config.ConfigError(f"{key}: rlpost {command} trains on pref.data's rows ({pref.data}); the task "
                                     "builds rows only without pref.data; drop it")
        if not pref.data and key in ("pref.eval_data", "pref.heldout_frac", "pref.on_bad_row"):
            raise config.ConfigError(f"{key}: applies to pref.data's rows, and pref.data is empty (rlpost {command} "
                                     f"builds its rows, held-out ones too, from task.name={cfg.task.name}); set "
                                     "pref.data or drop it")


# What each pref.loss reads of the loss knobs (algorithms/preference.py: make_dpo_loss); TRL's ORPOConfig calls
# ORPO's weight beta, which here is pref.orpo_lambda
LOSS_KNOBS = {"dpo": ("pref.beta", "pref.label_smoothing"), "ipo": ("pref.beta",), "kto": ("pref.beta",),
              "simpo": ("pref.beta", "pref.simpo_gamma"), "orpo": ("pref.orpo_lambda",)}


def refuse_unread_loss_knobs(cfg: config.Config, command: str, keys: list[str]) -> None:
    """dpo: one line for a loss knob typed that pref.loss does not read (pref.label_smoothing with ipo, pref.beta
    with orpo, ...), which was taken and dropped."""
    if command != "dpo":
        return
    reads = LOSS_KNOBS[cfg.pref.loss]
    for key in keys:
        if key in ("pref.beta", "pref.label_smoothing", "pref.simpo_gamma", "pref.orpo_lambda") and key not in reads:
            orpo = " (ORPO's weight, TRL's ORPOConfig beta, is pref.orpo_lambda)" if cfg.pref.loss == "orpo" else ""
            raise config.ConfigError(f"{key}: pref.loss={cfg.pref.loss} does not read it; it reads "
                                     f"{', '.join(reads)}{orpo}; drop it")


def in_rounds(cfg: config.Config, kind: str) -> bool:
    """Whether `rlpost KIND` runs in rounds, each sampling from the last (rsft, online DPO), and so goes on
    from RUN/rounds.json (recipes/round_state.py) rather than from checkpoints of its own."""
    return kind == "rsft" or (kind == "dpo" and reads_as(cfg, kind) == "dpo")


def resume(args, recipe: str | None, overrides: list[str], keys: list[str], names_run, training) -> int:
    """`rlpost sft|dpo|rm --resume RUN_DIR`: the folder, its config and the overrides checked before torch
    loads (as `rlpost train --resume`), then the run goes on from its newest intact checkpoint."""
    if recipe is not None:
        raise config.ConfigError(f"--resume takes overrides only, not a recipe ({recipe})")
    run_dir = Path(args.resume)
    refuse_trl_names(overrides)
    refuse_ignored(args.command, keys)
    runfolder.check_resume(run_dir, args.command)
    old, cfg = runconfig.load_run(run_dir, overrides)
    unread = IGNORED[reads_as(old, args.command)]
    read = READ.get(args.command, ())  # (rm reads algo.critic_lr of the algo section it otherwise ignores)
    changes = config.resume_changes(old, cfg, tuple(p for p in unread if not any(k.startswith(p) for k in read)))
    machine.check(cfg)
    if (run_dir / "summary.json").is_file():  # the last thing a run writes: nothing is left to do
        raise config.ConfigError(f"--resume {run_dir}: the run is finished (its summary.json is written); its model "
                                 f"is {run_dir / 'model'}. To train more, start a new run from it: "
                                 f"model.name={run_dir / 'model'}")
    with names_run(run_dir), runfolder.claim(run_dir, "resume", command=args.command) as rf:
        rounds = in_rounds(cfg, args.command)
        try:
            point = training("resume_point")(cfg, run_dir, args.command)
        except DataError:  # a damaged rounds.json: its line names --start-over, which goes on without it
            if not args.start_over:
                raise
            point = None
        if point is None and not args.start_over:
            raise config.ConfigError(
                f"--resume {run_dir}: " + ("nothing to go on from (it stopped while measuring its base model, before "
                                           "round 1)" if rounds else "no intact checkpoint to resume from (it stopped "
                                           "before its first)")
                + "; add --start-over to train it again from the start (its metrics are replaced)")
        start = "round 1 (--start-over)" if rounds else "step 0 (--start-over)"
        say(f"run folder {run_dir}: resuming from {point or start}")
        if changes:
            say(f"resuming with {'; '.join(changes)} (recorded in {rf.write_config(cfg).name})")
        summary = training("train_stage")(cfg, run_dir, args.command, resume=point is not None)
    print(json.dumps(summary))
    return 0
