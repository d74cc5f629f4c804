"""rlpost command line.

  rlpost train [RECIPE.yaml] [section.key=value ...]   train (no recipe = the demo defaults)
  rlpost train --resume RUN_DIR [section.key=value ...] continue a run from its last checkpoint
  rlpost eval MODEL_OR_RUN_DIR [--n N] [section.key=value ...]   greedy held-out accuracy
  rlpost eval SUITE.yaml [--model M] [--against RESULTS.json|MODEL] [--out FILE]   several sets, regressions
  rlpost curate DATA [--k K] [--keep LO-HI] [--out DIR] [key=value ...]   rows in the pass-rate band, deduplicated
  rlpost serve MODEL [--port P] [--max-tokens N]   an OpenAI-compatible endpoint on 127.0.0.1; Ctrl-C stops
  rlpost prm [DATA] --out DIR [--outcome] [key=value ...]   a process (or outcome) reward model: labelled steps or MC
  rlpost search --prm DIR [--orm DIR] [--n N] [--methods M,...] [key=value ...]   best-of-N, weighted majority, beam
  rlpost sft | rsft | dpo | rm [RECIPE.yaml] [section.key=value ...]   supervised, rejection-sampling, preference,
                                                                       RM training
  rlpost pipeline PIPELINE.yaml [section.key=value ...] SFT -> (RM) -> DPO -> RL, one table at the end
  rlpost export RUN_DIR [--step N] [--out DIR] [--merge-lora] [--dtype D]   a checkpoint as a transformers folder
  rlpost report RUN_DIR [--out FILE]                    self-contained HTML report with plots
  rlpost doctor RUN_DIR                                 training-health findings and the knob for each
  rlpost plan [--model M | --params 7B | --from RUN_DIR] ...   memory and step-time estimate

Bad input (config, model path, data file, a run folder in use) ends with one line on stderr
naming what is wrong and exit status 2, never a traceback; so does a batch too big for memory. A
run stopped by what it cannot go on from (a full disk, a read-only folder, non-finite training, a
reward function that keeps failing) ends with one line and exit status 1, its saved data intact.
SIGINT, SIGTERM and SIGHUP end with one line and 130 / 143 / 129 (during training: after saving the
current step), SIGQUIT with one line and 131 at once; SIGUSR1 prints where the run is and it goes on
(recipes/guard.py). A training run that finished but trained nothing (no step changed the policy:
every group filtered out, every reward equal, every optimizer step non-finite) writes its folder
as any run, RUN/model the unchanged policy, says why in its last line, and exits with 0: it ran
as asked; summary.json's steps_trained is 0 (recipes/idle.py).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from rlpost import config, config_check, machine, names, runconfig
from rlpost.config_check import refuse_ignored
from rlpost.console import Parser, say, stdout_gone
from rlpost.model.layout import candidates
from rlpost.observe import runfolder
from rlpost.recipes import curate, eval_args, offline_args, round_state, search_args, serve, suite
from rlpost.recipes.guard import SIGNALS, startup_signals
from rlpost.recipes.suite import eval_table
from rlpost.types import folders
from rlpost.types.errors import Interrupted, ModelLoadError, RunError, interrupt_in

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


def version() -> str:
    try:
        return importlib.metadata.version("rlpost")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def recipe_keys(recipe: str | None, overrides: list[str]) -> list[str]:
    """The dotted keys the user set: the recipe's and the overrides'."""
    tree = config.read_yaml(recipe) if recipe else {}
    keys = [f"{sec}.{k}" for sec, fields in tree.items() if isinstance(fields, dict) for k in fields]
    return keys + [o.split("=", 1)[0] for o in overrides]


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="rlpost", description="RL post-training of language models.")
    p.add_argument("--version", action="version", version=f"rlpost {version()}")
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
    eval_args.add_parser(sub, options)
    curate.add_parser(sub, options)
    serve.add_parser(sub, options)
    search_args.add_parsers(sub, options)
    offline_args.add_parsers(sub, options)
    pl = sub.add_parser("pipeline", help="SFT -> (RM) -> DPO -> RL from one recipe, with a stage table")
    pl.add_argument("recipe", metavar="PIPELINE.yaml")
    pl.add_argument("args", nargs="*", metavar="key=value",
                    help="dotted overrides added to the recipe's base (every stage)")
    x = sub.add_parser("export",
                       help="write a run's checkpoint as a transformers folder (vLLM, llama.cpp, from_pretrained)",
                       description="Write a checkpoint of RUN_DIR as a transformers folder: config, generation config, "
                                   "tokenizer with its chat template, safetensors. Every run already ends with "
                                   "RUN_DIR/model.")
    x.add_argument("run_dir", metavar="RUN_DIR")
    x.add_argument("--step", type=int, help="the checkpoint of this step (default: the latest)")
    x.add_argument("--out", metavar="DIR",
                   help="where to write (default RUN_DIR/model, RUN_DIR/model_step_N with --step)")
    x.add_argument("--merge-lora", action="store_true",
                   help="LoRA runs: fold the adapters into a full model (default for LoRA: the peft adapter folder "
                        "alone)")
    x.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="the weights' dtype in the folder (default float32, the trainer's master weights; bfloat16 "
                        "halves it)")
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
    as_program = argv is None  # the rlpost command (or python -m rlpost), not a call from Python
    argv = sys.argv[1:] if argv is None else argv
    try:
        # Outside the training loop (start-up, evaluation, offline recipes) a stop signal stops like
        # Ctrl-C: one line, and the run folder's failed-start clean-up (observe/runfolder.py). The
        # loop sets its own, and the table of what each signal does is guard.py's.
        with startup_signals():
            try:
                return _dispatch(argv)
            except Exception as e:  # a stop signal that a library wrapped (transformers' lazy import, torch.save)
                stop = interrupt_in(e)
                if stop is None:
                    raise
                raise stop from None
    except (config.ConfigError, ModelLoadError) as e:
        return _fail(str(e), EXIT_BAD_INPUT)
    except RunError as e:
        return _fail(str(e), 1)
    except KeyboardInterrupt as e:  # Ctrl-C, or another stop signal (Interrupted)
        signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        what = e.message if isinstance(e, Interrupted) and e.message else f"stopped by {signal.Signals(signum).name}"
        resume = resume_hint(e, argv[0]) if argv[:1] in (["train"], ["sft"], ["rsft"], ["dpo"], ["rm"]) else ""
        if isinstance(e, Interrupted) and e.saved is not None:  # steps are logged: their plots can be read now
            run_dir = getattr(e, "run_dir", None) or "RUN_DIR"
            resume += f"; `rlpost report {run_dir}` writes the report of the steps so far"
        if as_program and threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:  # stopped and saved: a second Ctrl-C while Python exits changes nothing
                signal.signal(sig, signal.SIG_IGN)
        return _fail(what + resume, 128 + signum, prefix="\nrlpost: ")
    except (MemoryError, RuntimeError) as e:
        if not _out_of_memory(e):
            raise
        asked = re.search(r"allocate (\d+) bytes", str(e))
        first = f"tried to allocate {int(asked[1]) / 2**30:.1f} GiB" if asked else type(e).__name__
        return _fail(f"out of memory ({first}): the rollout batch (rollout.prompts_per_step x rollout.group_size "
                     "sequences of up to rollout.max_new_tokens tokens) or the model is too big for this machine; "
                     "lower them, or trainer.micro_batch_size", EXIT_BAD_INPUT)
    except BrokenPipeError as e:  # `rlpost plan | head -1`: the reader has what it wanted, as with any Unix filter
        if stdout_gone():
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit would fail again
            return 0
        return _fail(f"{type(e).__name__}: {e}", 1)  # another pipe (a worker's): not the reader's choice
    except OSError as e:  # a write or read the recipes did not expect to fail: name the path and the cause
        return _fail(f"{e.filename}: {e.strerror}" if e.filename and e.strerror else f"{type(e).__name__}: {e}", 1)


def resume_hint(stop: KeyboardInterrupt, command: str = "train") -> str:
    """What a stopped `rlpost train` (or sft, rsft, dpo, rm) says of resuming: the command only where its run
    folder (``_names_run``) holds a checkpoint, or for a run in rounds its rounds.json (recipes/round_state.py);
    a start stopped before its first one left no folder."""
    run_dir = getattr(stop, "run_dir", None)
    if run_dir is None:  # stopped before a run folder was named
        return ""
    if candidates(run_dir, quiet=True) or (run_dir / round_state.STATE).is_file():
        return f" (`rlpost {command} --resume {run_dir}` continues from the last checkpoint)"
    return ("; nothing was saved, and no run folder is left" if not run_dir.exists()
            else f"; {run_dir} holds no checkpoint yet to resume from")


@contextmanager
def _names_run(run_dir: Path):
    """A stop signal inside names the run folder it stopped (``resume_hint``)."""
    try:
        yield
    except BaseException as e:
        stop = interrupt_in(e)
        if stop is not None:
            stop.run_dir = run_dir
        raise


def _dispatch(argv: list[str]) -> int:
    if argv[:1] == ["plan"]:
        from rlpost.observe import planner

        return planner.main(plan_arguments(argv[1:]))
    if argv[:1] == ["eval"] and suite.is_suite(argv[1:]):  # rlpost eval SUITE.yaml: its own options
        return suite.main(argv[1:], evaluation)
    parser = build_parser()
    # Overrides may come after options too (`rlpost eval RUN --n 50 run.threads=1`): argparse gives
    # the key=value words it did not place back, and they join the command's overrides.
    args, extra = parser.parse_known_args(argv)
    foreign_flag(extra, argv)  # `--learning_rate 1e-6` (TRL, OpenRLHF): the rlpost key to use, not a usage line
    if extra and (not hasattr(args, "args") or any("=" not in a or a.startswith("-") for a in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.args = [*args.args, *extra]
    commands = {"train": cmd_train, "eval": cmd_eval, "report": cmd_report, "doctor": cmd_doctor,
                "sft": cmd_offline, "rsft": cmd_offline, "dpo": cmd_offline, "rm": cmd_offline,
                "pipeline": cmd_pipeline, "export": cmd_export,
                "curate": lambda a: curate.main(a, evaluation, refuse_ignored),
                "serve": lambda a: serve.main(a, serving),
                "prm": lambda a: search_args.prm_main(a, searching, refuse_ignored),
                "search": lambda a: search_args.search_main(a, searching, refuse_ignored)}
    return commands[args.command](args)


# `rlpost plan` asked a GPU question: the GPU it names when only --gpus N > 1 is given, and the
# workload of rows of your own (rollout.max_new_tokens' 256 new tokens, a GSM8K-sized prompt)
# rather than the CPU demo's 47 + 16 tokens, each length unless it is given.
PLAN_GPU = "h100"
PLAN_GPU_LENGTHS = {"--prompt-len": "128", "--new-tokens": "256"}


def plan_arguments(args: list[str]) -> list[str]:
    """`rlpost plan`'s arguments with the defaults of a GPU question filled in, each said in one line."""
    given = {a.split("=")[0] for a in args if a.startswith("--")}
    if "--from" in given or "-h" in given or "--help" in given:
        return args
    flags = dict(zip(args, args[1:]))
    device = flags.get("--gpu") or flags.get("--device") or next((a.split("=", 1)[1] for a in args
                                                                  if a.startswith(("--gpu=", "--device="))), "cpu")
    gpus = flags.get("--gpus") or next((a.split("=", 1)[1] for a in args if a.startswith("--gpus=")), "1")
    if not ({"--gpu", "--device"} & given) and gpus.isdigit() and int(gpus) > 1:
        say(f"plan: --gpus {gpus} without --gpu: planning for {PLAN_GPU} (--gpu names another)")
        args, device = [*args, "--gpu", PLAN_GPU], PLAN_GPU
    missing = {flag: n for flag, n in PLAN_GPU_LENGTHS.items() if flag not in given}  # each default on its own
    if not device.startswith("cpu") and missing:
        words = {"--prompt-len": "prompt {}", "--new-tokens": "{} new tokens (rollout.max_new_tokens for task.data)"}
        kept = "".join(f", {flag} as given" for flag in PLAN_GPU_LENGTHS if flag not in missing)
        say(f"plan: a GPU workload of your own rows: {' + '.join(words[f].format(n) for f, n in missing.items())} "
            f"by default ({' and '.join(missing)} to change){kept}")
        args = [*args, *(x for item in missing.items() for x in item)]
    return args


def foreign_flag(unknown: list[str], argv: list[str]) -> None:
    """A ConfigError naming the rlpost key for another framework's command-line flag (names.py),
    among the arguments the parser did not know."""
    for arg in unknown:
        flag, _, value = arg.partition("=")
        if flag.startswith("--") and names.find(flag):
            i = argv.index(arg)
            value = value or (argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else None)
            raise config.ConfigError(f"{flag}: not an rlpost option; rlpost takes "
                                     f"section.key=value{names.hint(flag, value)}")


def _fail(message: str, code: int, prefix: str = "rlpost: error: ") -> int:
    # several problems found at once (config_check.py): each its own line, each with the prefix
    print("\n".join(f"{prefix}{line}" for line in message.split("\n")), file=sys.stderr, flush=True)
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
    refuse_ignored("train", recipe_keys(recipe, overrides))
    cfg = config_check.load(recipe, overrides)  # before torch loads: every mistake, in a fraction of a second
    name = (cfg.run.name
            or f"{'mix' if cfg.task.mix else cfg.task.name}-{cfg.algo.name.rpartition(':')[2]}-"
               f"{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir = folders.run_path(cfg.run.out_dir, name)
    hint = f"use --resume {run_dir}, or another run.name"
    runfolder.check_new(run_dir, hint, "run.name")
    from rlpost import build
    from rlpost.envs import build_task
    from rlpost.recipes.rl import train

    with _names_run(run_dir):
        build.check(cfg)
        task = build_task(cfg.task)
        build.preflight(cfg, task)  # the model's limits (LoRA targets, prompt lengths), before the folder exists
        with runfolder.claim(run_dir, "new", hint) as rf:
            rf.write_config(cfg)
            say(f"run folder {run_dir}")
            train(cfg, run_dir, task=task)
    return 0


def _resume(args, recipe: str | None, overrides: list[str]) -> int:
    """Validate the whole resume before writing anything (recipes/resume.py); the config first,
    before torch loads."""
    if recipe is not None:
        raise config.ConfigError(f"--resume takes overrides only, not a recipe ({recipe})")
    run_dir = Path(args.resume)
    refuse_ignored("train", [o.split("=", 1)[0] for o in overrides])
    runfolder.check_resume(run_dir)
    old, cfg = runconfig.load_run(run_dir, overrides)
    config.resume_changes(old, cfg)
    machine.check(cfg)
    from rlpost.recipes.resume import resume_run

    with _names_run(run_dir):
        resume_run(run_dir, overrides, args.start_over)
    return 0


def cmd_eval(args) -> int:
    refuse_ignored("eval", [a.split("=", 1)[0] for a in args.args])
    ks = eval_args.eval_ks(args)
    target = Path(args.target)  # the config first: its mistakes show before torch loads
    run = (target / "config.yaml").exists()
    cfg = machine.check(runconfig.load_run(target, args.args)[1] if run else
                        config.load(None, [f"model.name={args.target}", *args.args]))
    out, first = eval_args.samples_file(args, target if run else Path("."))
    import torch

    from rlpost import build
    from rlpost.model import checkpoint
    from rlpost.recipes.evaluate import heldout_accuracy, numbered, publish
    from rlpost.recipes.resume import importable

    weights = None
    if run:  # a run folder: its own config and newest intact weights
        importable(target)
        found = checkpoint.load_latest(target)
        if found is None:
            raise config.ConfigError(f"{target}: run folder has no intact checkpoint yet")
        weights = found[1][0]
    build.check(cfg)
    torch.set_num_threads(cfg.run.threads or torch.get_num_threads())
    # written under a name of its own, then published under `out` (or the next free number when another eval took
    # it meanwhile: recipes/evaluate.py)
    # (the thread in the name too: two evals in one process, through the Python API, must not share it)
    tmp = numbered(out, first).with_name(f".{numbered(out, first).name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        acc, n, summary = heldout_accuracy(cfg, weights, args.n, samples=args.samples, ks=ks, dump=tmp)
        out = publish(tmp, out, replace=args.overwrite, first=first)
    except RunError as e:  # a full disk: named as the file this eval writes
        raise RunError(str(e).replace(str(tmp), str(numbered(out, first)))) from None
    finally:
        tmp.unlink(missing_ok=True)
    result = {"target": str(args.target), "heldout_accuracy": acc, "n": n, **summary, "samples_file": str(out)}
    print(json.dumps(result) if args.json or not sys.stdout.isatty() else eval_table(result))
    return 0


def searching(name: str):
    """recipes/test_time.py's body of `rlpost prm` or `rlpost search`: torch loads once their configs passed."""
    from rlpost.recipes import test_time

    return {"prm": test_time.train_scorer, "search": test_time.search}[name]


def serving(*args) -> int:
    """recipes/serving.py's body of `rlpost serve`: torch loads once its arguments passed."""
    from rlpost.recipes import serving as body

    return body.serve(*args)


def evaluation(name: str):
    """recipes/evaluate.py's function `name` (or observe/report.py's write_report, which rebuilds a run's report), for
    curate and eval SUITE: torch loads once their configs passed."""
    if name == "write_report":
        from rlpost.observe.report import write_report

        return write_report
    from rlpost.recipes import evaluate

    return getattr(evaluate, name)


def _run_folder(path: str) -> Path:
    run_dir = Path(path)
    if not (run_dir / "metrics.jsonl").exists():
        raise config.ConfigError(f"RUN_DIR {run_dir}: no metrics.jsonl there; is it a run folder?")
    return run_dir


def cmd_report(args) -> int:
    from rlpost.observe.report import write_report

    try:
        steps = [int(x) for x in args.steps.split(",") if x.strip()] if args.steps else None
    except ValueError:
        raise config.ConfigError(f"--steps: expected comma-separated step numbers, got {args.steps!r}") from None
    if steps is not None and (not steps or min(steps) < 1):
        raise config.ConfigError(f"--steps: expected comma-separated step numbers >= 1, got {args.steps!r}")
    run_dir = _run_folder(args.run_dir)
    if args.out:
        folders.check_file(Path(args.out), "report", "--out")  # a new file, or a report: never a run's other files
    out = write_report(run_dir, args.out, steps)
    print(f"rlpost: report written to {out}", file=sys.stderr)
    return 0


def cmd_doctor(args) -> int:
    from rlpost.observe import diagnostics

    run_dir = _run_folder(args.run_dir)
    if args.json:  # the findings as JSON on stdout; what is wrong with the folder's files on stderr, a line each
        print(json.dumps(diagnostics.as_dicts(diagnostics.doctor(run_dir)[0])))
        for problem in diagnostics.folder_problems(run_dir):
            say(f"run folder: {problem}")
    else:
        print(diagnostics.doctor_text(run_dir))
    return 0


def cmd_offline(args) -> int:
    recipe, overrides = _split(args.args)
    keys = [o.split("=", 1)[0] for o in overrides] if args.resume else recipe_keys(recipe, overrides)
    return offline_args.main(args, recipe, overrides, keys, _names_run, offline_training)


def offline_training(name: str):
    """For offline_args (sft, rsft, dpo, rm): recipes/offline.py's ``preflight``, recipes/pipeline.py's
    ``train_stage`` and ``resume_point``; torch loads once their configs passed."""
    from rlpost.recipes import offline, pipeline

    return {"preflight": offline.preflight, "train_stage": pipeline.train_stage,
            "resume_point": pipeline.resume_point}[name]


def cmd_pipeline(args) -> int:
    config.read_yaml(args.recipe)  # the file's own mistakes before torch loads (the stages are checked next)
    from rlpost.recipes.pipeline import run_pipeline

    run_pipeline(args.recipe, args.args)
    return 0


def cmd_export(args) -> int:
    from rlpost.recipes.export import export_run

    final = Path(args.run_dir) / "model"
    there = (final / "config.json").is_file()  # the run ended with it: asked for nothing else, nothing is written
    out = export_run(args.run_dir, args.step, args.out, args.merge_lora, args.dtype)
    kept = there and not args.out and args.step is None and Path(out).resolve() == final.resolve()
    done = "is there already (the run ended with it)" if kept else "written"
    if (Path(out) / "adapter_config.json").is_file() and not (Path(out) / "config.json").is_file():
        how = ("peft's adapters alone: load them onto their base with peft's PeftModel.from_pretrained(base, "
               f"'{out}'); --merge-lora writes a model folder that model.name= and from_pretrained load")
    else:
        how = f"load it with model.name={out} or transformers' from_pretrained"
    print(f"rlpost: {out} {done}; {how}", file=sys.stderr)
    print(json.dumps({"run_dir": args.run_dir, "out": str(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
