"""rlpost command line.

  rlpost train [RECIPE.yaml] [section.key=value ...]   train (no recipe = the demo defaults)
  rlpost train --resume RUN_DIR [section.key=value ...] continue a run from its last checkpoint
  rlpost eval MODEL_OR_RUN_DIR [--n N] [section.key=value ...]   greedy held-out accuracy
  rlpost sft | dpo | rm [RECIPE.yaml] [section.key=value ...]   supervised, preference, reward-model training
  rlpost pipeline PIPELINE.yaml                         SFT -> (RM) -> DPO -> RL, one table at the end
  rlpost report RUN_DIR [--out FILE]                    self-contained HTML report with plots
  rlpost doctor RUN_DIR                                 training-health findings and the knob for each
  rlpost plan [--model M | --params 7B | --from RUN_DIR] ...   memory and step-time estimate

Bad input (config, model path) ends with one line on stderr naming what is wrong and exit
status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rlpost import config
from rlpost.types.errors import ModelLoadError

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
    t.add_argument("--resume", metavar="RUN_DIR", help="continue RUN_DIR from its last checkpoint")
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
    if argv[:1] == ["plan"]:
        from rlpost.observe import planner

        return planner.main(argv[1:])
    args = _parser().parse_args(argv)
    try:
        commands = {"train": cmd_train, "eval": cmd_eval, "report": cmd_report, "doctor": cmd_doctor,
                    "sft": cmd_offline, "dpo": cmd_offline, "rm": cmd_offline, "pipeline": cmd_pipeline}
        return commands[args.command](args)
    except (config.ConfigError, ModelLoadError) as e:
        print(f"rlpost: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("\nrlpost: interrupted; `rlpost train --resume RUN_DIR` continues from the last checkpoint",
              file=sys.stderr)
        return 130


# Each command imports its recipe when it runs, not at the top: the config is read and checked
# first, so a mistake in it is reported before torch and transformers load (seconds).


def cmd_train(args) -> int:
    from rlpost import build
    from rlpost.recipes.rl import train

    recipe, overrides = _split(args.args)
    if args.resume:
        if recipe is not None:
            raise config.ConfigError(f"--resume takes overrides only, not a recipe ({recipe})")
        run_dir = Path(args.resume)
        if not (run_dir / "config.yaml").exists():
            raise config.ConfigError(f"--resume {run_dir}: no config.yaml there; is it a run folder?")
        cfg = build.check(config.load(run_dir / "config.yaml", overrides))
    else:
        cfg = build.check(config.load(recipe, overrides))
        name = cfg.run.name or f"{cfg.task.name}-{cfg.algo.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        run_dir = Path(cfg.run.out_dir) / name
        if (run_dir / "checkpoints").exists():
            raise config.ConfigError(f"run.name: {run_dir} already has checkpoints; use --resume {run_dir} or another name")
        run_dir.mkdir(parents=True, exist_ok=True)
    config.save(cfg, run_dir / "config.yaml")
    print(f"rlpost: run folder {run_dir}", file=sys.stderr)
    train(cfg, run_dir, resume=bool(args.resume))
    return 0


def cmd_eval(args) -> int:
    import torch

    from rlpost import build
    from rlpost.model import checkpoint
    from rlpost.recipes.evaluate import heldout_accuracy

    target = Path(args.target)
    weights = None
    if (target / "config.yaml").exists():  # a run folder: its own config and latest weights
        cfg = build.check(config.load(target / "config.yaml", args.args))
        ckpt = checkpoint.latest(target)
        if ckpt is None:
            raise config.ConfigError(f"{target}: run folder has no checkpoint yet")
        weights = checkpoint.load(ckpt)[0]
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
    from rlpost.recipes.pipeline import train_stage

    recipe, overrides = _split(args.args)
    cfg = config.load(recipe, overrides)
    run_dir = Path(cfg.run.out_dir) / (cfg.run.name or f"{args.command}-{time.strftime('%Y%m%d-%H%M%S')}")
    print(f"rlpost: run folder {run_dir}", file=sys.stderr)
    summary = train_stage(cfg, run_dir, args.command)
    print(json.dumps(summary))
    return 0


def cmd_pipeline(args) -> int:
    from rlpost.recipes.pipeline import run_pipeline

    run_pipeline(args.recipe)
    return 0


if __name__ == "__main__":
    sys.exit(main())
