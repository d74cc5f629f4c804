"""`rlpost sft | rsft | dpo | rm`: their parsers and their start, new or ``--resume``, checked before torch
loads (the config, the run folder, what a resume may change); recipes/pipeline.py's ``train_stage`` then
trains (recipes/offline.py, rsft.py, online.py)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rlpost import config, machine, runconfig
from rlpost.config_check import IGNORED, READ, refuse_ignored
from rlpost.console import say
from rlpost.observe import runfolder
from rlpost.types import folders


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
                       help="rsft runs in rounds and keeps no checkpoints: refused" if kind == "rsft" else
                       f"continue an rlpost {kind} run from its newest intact checkpoint; overrides may change only "
                       "what a resume can (run.threads, trainer.lr, ...: an error lists them)"
                       + ("; not online DPO (pref.online_rounds), which keeps no checkpoints" if kind == "dpo" else ""))
        if kind != "rsft":
            k.add_argument("--start-over", action="store_true",
                           help="with --resume: a run folder with no intact checkpoint (stopped before its first) "
                                "trains again from step 0, its metrics replaced, instead of refusing")


def main(args, recipe: str | None, overrides: list[str], keys: list[str], names_run, training) -> int:
    """A new run of `rlpost KIND` (``args.command``) or, with --resume, one going on; ``keys``: the keys the
    user typed (refused where KIND would ignore them); ``names_run``: cli.py's, for the stop line's hint;
    ``training(name)``: cli.py's, the functions that load torch (``preflight``, ``train_stage``,
    ``newest_intact``), imported once the config has passed."""
    if args.resume:
        return resume(args, recipe, overrides, keys, names_run, training)
    if getattr(args, "start_over", False):
        raise config.ConfigError("--start-over: only with --resume RUN_DIR")
    refuse_ignored(args.command, keys)
    cfg = machine.check(config.load(recipe, overrides))
    if (reads := reads_as(cfg, args.command)) != args.command:  # dpo on fixed rows samples nothing
        refuse_ignored(reads, keys)
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


def reads_as(cfg: config.Config, command: str) -> str:
    """The entry of config_check.IGNORED that says what `rlpost COMMAND` reads under ``cfg``: dpo on fixed rows
    (pref.online_rounds=0) reads less than online DPO, ``dpo_rows``."""
    return "dpo_rows" if command == "dpo" and cfg.pref.online_rounds == 0 else command


def resumable(cfg: config.Config, kind: str) -> bool:
    """Whether `rlpost KIND` keeps checkpoints a resume goes on from: RL and the runs on fixed rows (sft,
    rm, offline dpo); rsft and online DPO run in rounds, each sampling from the last, and keep none."""
    return kind in ("rl", "train", "sft", "rm") or reads_as(cfg, kind) == "dpo_rows"


def resume(args, recipe: str | None, overrides: list[str], keys: list[str], names_run, training) -> int:
    """`rlpost sft|dpo|rm --resume RUN_DIR`: the folder, its config and the overrides checked before torch
    loads (as `rlpost train --resume`), then the run goes on from its newest intact checkpoint."""
    if recipe is not None:
        raise config.ConfigError(f"--resume takes overrides only, not a recipe ({recipe})")
    run_dir = Path(args.resume)
    if args.command == "rsft":
        raise config.ConfigError(f"--resume {run_dir}: rlpost rsft runs in rounds, each sampling from the last, and "
                                 "keeps no checkpoints; run it again under another run.name")
    refuse_ignored(args.command, keys)
    runfolder.check_resume(run_dir, args.command)
    old, cfg = runconfig.load_run(run_dir, overrides)
    unread = IGNORED[reads_as(old, args.command)]
    read = READ.get(args.command, ())  # (rm reads algo.critic_lr of the algo section it otherwise ignores)
    changes = config.resume_changes(old, cfg, tuple(p for p in unread if not any(k.startswith(p) for k in read)))
    machine.check(cfg)
    if not resumable(cfg, args.command):
        raise config.ConfigError(f"--resume {run_dir}: online DPO (pref.online_rounds={cfg.pref.online_rounds}) "
                                 "keeps no checkpoints; run it again under another run.name")
    if (run_dir / "summary.json").is_file():  # the last thing a run writes: nothing is left to do
        raise config.ConfigError(f"--resume {run_dir}: the run is finished (its summary.json is written); its model "
                                 f"is {run_dir / 'model'}. To train more, start a new run from it: "
                                 f"model.name={run_dir / 'model'}")
    with names_run(run_dir), runfolder.claim(run_dir, "resume", command=args.command) as rf:
        ckpt = training("newest_intact")(run_dir)
        if ckpt is None and not args.start_over:
            raise config.ConfigError(f"--resume {run_dir}: no intact checkpoint to resume from (it stopped before its "
                                     "first); add --start-over to train it again from step 0 (its metrics are "
                                     "replaced)")
        say(f"run folder {run_dir}: resuming from {ckpt.name if ckpt else 'step 0 (--start-over)'}")
        if changes:
            say(f"resuming with {'; '.join(changes)} (recorded in {rf.write_config(cfg).name})")
        summary = training("train_stage")(cfg, run_dir, args.command, resume=ckpt is not None)
    print(json.dumps(summary))
    return 0
