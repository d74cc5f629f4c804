"""The rollout inside a training run, decode step by decode step: how long each `generate` of
vs_trl.py's configuration takes in the loop (8 prompts x 4, <= 64 new tokens, micro-batch 8), split
into prefill, the decode steps' layers (median ms by live rows) and the rest.

    .venv/bin/python benchmarks/gen_in_loop.py                                      # rlpost's OpenMP default
    OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=300000 .venv/bin/python benchmarks/gen_in_loop.py   # libgomp's spin
    .venv/bin/python benchmarks/gen_in_loop.py rollout.temperature=1.0             # extra overrides

Runs `rlpost train` for 4 steps in this process (2 `generate` calls for the held-out evaluation at
start and end, 4 for training) and prints one line per call, then the run's own timing_s/gen.
Used to find why the loop's generation was slower than the same rollout timed alone (README:
`contention.py`, the wait policy). Prints only; nothing is written.
"""

import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from rlpost import cli  # sets rlpost's OpenMP wait policy unless the environment has one
from rlpost.roles.rollout_fast import FastRollout

steps, decode_s = [], []
_layers, _decode, _generate = FastRollout._layers, FastRollout._decode, FastRollout.generate


def layers(self, x, *args):
    t = time.perf_counter()
    out = _layers(self, x, *args)
    steps.append((x.shape[0], x.shape[1], time.perf_counter() - t))  # (rows, positions, s)
    return out


def decode(self, *args):
    t = time.perf_counter()
    out = _decode(self, *args)
    decode_s.append(time.perf_counter() - t)
    return out


def generate(self, *args, **kwargs):
    steps.clear()
    decode_s.clear()
    t = time.perf_counter()
    out = _generate(self, *args, **kwargs)
    total = time.perf_counter() - t
    d = [s for s in steps if s[1] == 1]  # decode steps: one position per row
    by_rows = ", ".join(f"{r}:{1e3 * statistics.median(s[2] for s in d if s[0] == r):.0f}"
                        for r in sorted({s[0] for s in d}))
    print(f"generate {total:.2f} s: prefill {sum(s[2] for s in steps if s[1] > 1):.2f}, decode layers "
          f"{sum(s[2] for s in d):.2f} over {len(d)} steps (mean rows {statistics.mean(s[0] for s in d):.1f}), rest "
          f"{total - sum(s[2] for s in steps):.2f}; {int(out.completion_mask.sum())} tokens; ms per step by rows: "
          f"{by_rows}",
          flush=True)
    return out


def main() -> None:
    FastRollout._layers, FastRollout._decode, FastRollout.generate = layers, decode, generate
    out = tempfile.mkdtemp()
    print(f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')} GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}",
          flush=True)
    try:
        cli.main(["train", "rollout.prompts_per_step=8", "rollout.group_size=4", "rollout.max_new_tokens=64",
                  "rollout.temperature=0.7", "trainer.lr=1e-5", "run.steps=4", "run.seed=0", "run.eval_every=0",
                  "run.checkpoint_every=0", "task.n_heldout=16", "run.progress=false", f"run.out_dir={out}",
                  "run.name=run", "trainer.micro_batch_size=8", *sys.argv[1:]])
        for line in open(f"{out}/run/metrics.jsonl"):
            m = json.loads(line)
            if "timing_s/gen" in m:
                print(f"step {m['step']}: timing_s/gen {m['timing_s/gen']:.2f}, update {m['timing_s/update']:.2f}")
    finally:
        shutil.rmtree(out)


if __name__ == "__main__":
    main()
