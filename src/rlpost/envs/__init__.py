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
        return Task(train, heldout, cfg.task.verifier or "rlpost.envs.arithmetic:score")
    raise ValueError(f"unknown task {cfg.task.name!r}")
