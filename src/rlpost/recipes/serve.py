"""`rlpost serve MODEL`: the endpoint a run trains agents through (roles/endpoint.py), standalone over
a trained model, so any OpenAI-client harness can evaluate it. Its arguments and checks are here
(no torch: a bad port or folder is one line before the model loads); the body is recipes/serving.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlpost.types.errors import ConfigError


def add_parser(sub, options: str) -> None:
    """`rlpost serve`'s arguments (cli.py keeps its own commands; this one's are here)."""
    s = sub.add_parser("serve", help="serve a model on an OpenAI-compatible endpoint (127.0.0.1)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="/v1/chat/completions and /v1/completions over rlpost's sampler, on 127.0.0.1; "
                                   "prints one line with the base URL; Ctrl-C stops it.")
    s.add_argument("model", metavar="MODEL", help="RUN/model, a run folder (its model/), a model folder, 'embedded' "
                                                  "or 'tiny'")
    s.add_argument("--port", type=int, default=8000, help="the port on 127.0.0.1 (default 8000; 0: a free one)")
    s.add_argument("--max-tokens", type=int, default=512, help="the most tokens one request may draw (default 512)")
    s.add_argument("--name", default="", help="the model's name in responses (default MODEL)")


def target(model: str) -> str:
    """What to load: a run folder means its exported model/."""
    folder = Path(model)
    if folder.is_dir() and not (folder / "config.json").exists() and (folder / "model" / "config.json").exists():
        return str(folder / "model")
    return model


def main(args, serving) -> int:
    """`rlpost serve`: the arguments checked, then serving(...) (recipes/serving.py, through cli.py: it loads torch)."""
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port}: expected 0..65535 (0: a free one)")
    if args.max_tokens < 1:
        raise ConfigError(f"--max-tokens {args.max_tokens}: expected a whole number >= 1")
    model = target(args.model)
    return serving(model, args.port, args.max_tokens, args.name or args.model)
