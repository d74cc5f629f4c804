"""Env / verifier role: turn completions into rewards without ever crashing, hanging or poisoning a step.

A reward function (verifier style, verl's ``compute_score`` or TRL style: rewards/worker.py) is
named by import path and runs in worker processes, never in the trainer's: the trainer never
imports the user's module. ``VerifierRunner`` keeps up to ``workers`` of them (the one worker pool,
workers.py, which owns every rule of starting, timing, killing and restarting) and scores a batch's
completions in parallel, each call with a deadline; a TRL-style function gets the whole batch in
one call (its deadline: the per-call one times the batch size).

Failures are loud but never fatal to the step. A call that raises, kills its worker, returns a
non-number, NaN/inf or a number float32 holds as inf scores 0 and counts in ``verifier/errors`` (and
``verifier/<name>/errors``); one that runs past its deadline is killed with everything it started
(workers.py), scores 0 and counts in ``verifier/timeouts``; a fresh worker takes over. The
first failure of each function is printed once: with its traceback where the function raised (every
traceback goes to the worker log), as one line where rlpost's checks refused what it returned.
Whether a run may go on with that many failures is the loop's call (recipes/guard.py,
``task.max_reward_error_frac``).

A worker's start-up (importing, say, reasoning-gym) gets IMPORT_GRACE_S once, when the worker
starts; a call never does. The first worker starts when the runner is built: that is the dry call
that finds an import error before training and turns it into one ConfigError line.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import torch

from rlpost.console import say, say_once
from rlpost.rewards import worker as w
from rlpost.sandbox.slots import SLOT_UID_BASE
from rlpost.types.batch import Rollouts
from rlpost.workers import WorkerPool


def safe_import_paths(paths: list[str]) -> tuple[list[str], dict[str, str]]:
    """(the paths a worker may import from, {refused path: why}). A path is refused when a uid
    that is neither ours nor root's could put a file in it, or swap it: it, or a folder above it
    without the sticky bit, is writable by every user, or it belongs to a sandbox's uid. That is
    what a sandboxed program (another uid, under rlimits as root) can write; bubblewrap's can
    write no host path at all, and under rlimits as a user the program has our uid anyway."""
    kept, refused = [], {}
    for path in dict.fromkeys(os.path.abspath(p) for p in paths):
        why = _others_can_write(path)
        if why:
            refused[path] = why
        else:
            kept.append(path)
    return kept, refused


def _others_can_write(path: str) -> str:
    node, leaf = os.path.realpath(path), True
    while not os.path.exists(node) and node != "/":  # a folder not made yet: whoever can make it decides
        node = os.path.dirname(node)
    while True:
        try:
            st = os.stat(node)
        except OSError:
            return f"{node} cannot be checked"
        if st.st_uid >= SLOT_UID_BASE or st.st_uid == 65534:
            return f"{node} belongs to uid {st.st_uid}"
        if st.st_mode & stat.S_IWOTH and (leaf or not st.st_mode & stat.S_ISVTX):
            return f"{node} is writable by every user"
        if node == "/":
            return ""
        node, leaf = os.path.dirname(node), False


def extra_metrics(infos: list[dict], numbers: bool = True) -> dict:
    """reward_extra/<key>: the mean of each number (or bool) a verl ``compute_score`` returned beside
    its 'score' (verl's reward_extra_info, e.g. {'score': 1.0, 'acc': True}), over the completions
    that have it. A verifier-style function's info dict holds parsed answers too, which no mean
    describes (``numbers=False``): only its bools are kept, as shares ('correct', 'parsed',
    'whole_chain', 'format': the format health the report plots). The runner's own ``timeout`` flag
    (``_result``) is left out: ``verifier/timeouts`` counts it."""
    values: dict[str, list[float]] = {}
    kinds = (bool, int, float) if numbers else (bool,)
    for info in infos:
        for key, v in info.items():
            if isinstance(v, kinds) and key not in ("timeout",):
                values.setdefault(key, []).append(float(v))
    return {f"reward_extra/{key}": sum(vs) / len(vs) for key, vs in values.items()}


# What reward functions print goes to the run's verifier.log (worker.py: fd 1 and 2 never reach the
# trainer's pipes); the first ECHO_LINES lines of it are also shown on the console, where a TRL user
# debugging a reward function looks, then one line says where the rest is. Tracebacks are left
# out: the first failure of each kind is printed with its own (VerifierRunner._report).
ECHO_LINES = 20
_echoed: dict[str, list[int]] = {}  # log path -> [bytes read, lines shown]: one count for the runners sharing it


def echo_output(log_path: str) -> None:
    if log_path == os.devnull or _echoed.get(log_path, [0, 0])[1] > ECHO_LINES:
        return
    done = _echoed.setdefault(log_path, [0, 0])
    try:
        with open(log_path, "rb") as f:
            f.seek(done[0])
            text = f.read(1 << 16)
    except OSError:
        return
    text = text[: text.rfind(b"\n") + 1]  # whole lines only; the rest is read next time
    done[0] += len(text)
    in_traceback = False
    for line in text.decode("utf-8", "replace").splitlines():
        if line.startswith("Traceback (most recent call last)"):
            in_traceback = True
        elif in_traceback:
            in_traceback = line[:1].isspace()  # its frames are indented; the exception's own line ends it
        elif line.strip() and done[1] <= ECHO_LINES:
            done[1] += 1
            say(f"reward function output: {line}" if done[1] <= ECHO_LINES else
                f"(more reward function output in {log_path}; the console showed its first {ECHO_LINES} lines)")


def default_workers(n: int) -> int:
    """task.verifier_workers: 0 = the number of CPU cores, at most 8 (task_section.py says why)."""
    return n or min(8, os.cpu_count() or 1)


class VerifierRunner:
    """Scores a batch through worker processes (the one worker pool, workers.py), each call with a deadline."""

    # Importing a verifier's module can take seconds (reasoning-gym ~1 s, math-verify ~0.5 s, more
    # on a loaded machine); that is start-up, not the verifier hanging. Each worker gets it once.
    IMPORT_GRACE_S = 20.0

    def __init__(self, fn_path: str, timeout_s: float, *, workers: int = 1, key: str = "task.verifier",
                 memory_mb: int = 0, log_path: str | Path | None = None, import_paths: tuple = (), max_steps: int = 0):
        """``key``: the config key that named it (error messages). ``log_path``: where the workers'
        stdout/stderr go (default: nowhere). ``import_paths``: folders put first on the workers'
        sys.path (the run folder and the current directory, from build.py)."""
        self.fn_path, self.timeout_s, self.max_steps = fn_path, timeout_s, max_steps
        self.name = fn_path.rpartition(":")[2] or fn_path
        paths, refused = safe_import_paths([*map(str, import_paths), *(p for p in sys.path if p)])
        for path, why in refused.items():
            say_once(f"verifier workers will not import from {path}: {why}, so a sandboxed program could plant a "
                     "module there (sitecustomize.py, pickle.py)")
        self.pool = WorkerPool("rlpost.rewards.worker", fn_path, timeout_s, what="verifier process", key=key,
                               workers=workers, memory_mb=memory_mb,
                               log_path=log_path, import_paths=tuple(paths), grace_s=self.IMPORT_GRACE_S)
        self.log_path = self.pool.log_path
        self.style = self.pool.hello  # the calling convention the first worker found (worker.py)
        self.reported: set[str] = set()  # kinds of failure already printed (each once)

    # --- the role ------------------------------------------------------------------------------

    def score(self, batch: Rollouts) -> tuple[torch.Tensor, list[dict], dict]:
        """Rewards (B,) float32 (NaN where a TRL function returned None), infos, and metrics."""
        t0 = time.perf_counter()
        n = len(batch.completions)
        if self.style == "trl":
            outcomes = self._score_batch(batch)
        else:
            requests = [{"kind": "one", "completion": c, "row": r} for c, r in zip(batch.completions, batch.rows)]
            outcomes = self.pool.run(requests)
        rewards, infos, errors, timeouts = [], [], 0, 0
        for outcome in outcomes:
            reward, info, status = self._result(outcome)
            rewards.append(reward)
            infos.append(info)
            errors += status == "error"
            timeouts += status == "timeout"
        metrics = {
            "verifier/errors": errors, "verifier/timeouts": timeouts,
            f"verifier/{self.name}/errors": errors, f"verifier/{self.name}/timeouts": timeouts,
            f"verifier/{self.name}/calls": n,
            "timing_s/verifier_per_call": (time.perf_counter() - t0) / max(1, n),
            **(extra_metrics(infos, numbers=self.style == "verl") if self.style != "trl" else {}),
        }
        echo_output(self.log_path)
        return torch.tensor(rewards, dtype=torch.float32), infos, metrics

    def _score_batch(self, batch: Rollouts) -> list[tuple]:
        """TRL: one call with the whole batch; its per-completion results as outcomes."""
        ids = getattr(batch, "completion_ids", None)
        mask = getattr(batch, "completion_mask", None)
        request = {"kind": "batch", "completions": list(batch.completions), "rows": list(batch.rows),
                   "completion_ids": [r[m].tolist() for r, m in zip(ids, mask)] if ids is not None else None,
                   "trainer_state": w.TrainerState(getattr(batch, "policy_version", 0), self.max_steps)}
        (outcome,) = self.pool.run([request], self.timeout_s * max(1, len(batch.completions)))
        if outcome[0] != "ok":
            return [outcome] * len(batch.completions)
        return [("ok", v, {}) if not isinstance(v, tuple) else (*v, "") for v in outcome[1]]

    def _result(self, outcome: tuple) -> tuple[float, dict, str]:
        if outcome[0] == "timeout":
            self._report("timeout", f"timed out after {self.timeout_s:g} s (task.verifier_timeout_s); the call "
                         "was killed and scored 0")
            return 0.0, {"timeout": True}, "timeout"
        if outcome[0] == "died":
            self._report("error", outcome[1])
            return 0.0, {"error": outcome[1]}, "error"
        if outcome[0] == "error":
            self._report("error", f"raised {outcome[1]}\n{outcome[2].rstrip()}" if outcome[2] else outcome[1])
            return 0.0, {"error": outcome[1]}, "error"
        reward = float("nan") if outcome[1] == w.NOT_APPLICABLE else outcome[1]
        return reward, outcome[2], "ok"

    def _report(self, kind: str, text: str) -> None:
        """The first failure of each kind, printed once; the rest are counted."""
        if kind not in self.reported:
            self.reported.add(kind)
            say(f"reward function {self.fn_path} failed (the first {kind}; later ones are only counted, "
                f"in verifier/{self.name}/{kind}s): {text}")

    def pids(self) -> list[int]:
        return self.pool.pids()

    def close(self) -> None:
        self.pool.close()
