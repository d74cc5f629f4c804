"""The demo step alone and beside one busy process, rlpost and TRL, in one invocation.

    .venv/bin/python benchmarks/contention.py                 # 7 rows x (alone, busy) x 3 steps, ~1 h on AVX2
    .venv/bin/python benchmarks/contention.py --steps 2 --rows rlpost,trl

Each measurement is one child of vs_trl.py (the speed benchmark's own children, so the two
benchmarks time the same code) on the demo's shape: 16 prompts x 8 completions, at most 16 new
tokens; the median step over steps 2..N (step 1 warms up). "Busy" runs ``stress-ng --cpu 1``
(Debian's stress-ng: one process spinning on one core) from before the child starts until it
ends. Within a row the order of alone and busy alternates with the row, so drift on a shared
machine hits both.

Why this can cost far more than the fair 2x: a torch op on 2 threads ends at a barrier, and
with GNU OpenMP's default wait (spin ~300k iterations, then sleep) the thread that finished first
spins on a core while the other one waits to be scheduled, possibly on that very core. Rows:

* ``rlpost``: as shipped since 2026-11-26: GNU OpenMP's default wait, and torch's thread count
  follows the other processes' work on the cores (``run.threads=0``, model/cores.py): beside one
  busy process on 2 cores it computes on 1 thread, so none of its threads spins against it;
* ``rlpost_fixed``: the same spin on every core, whatever else runs (``run.threads=<cores>``):
  what the thread count saves;
* ``rlpost_spin1k``: the default from 2026-11-24 22:00 until 2026-11-26, on every core: spin ~10 us,
  then sleep (``OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=1000``);
* ``rlpost_passive``: sleep at once (``OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=0``), every core
  (the default until 2026-11-24 22:00);
* ``rlpost_1thread``: ``run.threads=1``, one core idle when alone;
* ``trl``: TRL's GRPOTrainer as its users run it (GNU OpenMP's default);
* ``trl_passive``: TRL with ``OMP_WAIT_POLICY=PASSIVE`` in its environment.

Results before 2026-11-26 named the rows by the default then (``rlpost`` was PASSIVE with a
~10 us spin, or PASSIVE alone; ``rlpost_spin`` was today's wait on every core).

Writes benchmarks/results/contention-<isa>.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

import machine  # benchmarks/machine.py: where the figures came from
import vs_trl

DEMO = (16, 8, 16)  # prompts, group, max new tokens: the demo's step
ALL = f"run.threads={os.cpu_count()}"  # every core whatever else runs: the thread count held still
ROWS = {  # name: (child kind, extra environment, extra rlpost overrides)
    "rlpost": ("rlpost", {}, ()),
    "rlpost_fixed": ("rlpost", {}, (ALL,)),
    "rlpost_spin1k": ("rlpost", {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "1000"}, (ALL,)),
    "rlpost_passive": ("rlpost", {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"}, (ALL,)),
    "rlpost_1thread": ("rlpost", {}, ("run.threads=1",)),
    "trl": ("trl", {}, ()),
    "trl_passive": ("trl", {"OMP_WAIT_POLICY": "PASSIVE"}, ()),
}

def measure(row: str, busy: bool, steps: int, seed: int) -> dict:
    kind, env, overrides = ROWS[row]
    stress = subprocess.Popen(["stress-ng", "--cpu", "1", "--quiet"]) if busy else None
    try:
        time.sleep(1.0 if busy else 0.0)  # let the stressor reach its core
        result = vs_trl.spawn(kind, steps, seed, DEMO, env, overrides)
    finally:
        if stress is not None:
            stress.terminate()
            stress.wait()
    steps_ = result["steps"][1:] or result["steps"]  # step 1 warms up
    med = lambda k: statistics.median(s[k] for s in steps_)
    return {"step_s": med("step_s"), "gen_s": med("gen_s"), "update_s": med("update_s"),
            "peak_rss_gb": result["peak_rss_gb"], "steps": result["steps"]}


def report(results: dict, steps: int) -> str:
    lines = [f"Demo step (16 prompts x 8, <= 16 new tokens), median of steps 2..{steps}; busy = `stress-ng --cpu 1` "
             "beside it. Target: busy / alone <= 2.5.", "",
             "| row | alone: step (gen + update) s | busy: step (gen + update) s | busy / alone |", "|---|---|---|---|"]
    for row, r in results.items():
        a, b = r["alone"], r["busy"]
        lines.append(f"| {row} | {a['step_s']:.1f} ({a['gen_s']:.1f} + {a['update_s']:.1f}) | "
                     f"{b['step_s']:.1f} ({b['gen_s']:.1f} + {b['update_s']:.1f}) | "
                     f"**{b['step_s'] / a['step_s']:.2f}** |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", default=",".join(ROWS),
                    help=f"comma-separated, from {', '.join(ROWS)}")
    args = ap.parse_args()
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if set(rows) - set(ROWS):
        raise SystemExit(f"--rows: unknown {sorted(set(rows) - set(ROWS))}; expected some of {', '.join(ROWS)}")
    if any(ROWS[r][0] == "trl" for r in rows):
        vs_trl.ensure_trl()
    header, results = machine.Header(), {}
    for i, row in enumerate(rows):
        results[row] = {}
        for busy in ((False, True) if i % 2 == 0 else (True, False)):
            print(f"{row} {'busy' if busy else 'alone'} ...", flush=True)
            results[row]["busy" if busy else "alone"] = measure(row, busy, args.steps, args.seed)
    text = report(results, args.steps)
    print(text)
    machine.write_results("contention", results, header, text)


if __name__ == "__main__":
    main()
