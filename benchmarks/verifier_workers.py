"""Completions scored per second on the code task with 1, 2, ... verifier workers (task.verifier_workers).

    .venv/bin/python benchmarks/verifier_workers.py [--workers 1,2] [--rounds 3] [--batch 64] [--backend bwrap]

One batch is what a code step scores: ``--batch`` completions (K x B) over the built-in code
task's training rows, a third each of correct programs, wrong ones (off by one) and programs that
raise, fenced as a model writes them. Each worker count scores the same batch through the real
``VerifierRunner`` (worker processes, each running ``envs/code.py: score``, which runs every
hidden test in the sandbox); the counts alternate every round so drift on a shared machine hits
all of them, and the medians over rounds are reported. Workers are started (and their module
imported) before the clock starts, as in a run, where they live for the whole run.

Writes results/verifier_workers.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

from rlpost import config
from rlpost.envs import build_task
from rlpost.rewards.runner import VerifierRunner

HERE = Path(__file__).resolve().parent


class Batch:  # the runner reads these two fields of a Rollouts
    def __init__(self, completions, rows):
        self.completions, self.rows = completions, rows


def make_batch(n: int, backend: str) -> Batch:
    task = build_task(config.load(None, ["task.name=code", "task.n_train=64", "task.n_heldout=2",
                                         f"task.sandbox={backend}", "task.sandbox_allow_root=true"]).task)
    completions, rows = [], []
    for i in range(n):
        row = task.train[i % len(task.train)]
        program = row["answer"]
        if i % 3 == 1:  # wrong: every return value off by one
            program = program.replace("return ", "return 1 + ", 1)
        elif i % 3 == 2:  # raises
            program = program.replace("return ", "raise ValueError('no'); return ", 1)
        completions.append(f"Here it is:\n```python\n{program}```")
        rows.append(row)
    return Batch(completions, rows)


def rate(workers: int, batch: Batch) -> tuple[float, list[float]]:
    runner = VerifierRunner("rlpost.envs.code:score", timeout_s=60, workers=workers)
    try:
        runner.score(Batch(batch.completions[:workers], batch.rows[:workers]))  # start every worker first
        t = time.perf_counter()
        rewards, _, metrics = runner.score(batch)
        elapsed = time.perf_counter() - t
    finally:
        runner.close()
    assert metrics["verifier/errors"] == 0 and metrics["verifier/timeouts"] == 0, metrics
    return len(batch.completions) / elapsed, rewards.tolist()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default="1,2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--backend", default="bwrap", choices=["bwrap", "rlimits"])
    args = p.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    batch = make_batch(args.batch, args.backend)
    rates: dict[int, list[float]] = {w: [] for w in counts}
    reference = None
    for r in range(args.rounds):
        for w in counts if r % 2 == 0 else counts[::-1]:
            value, rewards = rate(w, batch)
            reference = reference or rewards
            assert rewards == reference, "the scores depend on the worker count"
            rates[w].append(value)
            print(f"round {r + 1}: {w} worker(s): {value:.1f} completions/s", flush=True)
    med = {w: statistics.median(v) for w, v in rates.items()}
    result = {"backend": args.backend, "batch": args.batch, "rounds": args.rounds, "cpus": os.cpu_count(),
              "machine": platform.processor() or platform.machine(), "completions_per_s": med, "all": rates,
              "reward_mean": sum(reference) / len(reference)}
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "verifier_workers.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["| task.verifier_workers | completions scored / s | x vs 1 worker |", "|---|---|---|"]
    lines += [f"| {w} | {med[w]:.1f} | {med[w] / med[counts[0]]:.2f} |" for w in counts]
    (out / "verifier_workers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
