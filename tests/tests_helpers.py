"""Small builders used by several test files."""

from dataclasses import replace

from rlpost.config import TrainerConfig


def tcfg(**kw) -> TrainerConfig:
    """Trainer config for exact-arithmetic tests: float32, no autocast."""
    return replace(TrainerConfig(autocast_bf16=False, lr=1e-3), **kw)
