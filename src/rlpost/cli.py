"""rlpost command line.

  rlpost train [RECIPE.yaml] [section.key=value ...]   train (no recipe = the demo defaults)
  rlpost train --resume RUN_DIR [section.key=value ...] continue a run from its last checkpoint
  rlpost eval MODEL_OR_RUN_DIR [--n N] [section.key=value ...]   greedy held-out accuracy
  rlpost sft | dpo | rm [RECIPE.yaml] [section.key=value ...]   supervised, preference, reward-model training
  rlpost pipeline PIPELINE.yaml                         SFT -> (RM) -> DPO -> RL, one table at the end
  rlpost report RUN_DIR [--out FILE]                    self-contained HTML report with plots
  rlpost doctor RUN_DIR                                 training-health findings and the knob for each
  rlpost plan [--model M | --params 7B | --from RUN_DIR] ...   memory and step-time estimate

Bad input (config, model path, data file, a run folder in use) ends with one line on stderr
naming what is wrong and exit status 2, never a traceback; so does a batch too big for memory. A
run stopped by what it cannot go on from (a full disk, a read-only folder, non-finite training, a
reward function that keeps failing) ends with one line and exit status 1, its saved data intact.
SIGINT and SIGTERM end with one line and 130 / 143 (during training: after saving the current step,
recipes/guard.py).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
import time
from pathlib import Path

from rlpost import config
from rlpost.console import say
from rlpost.observe import runfolder
from rlpost.types.errors import Interrupted, ModelLoadError, RunError

EXIT_BAD_INPUT = 2


def _split(args: list[str]) -> tuple[str | None, list[str]]:
    """The first argument without '=' is the recipe; the rest are overrides."""
    recipe = None
    overrides = []
    for a in args:
        if "=" in a or recipe is not None:
            overrides.append(a)
        else:
            recipe = a
    return recipe, overrides


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlpost", description="RL post-training of language models.")
    sub = p.add_subparsers(dest="command", required=True)
    options = "options (section.key=value):\n" + config.help_text()
    t = sub.add_parser("train", help="run GRPO (or the recipe's algorithm)", epilog=options,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Train. With no recipe, runs the demo: GRPO on the embedded SmolLM2-135M-Instruct.")
    t.add_argument("args", nargs="*", metavar="RECIPE|key=value", help="a recipe YAML, then dotted overrides")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue RUN_DIR from its newest intact checkpoint; overrides "
                   "may change only what a resume can (trainer.lr, run.steps, ...: an error lists them)")
    t.add_argument("--start-over", action="store_true", help="with --resume: a run folder with no intact checkpoint "
                   "trains again from step 0 (its metrics and samples are replaced) instead of refusing")
    e = sub.add_parser("eval", help="held-out accuracy of a model or a run", epilog=options,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Greedy held-out accuracy on the task of the config (a run's own, or the defaults).")
    e.add_argument("target", metavar="MODEL_OR_RUN_DIR", help="'embedded', 'tiny', a model folder, a hub id, or a run folder")
    e.add_argument("args", nargs="*", metavar="key=value", help="dotted overrides")
    e.add_argument("--n", type=int, default=0, help="held-out problems to use (0 = all)")
    e.add_argument("--samples", type=int, default=0, help="also draw S samples per problem at rollout.temperature: pass@k, maj@k")
    e.add_argument("--k", default="", help="comma-separated k for pass@k and maj@k (default: 1 and S)")
    e.add_argument("--out", default="", help="per-sample results (JSONL); default RUN_DIR/eval_samples.jsonl or ./eval_samples.jsonl")
    for kind, what in (("sft", "supervised fine-tuning, completion-only loss"),
                       ("dpo", "preference optimisation: pref.loss = dpo | ipo | kto | orpo | simpo"),
                       ("rm", "Bradley-Terry reward model (a scalar head on the LM)")):
        k = sub.add_parser(kind, help=what, epilog=options, formatter_class=argparse.RawDescriptionHelpFormatter,
                           description=f"{what.capitalize()}, on pref.data (or rows built from the task). Writes RUN_DIR/model.")
        k.add_argument("args", nargs="*", metavar="RECIPE|key=value", help="a recipe YAML, then dotted overrides")
    pl = sub.add_parser("pipeline", help="SFT -> (RM) -> DPO -> RL from one recipe, with a stage table")
    pl.add_argument("recipe", metavar="PIPELINE.yaml")
    r = sub.add_parser("report", help="write RUN_DIR/report.html: plots, health findings, samples")
    r.add_argument("run_dir", metavar="RUN_DIR")
    r.add_argument("--out", metavar="FILE", help="where to write the HTML (default RUN_DIR/report.html)")
    r.add_argument("--steps", metavar="N,M", help="steps whose samples to list (default: first, middle, last)")
    d = sub.add_parser("doctor", help="what went wrong in a run, and which knob addresses it")
    d.add_argument("run_dir", metavar="RUN_DIR")
    d.add_argument("--json", action="store_true", help="findings as JSON")
    # The planner parses its own options (main() hands them over; `rlpost plan --help` lists them):
    # importing it here would load torch (it reads the algorithms' traits) before any command's
    # config is checked.
    sub.add_parser("plan", help="estimate memory and step time (vs a measured run with --from); rlpost plan --help")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # SIGTERM outside the training loop (start-up, evaluation) stops like Ctrl-C: one line, and the
    # run folder's failed-start clean-up (observe/runfolder.py). The loop sets its own (guard.py).
    main_thread = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        if argv[:1] == ["plan"]:
            from rlpost.observe import planner

            return planner.main(argv[1:])
        args = _parser().parse_args(argv)
        commands = {"train": cmd_train, "eval": cmd_eval, "report": cmd_report, "doctor": cmd_doctor,
                    "sft": cmd_offline, "dpo": cmd_offline, "rm": cmd_offline, "pipeline": cmd_pipeline}
        return commands[args.command](args)
    except (config.ConfigError, ModelLoadError) as e:
        return _fail(str(e), EXIT_BAD_INPUT)
    except RunError as e:
        return _fail(str(e), 1)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (Interrupted)
        signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        what = e.message if isinstance(e, Interrupted) and e.message else f"stopped by {signal.Signals(signum).name}"
        resume = " (`rlpost train --resume RUN_DIR` continues from the last checkpoint)" if argv[:1] == ["train"] else ""
        return _fail(what + resume, 128 + signum, prefix="\nrlpost: ")
    except (MemoryError, RuntimeError) as e:
        if not _out_of_memory(e):
            raise
        asked = re.search(r"allocate (\d+) bytes", str(e))
        first = f"tried to allocate {int(asked[1]) / 2**30:.1f} GiB" if asked else type(e).__name__
        return _fail(f"out of memory ({first}): the rollout batch (rollout.prompts_per_step x rollout.group_size "
                     "sequences of up to rollout.max_new_tokens tokens) or the model is too big for this machine; lower "
                     "them, or trainer.micro_batch_size", EXIT_BAD_INPUT)
    except OSError as e:  # a write or read the recipes did not expect to fail: name the path and the cause
        return _fail(f"{e.filename}: {e.strerror}" if e.filename and e.strerror else f"{type(e).__name__}: {e}", 1)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, old_term)


def _terminate(signum, frame):
    raise Interrupted(signum)


def _fail(message: str, code: int, prefix: str = "rlpost: error: ") -> int:
    print(f"{prefix}{message}", file=sys.stderr, flush=True)
    return code


def _out_of_memory(e: BaseException) -> bool:
    """MemoryError, torch's OutOfMemoryError (CUDA) or the CPU allocator's RuntimeError."""
    return isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or "can't allocate memory" in str(e)


# Each command imports its recipe when it runs, not at the top: the config is read and checked
# first, so a mistake in it is reported before torch and transformers load (seconds).


def cmd_train(args) -> int:
    recipe, overrides = _split(args.args)
    if args.resume:
        return _resume(args, recipe, overrides)
    if args.start_over:
        raise config.ConfigError("--start-over: only with --resume RUN_DIR")
    cfg = config.load(recipe, overrides)  # before torch loads: a mistake shows in a fraction of a second
    from rlpost import build
    from rlpost.recipes.rl import train

    build.check(cfg)
    name = cfg.run.name or f"{cfg.task.name}-{cfg.algo.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(cfg.run.out_dir) / name
    with runfolder.claim(run_dir, "new", f"use --resume {run_dir}, or another run.name") as rf:
        rf.write_config(cfg)
        say(f"run folder {run_dir}")
        train(cfg, run_dir)
    return 0


def _resume(args, recipe: str | None, overrides: list[str]) -> int:
    """Validate the whole resume (the folder, which changes are allowed, an intact checkpoint)
    before writing anything; then record the changed config as config.resume-N.yaml."""
    if recipe is not None:
        raise config.ConfigError(f"--resume takes overrides only, not a recipe ({recipe})")
    run_dir = Path(args.resume)
    with runfolder.claim(run_dir, "resume") as rf:
        current = config.run_config_path(run_dir)
        cfg = config.load(current, overrides)
        changes = config.resume_changes(config.load(current), cfg)
        from rlpost import build
        from rlpost.model import checkpoint
        from rlpost.recipes.rl import train

        build.check(cfg)
        ckpt = checkpoint.newest_intact(run_dir)
        if ckpt is None and not args.start_over:
            raise config.ConfigError(f"--resume {run_dir}: no intact checkpoint to resume from; add --start-over to "
                                     "train it again from step 0 (its metrics and samples are replaced)")
        if changes:
            say(f"resuming with {'; '.join(changes)} (recorded in {rf.write_config(cfg).name})")
        say(f"run folder {run_dir}: resuming from {ckpt.name if ckpt else 'step 0 (--start-over)'}")
        train(cfg, run_dir, resume=ckpt is not None)
    return 0


def cmd_eval(args) -> int:
    target = Path(args.target)  # the config first: its mistakes show before torch loads
    config.load(config.run_config_path(target) if (target / "config.yaml").exists() else None,
                args.args if (target / "config.yaml").exists() else [f"model.name={args.target}", *args.args])
    import torch

    from rlpost import build
    from rlpost.model import checkpoint
    from rlpost.recipes.evaluate import heldout_accuracy

    weights = None
    if (target / "config.yaml").exists():  # a run folder: its own config and newest intact weights
        cfg = build.check(config.load(config.run_config_path(target), args.args))
        found = checkpoint.load_latest(target)
        if found is None:
            raise config.ConfigError(f"{target}: run folder has no intact checkpoint yet")
        weights = found[1][0]
    else:
        cfg = build.check(config.load(None, [f"model.name={args.target}", *args.args]))
    torch.set_num_threads(cfg.run.threads or torch.get_num_threads())
    out = Path(args.out or (target / "eval_samples.jsonl" if weights is not None else "eval_samples.jsonl"))
    ks = sorted({int(k) for k in args.k.split(",") if k} or {1, max(1, args.samples)})
    if args.samples and max(ks) > args.samples:
        raise config.ConfigError(f"--k: every k must be <= --samples ({args.samples}), got {args.k}")
    acc, n, summary = heldout_accuracy(cfg, weights, args.n, samples=args.samples, ks=ks, dump=out)
    print(json.dumps({"target": str(args.target), "heldout_accuracy": acc, "n": n, **summary, "samples_file": str(out)}))
    return 0


def _run_folder(path: str) -> Path:
    run_dir = Path(path)
    if not (run_dir / "metrics.jsonl").exists():
        raise config.ConfigError(f"RUN_DIR {run_dir}: no metrics.jsonl there; is it a run folder?")
    return run_dir


def cmd_report(args) -> int:
    from rlpost.observe.report import write_report

    try:
        steps = [int(x) for x in args.steps.split(",")] if args.steps else None
    except ValueError:
        raise config.ConfigError(f"--steps: expected comma-separated step numbers, got {args.steps!r}") from None
    out = write_report(_run_folder(args.run_dir), args.out, steps)
    print(f"rlpost: report written to {out}", file=sys.stderr)
    return 0


def cmd_doctor(args) -> int:
    from rlpost.observe import diagnostics

    run_dir = _run_folder(args.run_dir)
    if args.json:
        print(json.dumps(diagnostics.as_dicts(diagnostics.doctor(run_dir)[0])))
    else:
        print(diagnostics.doctor_text(run_dir))
    return 0


def cmd_offline(args) -> int:
    recipe, overrides = _split(args.args)
    cfg = config.load(recipe, overrides)
    from rlpost.recipes.pipeline import train_stage

    run_dir = Path(cfg.run.out_dir) / (cfg.run.name or f"{args.command}-{time.strftime('%Y%m%d-%H%M%S')}")
    with runfolder.claim(run_dir, "new") as rf:
        rf.write_config(cfg)
        say(f"run folder {run_dir}")
        summary = train_stage(cfg, run_dir, args.command)
    print(json.dumps(summary))
    return 0


def cmd_pipeline(args) -> int:
    config.read_yaml(args.recipe)  # the file's own mistakes before torch loads (the stages are checked next)
    from rlpost.recipes.pipeline import run_pipeline

    run_pipeline(args.recipe)
    return 0


if __name__ == "__main__":
    sys.exit(main())
