"""Environment worker processes (envs/worker.py says why processes): the one worker pool
(workers.py) running the environment's calls, ``rows``, ``reset`` and ``step``. Calls go in with
``submit`` and come back from ``poll`` as they finish, so the rollout (roles/rollout_env.py)
decodes some episodes while the environment steps others.

Each call has a deadline (task.env_timeout_s): one past it comes back as ('timeout',); a worker
that dies or sends garbage gives ('died', why); a call the environment's code failed gives
('error', message, traceback). The first worker's import of the environment's module is the dry
start that turns a bad task.env into one line before any model loads. The workers' output (what
the environment prints, and every traceback) goes to the log.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rlpost.console import say
from rlpost.workers import WorkerPool


class EnvPool(WorkerPool):
    """Runs environment calls in worker processes, each with a deadline; never raises for what a call does."""

    # Importing an environment's module can take seconds (verifiers: ~10 s on a loaded 2-core
    # machine); that is start-up, given once per worker, never to a call.
    IMPORT_GRACE_S = 60.0

    def __init__(self, path: str, kwargs: dict, timeout_s: float, *, workers: int = 1, memory_mb: int = 0,
                 log_path: str | Path | None = None, import_paths: tuple = (), key: str = "task.env"):
        super().__init__("rlpost.envs.worker", path, timeout_s, what="environment worker", key=key, workers=workers,
                         memory_mb=memory_mb, log_path=log_path, grace_s=self.IMPORT_GRACE_S,
                         import_paths=(*map(str, import_paths), *(p for p in sys.path if p)),
                         args=(json.dumps(kwargs),))


def warn_once(reported: set, kind: str, path: str, text: str) -> None:
    """The first failure of each kind, printed once; the rest are counted (env/errors, env/timeouts)."""
    if kind not in reported:
        reported.add(kind)
        say(f"environment {path} failed (the first {kind}; later ones are only counted, in env/{kind}s): {text}")
