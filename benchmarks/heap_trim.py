"""Trim the heap before every update, or keep freed pages resident: same batches, one process.

    .venv/bin/python benchmarks/heap_trim.py [--steps 9]

The vs_trl configuration (embedded model, 8 prompts x 4 completions, at most 64 new tokens,
micro-batch 8). Each step samples one batch, then updates on it twice, once right after
``malloc_trim(0)`` ("trim": the pages the last update freed are handed back and must be faulted
in again) and once without ("warm"), the order alternating by step. Reports update milliseconds
per completion token, the system time and minor page faults of each, and the median warm/trim
ratio over steps 2.. (step 1 warms up). ``heap.TRIM_EVERY`` picks between the two in a run.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch

from rlpost import build, config
from rlpost.envs import build_task
from rlpost.model import heap
from rlpost.recipes.sampling_stage import SamplingStage

OVERRIDES = ["rollout.prompts_per_step=8", "rollout.group_size=4", "rollout.max_new_tokens=64",
             "rollout.temperature=0.7", "trainer.lr=1e-5", "trainer.micro_batch_size=8", "task.n_heldout=16"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=9)
    args = ap.parse_args()
    heap.TRIM_EVERY = 10**9  # the benchmark decides when to trim
    cfg = config.load(None, OVERRIDES)
    task = build_task(cfg.task)
    roles = build.build_roles(cfg, task)
    stage = SamplingStage.from_config(cfg, task, roles.algo.traits)
    torch.manual_seed(0)
    loss_fn = roles.algo.loss
    per_token: dict[str, list[float]] = {"trim": [], "warm": []}
    for step in range(args.steps):
        batch, _ = stage.collect(roles, {})
        roles.rollout.sleep(discard_weights=True)
        batch.advantages = roles.algo.advantages(batch).tokens
        for mode in (["trim", "warm"] if step % 2 == 0 else ["warm", "trim"]):
            batch.old_logp = None
            if mode == "trim":
                heap.trim()
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            roles.trainer.update(batch, loss_fn)
            dt, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
            if step:
                per_token[mode].append(1000 * dt / float(batch.completion_mask.sum()))
            print(f"step {step + 1} {mode}: update {dt:.2f} s, system {r1.ru_stime - r0.ru_stime:.2f} s, "
                  f"minor faults {r1.ru_minflt - r0.ru_minflt}", flush=True)
        roles.rollout.load_weights(roles.trainer.weights(), version=step)
    m = statistics.median
    ratio = m(w / t for w, t in zip(per_token["warm"], per_token["trim"]))
    print(f"update ms per token: trim {m(per_token['trim']):.2f}, warm {m(per_token['warm']):.2f}; "
          f"median warm/trim {ratio:.3f}")


if __name__ == "__main__":
    main()
