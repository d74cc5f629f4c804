"""Env / verifier role: turn completions into rewards without ever crashing the step.

Verifiers are pure functions ``fn(completion: str, row: dict) -> (reward: float, info: dict)``
named by import path ("package.module:function"). They run in a separate worker process, one
call at a time, each with a deadline. A verifier that raises scores 0 and counts in
``verifier/errors``; one that hangs past the deadline is killed with its process, scores 0,
counts in ``verifier/timeouts``, and a fresh worker takes the remaining completions. A process
(not a thread) is what makes "hangs" recoverable: a Python thread cannot be killed.

The worker imports only the verifier's module, so it starts in ~50 ms, not the seconds that
importing torch would take.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

import torch

from rlpost.rewards.worker import _recv, _send, import_function
from rlpost.types.batch import Rollouts


class VerifierRunner:
    """Scores a batch through a worker process with a per-call timeout."""

    def __init__(self, fn_path: str, timeout_s: float):
        import_function(fn_path)  # fail now, in the parent, with a clear message, if it is wrong
        self.fn_path, self.timeout_s = fn_path, timeout_s
        self.proc: subprocess.Popen | None = None
        self.fresh = True  # a fresh worker's first call also imports the verifier's module

    # Importing a verifier's module can take seconds (reasoning-gym ~1 s, math-verify ~0.5 s, more
    # on a loaded machine); that is start-up, not the verifier hanging, so a fresh worker's first
    # call gets this much extra time.
    IMPORT_GRACE_S = 20.0

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        return subprocess.Popen(
            [sys.executable, "-c", "from rlpost.rewards.worker import serve; serve()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True,
        )

    def _kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def score_one(self, completion: str, row: dict) -> tuple[float, dict, str]:
        """(reward, info, status) with status in {'ok', 'error', 'timeout'}."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc, self.fresh = self._start(), True
        try:
            _send(self.proc.stdin, (self.fn_path, completion, row))
            grace, self.fresh = self.IMPORT_GRACE_S if self.fresh else 0.0, False
            ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout_s + grace)
            if not ready:
                self._kill()
                return 0.0, {"timeout": True}, "timeout"
            reply = _recv(self.proc.stdout)
        except (EOFError, BrokenPipeError, OSError):  # the verifier killed its own worker
            self._kill()
            return 0.0, {"error": "verifier process died"}, "error"
        if reply[0] == "error":
            return 0.0, {"error": reply[1]}, "error"
        return reply[1], reply[2], "ok"

    def score(self, batch: Rollouts) -> tuple[torch.Tensor, list[dict], dict]:
        """Rewards (B,) float32, infos, and metrics for the batch."""
        t0 = time.perf_counter()
        rewards, infos, counts = [], [], {"ok": 0, "error": 0, "timeout": 0}
        for completion, row in zip(batch.completions, batch.rows):
            reward, info, status = self.score_one(completion, row)
            rewards.append(reward)
            infos.append(info)
            counts[status] += 1
        metrics = {
            "verifier/errors": counts["error"],
            "verifier/timeouts": counts["timeout"],
            "timing_s/verifier_per_call": (time.perf_counter() - t0) / max(1, len(rewards)),
        }
        return torch.tensor(rewards, dtype=torch.float32), infos, metrics

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        self.proc = None
