"""Helpers shared by several test files (test files never import each other)."""

from __future__ import annotations

import contextlib
import io
import os
import random
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch

from rlpost import config
from rlpost.config import TrainerConfig
from rlpost.types.batch import Rollouts

ROOT = Path(__file__).resolve().parents[1]

# A tiny-model run: 2 steps of 4 prompts x 4 samples, float32 throughout, one thread.
TINY = [
    "model.name=tiny", "rollout.dtype=float32", "rollout.max_new_tokens=6", "rollout.prompts_per_step=4",
    "rollout.group_size=4", "task.n_train=64", "task.n_heldout=8", "run.steps=2", "run.progress=false",
    "run.checkpoint_every=0", "trainer.lr=1e-3", "trainer.precision=fp32", "run.threads=1",
    "run.passk_eval=0",  # the pass@k curve's 64 samples a problem: tests/recipes/test_passk.py turns it on
]

# The same for sft, rm and dpo on fixed rows, which sample nothing and count pref.epochs, not run.steps (they refuse
# the keys they would ignore), and for rsft and online DPO, which sample but count pref.online_rounds.
TINY_ROWS = [o for o in TINY if not o.startswith(("rollout.", "run.steps", "run.passk_eval"))]
TINY_DATA = [o for o in TINY_ROWS if not o.startswith("task.")]  # beside pref.data: the task builds no rows
TINY_ROUNDS = [o for o in TINY if not o.startswith(("run.steps", "run.passk_eval"))]

# The same for `rlpost eval tiny`: no model.name (the target names it), no trainer keys (eval trains nothing,
# so it refuses them).
TINY_EVAL = [o for o in TINY if not o.startswith(("model.name", "trainer."))]


def tiny_cfg(*overrides: str) -> config.Config:
    return config.load(None, [*TINY, *overrides])


def algorithm(cfg: config.Config):
    """The algorithm cfg.algo.name names, built from its section as build.py builds it."""
    from rlpost.algorithms import ALGORITHMS

    return ALGORITHMS[cfg.algo.name].from_config(cfg.algo, cfg.rollout.group_size, cfg.rollout.max_new_tokens)


def objective(cfg: config.Config):
    """The loop's algorithm role for cfg (the algorithm with its knobs), checked first, as build.build_roles makes
    it."""
    from rlpost import algorithms, build

    build.check_algorithm(cfg, refuse_ignored=False)  # tests set every algorithm's knobs at once
    return algorithms.build(cfg.algo, cfg.rollout.group_size, cfg.rollout.max_new_tokens,
                            stale_samples=cfg.dist.topology == "async")


def tcfg(**kw) -> TrainerConfig:
    """Trainer config for exact-arithmetic tests: float32, no autocast."""
    return replace(TrainerConfig(precision="fp32", lr=1e-3), **kw)


def run_cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the real `rlpost` entry point in a subprocess."""
    full_env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), *sys.path])}
    return subprocess.run([sys.executable, "-m", "rlpost.cli", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=ROOT)


def cli(*args: str) -> subprocess.CompletedProcess:
    """`rlpost ARGS` in this process, through ``rlpost.cli.main``: the CLI's own path (parsing,
    config checks, exit status, what it prints) without ~10 s of Python and torch start-up per call.
    Use ``run_cli`` where the separate process is the point (the real entry point, a crash)."""
    from rlpost.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse: --help, a usage error
            code = e.code if isinstance(e.code, int) else 2
    return subprocess.CompletedProcess(["rlpost", *args], code, out.getvalue(), err.getvalue())


# The real CLI, with the loop's on_step_end hook set to SIGKILL the process after a given step: a
# crash at the worst moment (right after a step's metrics and checkpoint are written).
_KILLED_AFTER = """
import os, signal, sys
from rlpost.cli import main
from rlpost.recipes import rl
train, step = rl.train, int(sys.argv[1])
die = lambda s: os.kill(os.getpid(), signal.SIGKILL) if s == step else None
rl.train = lambda *a, **k: train(*a, **k, on_step_end=die)
sys.exit(main(sys.argv[2:]))
"""


def run_cli_killed_after(step: int, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`rlpost ARGS` in a subprocess that SIGKILLs itself after training step `step`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), *sys.path])}
    return subprocess.run([sys.executable, "-c", _KILLED_AFTER, str(step), *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)


def at_call(n: int, real, act):
    """``real`` (to monkeypatch in) calling ``act()`` first at its n-th call: a crash (``power_cut``) or a signal at
    a chosen call (a round's sampling, its held-out measure)."""
    calls = []

    def wrapper(*a, **kw):
        calls.append(1)
        if len(calls) == n:
            act()
        return real(*a, **kw)

    return wrapper


def at_train_step(n: int, act):
    """A Trainer.train_step (to monkeypatch in) that calls ``act()`` at its n-th call, before that step: a crash
    (``power_cut``) or a signal at a chosen step of an offline run."""
    from rlpost.roles.trainer import Trainer

    return at_call(n, Trainer.train_step, act)


def power_cut() -> None:
    raise RuntimeError("power cut")


def digit_rows(n: int, seed: int) -> list[dict]:
    """Rows whose prompt is one digit; the toy verifier first_char_digit wants it copied back."""
    rng = random.Random(seed)
    return [{"messages": [{"role": "user", "content": str(d)}], "answer": str(d)}
            for d in (rng.randint(0, 9) for _ in range(n))]


def rl_batch(mask, **fields) -> Rollouts:
    """A batch around a completion mask (B, T) for the maths tests: one prompt token, token ids 0,
    sampler log-probs 0 unless given, each row its own group, any other field by keyword."""
    B, T = mask.shape
    base = dict(prompt_ids=torch.zeros(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1, dtype=torch.bool),
                completion_ids=torch.zeros(B, T, dtype=torch.long), completion_mask=mask,
                sampler_logp=torch.zeros(B, T), truncated=torch.zeros(B, dtype=torch.bool),
                group_ids=torch.arange(B), rows=[{}] * B, completions=[""] * B)
    return Rollouts(**{**base, **fields})


def loss_batch(logp_old, adv, mask, ref=None) -> Rollouts:
    """A batch for a loss's hand-worked numbers: old log-probs (= the sampler's), advantages and a
    mask (B, T), optional reference log-probs; one token of prompt."""
    B, T = mask.shape
    return Rollouts(
        prompt_ids=torch.zeros(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1, dtype=torch.bool),
        completion_ids=torch.zeros(B, T, dtype=torch.long), completion_mask=mask, sampler_logp=logp_old,
        truncated=torch.zeros(B, dtype=torch.bool), group_ids=torch.arange(B), rows=[{}] * B,
        completions=[""] * B, old_logp=logp_old, advantages=adv, ref_logp=ref,
    )


@contextmanager
def tmpfs(path: Path, size: str = "1m"):
    """A small tmpfs mounted at `path` (a disk that fills up), unmounted afterwards; the test is
    skipped, with the reason, where mounting is not allowed (not root, no CAP_SYS_ADMIN)."""
    import pytest

    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a disk that fills up) needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                       text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount_read_only(path: Path) -> None:
    """Make a tmpfs from `tmpfs` read-only (root ignores file modes, so this is how a read-only
    run folder is made)."""
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True, capture_output=True)


def make_batch(tiny, n_prompts=4, k=4, seed=0) -> Rollouts:
    """n_prompts x k completions (up to 7 tokens) sampled from the tiny model, float32, random rewards."""
    import copy

    from rlpost.roles.rollout_hf import HFRollout

    ro = HFRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    torch.manual_seed(seed)
    rows = [{"messages": [{"role": "user", "content": f"{i}+{2 * i}="}]} for i in range(n_prompts)]
    b = ro.generate(rows, n=k, temperature=1.0, top_p=1.0, max_new_tokens=7)
    b.reward = torch.rand(len(b))
    return b


def verifier_workers() -> list[int]:
    """Worker processes of the pool (workers.py: verifiers, environments, toys) whose parent is this process: none
    may be left once a command or a test ends. conftest.py asks twice per test, so this reads each
    /proc/PID/stat with one os.read (a third of pathlib's cost: ~2 ms a call here, ~90 processes)."""
    me, found = os.getpid(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
            try:
                stat = os.read(fd, 4096)
            finally:
                os.close(fd)
            if int(stat.rpartition(b")")[2].split()[1]) != me:  # field 4, after the parenthesised name
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
                if b" import serve; serve()" in cmdline:  # the pool's command (workers.py: MAIN)
                    found.append(int(pid))
        except (OSError, ValueError, IndexError):
            continue
    return sorted(found)
