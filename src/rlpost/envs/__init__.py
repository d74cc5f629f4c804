"""Environments: each task family gives training rows, held-out rows and a verifier path.

A row is a dict with ``messages`` (chat messages ending with the user turn) and whatever the
verifier needs (``answer``, metadata). The verifier is named by import path so that it can run
in a separate worker process (envs/runner.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Task:
    train: list[dict]
    heldout: list[dict]
    verifier: str  # "module:function" with signature (completion: str, row: dict) -> (float, dict)


def build_task(cfg) -> Task:
    if cfg.task.name == "arithmetic":
        from rlpost.envs import arithmetic

        train, heldout = arithmetic.build_splits(cfg.task)
        task = Task(train, heldout, cfg.task.verifier or "rlpost.envs.arithmetic:score")
    else:
        raise ValueError(f"unknown task {cfg.task.name!r}")
    check_verifier(task.verifier)
    return task


def check_verifier(path: str) -> None:
    """Import the verifier once in this process, so a typo stops the run before any work."""
    from rlpost.config import ConfigError
    from rlpost.envs.worker import import_function

    try:
        fn = import_function(path)
    except Exception as e:  # noqa: BLE001 - any import failure of user code is a config error
        raise ConfigError(f"task.verifier: cannot import {path!r} ({type(e).__name__}: {e})") from None
    if not callable(fn):
        raise ConfigError(f"task.verifier: {path!r} is not a function")
