"""``rlpost prm`` and ``rlpost search``: their options and every check of them, before torch loads
(a mistake costs a fraction of a second). The commands themselves are recipes/test_time.py's;
cli.py hands them over through ``run(name)`` once the config has passed, as curate's are.

``rlpost prm [DATA] [key=value ...] --out DIR`` trains a process reward model (or, ``--outcome``, an
outcome one) and writes a scorer folder. From DATA, step-labelled solutions (envs/step_data.py);
without DATA, from the task's training rows: ``--n`` solutions of each of ``--problems`` rows
sampled by the model, every step labelled by ``--m`` Monte-Carlo continuations (Math-Shepherd,
recipes/prm.py).

``rlpost search [key=value ...] --prm DIR [--orm DIR] --n N`` runs the selectors on the task's
held-out rows at one sampling budget, N samples a problem (docs/search.md has the methods).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rlpost import config, machine
from rlpost.types import folders
from rlpost.types.errors import ConfigError, writing

# method -> (what it is, the scorer it needs: "" none, "prm", "orm")
METHODS = {
    "greedy": ("one greedy completion (the 1-sample reference)", ""),
    "majority": ("the most common answer of the N samples (self-consistency)", ""),
    "orm-best": ("best-of-N by the outcome reward model", "orm"),
    "prm-best": ("best-of-N by the PRM's --aggregate of step scores", "prm"),
    "prm-last": ("best-of-N by the PRM's score of the last step", "prm"),
    "prm-weighted": ("majority weighted by the PRM's --aggregate (weighted majority)", "prm"),
    "beam": ("step-level beam search under the PRM, --beam-width beams of N / width proposals", "prm"),
}
AGGREGATES = ("min", "last", "prod")
FOLDER_KIND = "prm"  # what rlpost prm writes, for folders.check_folder


def add_parsers(sub, options: str) -> None:
    """The two commands' arguments (cli.py registers them here, as curate's)."""
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("prm", help="train a process (or outcome) reward model: step-labelled data or MC rollouts",
                       epilog=options, formatter_class=fmt,
                       description="Train a process reward model from DATA (JSONL rows of prompt, steps, labels: "
                                   "docs/search.md) or, without DATA, from Monte-Carlo rollouts of the task's training "
                                   "rows (Math-Shepherd); writes a scorer folder that rlpost search --prm reads.")
    p.add_argument("args", nargs="*", metavar="DATA|key=value", help="step-labelled data (optional), then overrides")
    p.add_argument("--out", required=True, help="the scorer folder to write (new or empty)")
    p.add_argument("--model", default="embedded", help="the trunk, and the sampler of MC rollouts (default embedded)")
    p.add_argument("--outcome", action="store_true", help="an outcome reward model: the final label only (an ORM)")
    p.add_argument("--problems", type=int, default=48, help="MC rollouts: training rows used (default 48)")
    p.add_argument("--n", type=int, default=4, help="MC rollouts: solutions sampled a problem (default 4)")
    p.add_argument("--m", type=int, default=4, help="MC rollouts: continuations that label a step (default 4)")
    p.add_argument("--epochs", type=int, default=2, help="passes over the solutions (default 2)")
    p.add_argument("--batch-size", type=int, default=16, help="solutions an optimizer step (default 16)")
    p.add_argument("--lr", type=float, default=1e-5, help="the trunk's learning rate (default 1e-5)")
    p.add_argument("--head-lr", type=float, default=1e-3, help="the head's learning rate (default 1e-3)")
    s = sub.add_parser("search", help="best-of-N / weighted majority / beam search with a PRM at one sampling budget",
                       epilog=options, formatter_class=fmt,
                       description="Every --methods on the task's held-out rows at N samples a problem; the N-sample "
                                   "selectors choose from the same samples (paired). Prints accuracy, tokens and "
                                   "samples per method and writes them as JSON.\nmethods:\n"
                                   + "\n".join(f"  {k:<13} {v[0]}" for k, v in METHODS.items()))
    s.add_argument("args", nargs="*", metavar="key=value", help="dotted overrides (the task, rollout.temperature, ...)")
    s.add_argument("--model", default="embedded", help="the model that samples (default embedded)")
    s.add_argument("--prm", default="", help="a scorer folder from rlpost prm (prm-*, beam)")
    s.add_argument("--orm", default="", help="a scorer folder from rlpost prm --outcome (orm-best)")
    s.add_argument("--methods", default="", help="comma-separated (default: every one the scorers given allow)")
    s.add_argument("--n", type=int, default=4, help="the budget: samples a problem (default 4)")
    s.add_argument("--problems", type=int, default=0, help="held-out problems (0 = all)")
    s.add_argument("--aggregate", default="min", choices=AGGREGATES, help="step scores -> a solution's (default min)")
    s.add_argument("--beam-width", type=int, default=2, help="beams kept; each expands N / width (default 2)")
    s.add_argument("--max-steps", type=int, default=4, help="beam search rounds (default 4)")
    s.add_argument("--max-step-tokens", type=int, default=12, help="tokens a beam step at most (default 12)")
    s.add_argument("--out", default="", help="results JSON (default ./search.json, numbered when it exists)")
    s.add_argument("--json", action="store_true", help="print the results as JSON (the default through a pipe)")


def split_data(args) -> tuple[str, list[str]]:
    """`rlpost prm`'s first word without '=' is DATA; the rest are overrides."""
    data = [a for a in args if "=" not in a]
    if len(data) > 1:
        raise ConfigError(f"rlpost prm: one DATA file at most, got {' '.join(data)}")
    return (data[0] if data else ""), [a for a in args if "=" in a]


def whole(flag: str, value: int, least: int) -> None:
    if value < least:
        raise ConfigError(f"{flag}: expected a whole number >= {least}, got {value}")


def methods(args) -> list[str]:
    """--methods checked against the scorers given; the default: all they allow."""
    have = {"": True, "prm": bool(args.prm), "orm": bool(args.orm)}
    asked = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not asked:
        return [m for m, (_, need) in METHODS.items() if have[need]]
    for m in asked:
        if m not in METHODS:
            raise ConfigError(f"--methods: unknown method {m!r}; expected some of {', '.join(METHODS)}")
        if not have[METHODS[m][1]]:
            raise ConfigError(f"--methods: {m} needs --{METHODS[m][1]} DIR (a scorer folder from rlpost prm"
                              f"{' --outcome' if METHODS[m][1] == 'orm' else ''})")
    return list(dict.fromkeys(asked))


KINDS = {"--prm": "process", "--orm": "outcome"}  # the scorer each flag takes, as prm.json's "kind" says


def scorer_folder(flag: str, path: str) -> None:
    """A folder rlpost prm wrote, of the kind the flag takes: its prm.json and value head are there."""
    if not path:
        return
    if not ((Path(path) / "prm.json").is_file() and (Path(path) / "value_head.safetensors").is_file()):
        raise ConfigError(f"{flag} {path}: not a scorer folder (no prm.json and value_head.safetensors there; "
                          "rlpost prm writes one)")
    try:
        kind = json.loads((Path(path) / "prm.json").read_text()).get("kind")
    except (OSError, ValueError, AttributeError):
        raise ConfigError(f"{flag} {path}: its prm.json does not read as rlpost prm's summary") from None
    if kind in KINDS.values() and kind != KINDS[flag]:
        other = next(f for f, k in KINDS.items() if k == kind)
        a = {"process": "a process", "outcome": "an outcome"}
        raise ConfigError(f"{flag} {path}: {a[kind]} reward model (prm.json: kind), which {other} takes; "
                          f"{flag} takes {a[KINDS[flag]]} one")


def load_config(command: str, model: str, overrides: list[str], refuse) -> config.Config:
    refuse(command, [a.split("=", 1)[0] for a in overrides])  # neither command reads the RL run's sections
    return machine.check(config.load(None, [f"model.name={model}", *overrides]))


def prm_main(args, run, refuse) -> int:
    """`rlpost prm`: checks, then run("prm") (recipes/test_time.py: train_scorer, which loads torch)."""
    data, overrides = split_data(args.args)
    for flag, value, least in (("--problems", args.problems, 1), ("--n", args.n, 1), ("--m", args.m, 1),
                               ("--epochs", args.epochs, 1), ("--batch-size", args.batch_size, 1)):
        whole(flag, value, least)
    for flag, value in (("--lr", args.lr), ("--head-lr", args.head_lr)):
        if not 0 < value <= 1:  # as trainer.lr: inf or 10 trains the scorer to NaN
            raise ConfigError(f"{flag}: expected a learning rate with 0 < lr <= 1, got {value}")
    if data and not Path(data).exists():
        raise ConfigError(f"DATA {data}: file not found")
    cfg = load_config("prm", args.model, overrides, refuse)
    folders.check_folder(Path(args.out), FOLDER_KIND, "--out")
    if (Path(args.out) / "prm.json").exists():  # a trained scorer is hours of work: never replaced unasked
        raise ConfigError(f"--out {args.out}: holds a scorer rlpost prm trained (prm.json); pick a new folder, or "
                          "remove that one first")
    summary = run("prm")(cfg, data, Path(args.out), args)
    print(json.dumps(summary))
    return 0


def search_main(args, run, refuse) -> int:
    """`rlpost search`: checks, then run("search") (recipes/test_time.py: search, which loads torch)."""
    whole("--n", args.n, 1)
    whole("--problems", args.problems, 0)
    for flag, value in (("--beam-width", args.beam_width), ("--max-steps", args.max_steps),
                        ("--max-step-tokens", args.max_step_tokens)):
        whole(flag, value, 1)
    chosen = methods(args)
    if "beam" in chosen and args.n % args.beam_width:
        raise ConfigError(f"--beam-width {args.beam_width}: must divide --n {args.n} (each beam expands n / width, "
                          "so a round proposes n steps: the budget of the N-sample methods)")
    scorer_folder("--prm", args.prm)
    scorer_folder("--orm", args.orm)
    cfg = load_config("search", args.model, args.args, refuse)
    out = Path(args.out) if args.out else next_free(Path("search.json"))
    check_out(out)
    result = {**run("search")(cfg, chosen, args), "out": str(out)}
    with writing(out):
        out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result) if args.json or not sys.stdout.isatty() else table(result))
    return 0


def check_out(out: Path) -> None:
    """--out: a new file in a folder this process can write, or the results of an earlier rlpost search
    (replaced); nothing else is overwritten. Said before the sampling, not after it."""
    if not out.exists():
        parent = out.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            why = ("does not exist" if not parent.exists() else "is not a folder" if not parent.is_dir()
                   else "is not writable")
            raise ConfigError(f"--out {out}: {parent} {why}, so the results could not be written there")
        return
    if not holds_results(out, {"methods", "n", "problems"}):
        raise ConfigError(f"--out: {out} exists and is not the results of rlpost search; pick another path")


def holds_results(path: Path, keys: set[str]) -> bool:
    """Whether ``path`` is a JSON file of a command's results, told by their top-level ``keys`` (what an --out may
    replace: rlpost search's, eval SUITE's)."""
    try:
        earlier = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        return False
    return isinstance(earlier, dict) and keys <= set(earlier)


def next_free(path: Path) -> Path:
    """``path``, or the first of path.2, path.3, ... (before the suffix) that does not exist."""
    i = 1
    while (out := path if i == 1 else path.with_name(f"{path.stem}.{i}{path.suffix}")).exists():
        i += 1
    return out


def table(result: dict) -> str:
    """The terminal's view: accuracy, the paired difference to majority, tokens and samples per method."""
    lines = [f"{'method':<16} {'accuracy':>8} {'± s.e.':>7} {'Δ vs majority':>14} {'tokens':>8} {'samples':>8}"]
    for name, r in result["methods"].items():
        delta = (f"{100 * r['delta_vs_majority']:+.1f} ± {100 * r['delta_se']:.1f}"
                 if "delta_vs_majority" in r else "")
        lines.append(f"{name:<16} {r['accuracy']:>8.3f} {r['se']:>7.3f} {delta:>14} {r['tokens']:>8.1f} "
                     f"{r['samples']:>8.1f}")
    lines.append(f"{result['problems']} problems, N = {result['n']}; results in {result.get('out', 'the JSON')}")
    return "\n".join(lines)
