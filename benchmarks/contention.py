"""The demo step alone and beside one busy process, rlpost and TRL, in one invocation.

    .venv/bin/python benchmarks/contention.py                 # 6 rows x (alone, busy) x 3 steps, ~1 h on AVX2
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

* ``rlpost``: as shipped, OpenMP waits spin ~10 us, then sleep (``OMP_WAIT_POLICY=PASSIVE`` with
  ``GOMP_SPINCOUNT=1000``, set by ``rlpost/__init__.py`` before torch loads; until 2026-11-24 it
  was PASSIVE alone, the ``rlpost_passive`` row);
* ``rlpost_passive``: waits sleep at once (``GOMP_SPINCOUNT=0``);
* ``rlpost_spin``: rlpost as before that (``GOMP_SPINCOUNT=300000``: libgomp's spin when
  ``OMP_WAIT_POLICY`` is unset, ~3 ms by its own estimate of 100k spins per ms);
* ``rlpost_shortspin``: a middle way, spin ~0.1 ms then sleep (``GOMP_SPINCOUNT=10000``), in case
  sleeping costs a quiet machine wake-ups between the decode loop's many small ops;
* ``rlpost_spin1k``: ~10 us (``GOMP_SPINCOUNT=1000``, by libgomp's estimate of 100k spins per ms):
  the shipped setting, spelled out;
* ``rlpost_1thread``: ``run.threads=1``, the thread-count way out (one core idle when alone);
* ``trl``: TRL's GRPOTrainer as its users run it (libgomp's default; it imports torch first);
* ``trl_passive``: TRL with ``OMP_WAIT_POLICY=PASSIVE`` in its environment.

Writes benchmarks/results/contention-<isa>.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import machine  # benchmarks/machine.py: where the figures came from
import vs_trl

DEMO = (16, 8, 16)  # prompts, group, max new tokens: the demo's step
ROWS = {  # name: (child kind, extra environment, extra rlpost overrides)
    "rlpost": ("rlpost", {}, ()),
    "rlpost_passive": ("rlpost", {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"}, ()),
    "rlpost_spin": ("rlpost", {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "300000"}, ()),
    "rlpost_shortspin": ("rlpost", {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000"}, ()),
    "rlpost_spin1k": ("rlpost", {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "1000"}, ()),
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
                     f"{b['step_s']:.1f} ({b['gen_s']:.1f} + {b['update_s']:.1f}) | **{b['step_s'] / a['step_s']:.2f}** |")
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
