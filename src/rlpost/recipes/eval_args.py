"""``rlpost eval MODEL_OR_RUN_DIR``'s arguments: its parser, ``--k`` and ``--samples`` checked, and the
file its per-sample records go to. All of it before torch loads, so a mistake costs a fraction of a
second; cli.py's ``cmd_eval`` then loads the model and recipes/evaluate.py measures.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlpost import config
from rlpost.types import folders


def add_parser(sub, options: str) -> None:
    """`rlpost eval`'s arguments (cli.py keeps the command; its options are here, as curate's are)."""
    e = sub.add_parser("eval", help="held-out accuracy of a model or a run", epilog=options,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Greedy held-out accuracy on the task of the config (a run's own, or the defaults). "
                                   "Given a suite file instead (SUITE.yaml: several held-out sets), `rlpost eval "
                                   "SUITE.yaml` evaluates every set, with --model, --against RUN_OR_RESULTS.json "
                                   "(a regression table) and --judge MODEL; `rlpost eval SUITE.yaml --help` lists them "
                                   "(docs/data.md).")
    e.add_argument("target", metavar="MODEL_OR_RUN_DIR",
                   help="'embedded', 'tiny', a model folder, a hub id, or a run folder")
    e.add_argument("args", nargs="*", metavar="key=value", help="dotted overrides")
    e.add_argument("--n", type=int, default=0, help="held-out problems to use (0 = all)")
    e.add_argument("--samples", type=int, default=0,
                   help="also draw S samples per problem at rollout.temperature: pass@k, maj@k")
    e.add_argument("--k", default="", help="comma-separated k for pass@k and maj@k (default: 1 and S)")
    e.add_argument("--out", default="",
                   help="per-sample results (JSONL); default RUN_DIR/eval_samples.jsonl or ./eval_samples.jsonl, "
                        "numbered when it exists")
    e.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    e.add_argument("--json", action="store_true",
                   help="print the result as one JSON line (the default when stdout is not a terminal)")


def eval_ks(args) -> list[int]:
    """--k as numbers (default: 1 and --samples), each checked; --n and --samples too."""
    for flag, value in (("--n", args.n), ("--samples", args.samples)):
        if value < 0:
            raise config.ConfigError(f"{flag}: expected a whole number >= 0, got {value}")
    if args.k and not args.samples:
        raise config.ConfigError("--k: pass@k and maj@k need --samples S (S samples per problem); without it only "
                                 "greedy accuracy is measured")
    try:
        ks = sorted({int(k) for k in args.k.split(",") if k.strip()} or {1, max(1, args.samples)})
    except ValueError:
        raise config.ConfigError(f"--k: expected comma-separated whole numbers >= 1, got {args.k!r}") from None
    if ks[0] < 1 or (args.samples and ks[-1] > args.samples):
        raise config.ConfigError(f"--k: every k must be >= 1 and <= --samples ({args.samples}), got {args.k}")
    return ks


def samples_file(args, folder: Path) -> tuple[Path, int]:
    """Where eval writes its per-sample records, as (name, first number: evaluate.numbered); an
    existing file is never replaced silently: an explicit --out needs --overwrite, the default name
    gets the next free number (and the next again if another eval takes it first: evaluate.publish)."""
    if args.out:
        out = Path(args.out)
        if folders.check_file(out, "eval", "--out") and not args.overwrite:  # one rlpost eval wrote, else refused
            raise config.ConfigError(f"--out: {out} exists; pass --overwrite to replace it, or another --out")
        return out, 1
    out, i = folder / "eval_samples.jsonl", 1
    while out.exists() and not args.overwrite:
        i += 1
        out = folder / f"eval_samples.{i}.jsonl"
    return folder / "eval_samples.jsonl", i
