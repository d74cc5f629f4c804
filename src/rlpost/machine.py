"""What this machine and rlpost's libraries accept, checked before any run folder exists (no torch).

``config.load`` checks each value against its own range; these checks need the machine (its
cores, its files), so every command that trains or evaluates calls ``check`` right after loading
its config:

- thread counts (``run.threads``, ``dist.rollout_threads``, ``dist.trainer_threads``) at most the
  cores this process may use: torch's OpenMP pool was seen to crash (SIGSEGV) at 100000;
- data paths (``task.data``, ``task.eval_data``, ``pref.data``, ``pref.eval_data``) are regular
  files or folders: a FIFO would block the run forever, ``/dev/zero`` would fill the memory.

The model's own limits (LoRA targets that exist, prompts that fit its context) need the model's
config and tokenizer: build.py's ``preflight`` checks those, also before the folder.
"""

from __future__ import annotations

import os

from rlpost.config import Config
from rlpost.sections import DistConfig
from rlpost.types.errors import ConfigError
from rlpost.types.folders import regular_file


def cores() -> int:
    """The CPU cores this process may run on (its affinity, which a container or taskset narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def threads(dist: DistConfig, cores: int) -> tuple[int, int]:
    """(torch threads of the trainer actor, of each rollout worker) on ``cores`` cores (distributed/topology.py
    gives them; the planner prices each actor's phases at them). Disaggregated phases take turns, so each gets
    every core; async ones run at once, so the cores are split."""
    if dist.topology == "async":
        trainer = dist.trainer_threads or max(1, cores // 2 // dist.trainer_ranks)
        return trainer, dist.rollout_threads or max(1, (cores - trainer * dist.trainer_ranks) // dist.rollout_workers)
    return (dist.trainer_threads or max(1, cores // dist.trainer_ranks),
            dist.rollout_threads or max(1, cores // dist.rollout_workers))


def check(cfg: Config) -> Config:
    """ConfigError naming the first key this machine cannot honour; returns cfg."""
    n = cores()
    for key, value in (("run.threads", cfg.run.threads), ("dist.rollout_threads", cfg.dist.rollout_threads),
                       ("dist.trainer_threads", cfg.dist.trainer_threads)):
        if value > n:
            raise ConfigError(f"{key}: expected at most {n} (the cores this process may use; 0 = all of them), got "
                              f"{value}")
    for key, path in (("task.data", cfg.task.data), ("task.eval_data", cfg.task.eval_data),
                      ("pref.data", cfg.pref.data), ("pref.eval_data", cfg.pref.eval_data)):
        if path:
            regular_file(path, key)
    return cfg
